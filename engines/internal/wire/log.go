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
// line, at level Info with the attributes worker_id and stream. A line that
// starts with a level mark, "\x1eL<levelno> <logger>\x1f" (what the Python
// runner writes for a logging record, levelno being Python's), is logged at
// that level (DEBUG, INFO, WARNING, ERROR and above) with the attribute
// logger, the mark removed. exec.Cmd
// writes to it from one goroutine; Tail may be called from others.
type LineLogger struct {
	// log and workerID may change once (Rebind), from another goroutine
	// than the one writing: read under mu.
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

// Rebind sends the lines from now on to log, as workerID's: a process
// started before it was a worker's (a spare runner) gets its worker.
func (l *LineLogger) Rebind(log *slog.Logger, workerID string) {
	l.mu.Lock()
	l.log, l.workerID = log, workerID
	l.mu.Unlock()
}

func (l *LineLogger) emit(line []byte) {
	line = bytes.TrimRight(line, "\r")
	level, logger, line := splitLevelMark(line, l.level)
	s := string(line)
	l.mu.Lock()
	log, workerID := l.log, l.workerID
	l.mu.Unlock()
	if logger != "" && logger != "root" {
		log.LogAttrs(context.Background(), level, s,
			slog.String("worker_id", workerID), slog.String("stream", l.stream), slog.String("logger", logger))
	} else {
		log.LogAttrs(context.Background(), level, s,
			slog.String("worker_id", workerID), slog.String("stream", l.stream))
	}
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

// LevelMark starts a line whose level is given (see LineLogger).
const LevelMark = "\x1eL"

// splitLevelMark returns the level, the logger name and the text of a line
// that starts with a level mark, else def, "" and the line.
func splitLevelMark(line []byte, def slog.Level) (slog.Level, string, []byte) {
	rest, ok := bytes.CutPrefix(line, []byte(LevelMark))
	if !ok {
		return def, "", line
	}
	num, rest, ok := bytes.Cut(rest, []byte(" "))
	if !ok || len(num) == 0 || len(num) > 3 {
		return def, "", line
	}
	n := 0
	for _, c := range num {
		if c < '0' || c > '9' {
			return def, "", line
		}
		n = n*10 + int(c-'0')
	}
	name, text, ok := bytes.Cut(rest, []byte("\x1f"))
	if !ok {
		return def, "", line
	}
	return PythonLevel(n), string(name), text
}

// PythonLevel is the slog level of a Python logging level number.
func PythonLevel(n int) slog.Level {
	switch {
	case n <= 10:
		return slog.LevelDebug
	case n <= 20:
		return slog.LevelInfo
	case n <= 30:
		return slog.LevelWarn
	default:
		return slog.LevelError
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
