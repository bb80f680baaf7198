package python

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
)

const (
	maxLogLine = 16 << 10 // longer lines are logged in pieces
	tailLines  = 5        // stderr lines kept for error messages
	tailWidth  = 300
)

// lineLogger forwards a worker's stdout or stderr to slog, one record per
// line. exec.Cmd writes to it from one goroutine; tail may be called from
// others.
type lineLogger struct {
	log      *slog.Logger
	level    slog.Level
	stream   string
	workerID string
	keepTail bool

	buf []byte

	mu   sync.Mutex
	last []string
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	rest := l.buf
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		l.emit(rest[:i])
		rest = rest[i+1:]
	}
	for len(rest) >= maxLogLine {
		l.emit(rest[:maxLogLine])
		rest = rest[maxLogLine:]
	}
	l.buf = append(l.buf[:0], rest...)
	return len(p), nil
}

// flush logs an unterminated last line.
func (l *lineLogger) flush() {
	if len(l.buf) > 0 {
		l.emit(l.buf)
		l.buf = l.buf[:0]
	}
}

func (l *lineLogger) emit(line []byte) {
	line = bytes.TrimRight(line, "\r")
	s := string(line)
	l.log.LogAttrs(context.Background(), l.level, s,
		slog.String("worker_id", l.workerID), slog.String("stream", l.stream))
	if l.keepTail && len(bytes.TrimSpace(line)) > 0 {
		if len(s) > tailWidth {
			s = s[:tailWidth] + "..."
		}
		l.mu.Lock()
		if len(l.last) == tailLines {
			copy(l.last, l.last[1:])
			l.last = l.last[:tailLines-1]
		}
		l.last = append(l.last, s)
		l.mu.Unlock()
	}
}

// tail returns the last stderr lines, formatted to end an error message.
func (l *lineLogger) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) == 0 {
		return ""
	}
	return "; stderr: " + strings.Join(l.last, " | ")
}
