package wire

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

// LineLogger forwards a worker's stdout or stderr to slog, one record per
// line, at level Info with the attributes worker_id and stream. exec.Cmd
// writes to it from one goroutine; Tail may be called from others.
type LineLogger struct {
	log      *slog.Logger
	level    slog.Level
	stream   string
	workerID string
	keepTail bool

	buf []byte

	mu   sync.Mutex
	last []string
}

// NewLineLogger returns a LineLogger for one stream of workerID's process;
// keepTail keeps its last lines for Tail.
func NewLineLogger(log *slog.Logger, stream, workerID string, keepTail bool) *LineLogger {
	return &LineLogger{log: log, level: slog.LevelInfo, stream: stream, workerID: workerID, keepTail: keepTail}
}

func (l *LineLogger) Write(p []byte) (int, error) {
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

// Flush logs an unterminated last line.
func (l *LineLogger) Flush() {
	if len(l.buf) > 0 {
		l.emit(l.buf)
		l.buf = l.buf[:0]
	}
}

func (l *LineLogger) emit(line []byte) {
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

// Tail returns the last stderr lines, formatted to end an error message.
func (l *LineLogger) Tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.last) == 0 {
		return ""
	}
	return "; stderr: " + strings.Join(l.last, " | ")
}
