package wire

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestLineLoggerLevels: a line with the Python runner's level mark is
// logged at its level with its logger's name and without the mark, once
// with worker_id; a malformed mark, and any other line, at Info as it is.
func TestLineLoggerLevels(t *testing.T) {
	var buf bytes.Buffer
	l := NewLineLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), "stderr", "w-1", true)
	_, _ = l.Write([]byte("\x1eL10 pricer\x1fdebug line\n\x1eL30 root\x1fwarned\n\x1eL50 x\x1fcritical\n" +
		"\x1eLx9 pricer\x1fbad number\n\x1eL20 no separator\nplain print\n"))
	out := buf.String()
	for _, want := range []string{
		`level=DEBUG msg="debug line" worker_id=w-1 stream=stderr logger=pricer`,
		`level=WARN msg=warned worker_id=w-1 stream=stderr` + "\n",
		`level=ERROR msg=critical worker_id=w-1 stream=stderr logger=x`,
		`level=INFO msg="\x1eLx9 pricer\x1fbad number"`,
		`level=INFO msg="\x1eL20 no separator"`,
		`level=INFO msg="plain print" worker_id=w-1 stream=stderr` + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if strings.Count(out, "worker_id=") != 6 {
		t.Errorf("worker_id not once per line:\n%s", out)
	}
	if tail := l.Tail(); strings.Contains(tail, "\x1eL30") || !strings.Contains(tail, "warned | critical") {
		t.Errorf("Tail keeps the marks or lost a line: %q", tail)
	}
}
