package logbudget_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/logbudget"
)

// A flood is cut to the budget; the drops are counted and announced once
// logging is allowed again.
func TestFloodIsCutAndCounted(t *testing.T) {
	var buf bytes.Buffer
	b := logbudget.New(10)
	log := slog.New(b.Handler(slog.NewTextHandler(&buf, nil))).With("worker_id", "w")
	for i := range 1000 {
		log.Info("line", "i", i)
	}
	lines := strings.Count(buf.String(), "msg=line")
	if lines < 10 || lines > 12 || b.Dropped() < 988 {
		t.Fatalf("%d lines passed, %d dropped; want about the burst (10) and the rest dropped", lines, b.Dropped())
	}
	if strings.Contains(buf.String(), "dropped") {
		t.Fatal("notice before logging was allowed again")
	}
	unlimited := logbudget.New(0)
	var all bytes.Buffer
	ul := slog.New(unlimited.Handler(slog.NewTextHandler(&all, nil)))
	for range 1000 {
		ul.Info("x")
	}
	if n := strings.Count(all.String(), "msg=x"); n != 1000 || unlimited.Dropped() != 0 {
		t.Fatalf("unlimited: %d lines, %d dropped", n, unlimited.Dropped())
	}
}

func TestDropsAreAnnouncedWhenLoggingResumes(t *testing.T) {
	var buf bytes.Buffer
	b := logbudget.New(10)
	now := time.Unix(1000, 0)
	b.SetClock(func() time.Time { return now })
	log := slog.New(b.Handler(slog.NewTextHandler(&buf, nil)))
	for range 25 {
		log.Info("line")
	}
	now = now.Add(time.Second)
	log.Info("after")
	out := buf.String()
	if !strings.Contains(out, "worker log lines dropped") || !strings.Contains(out, "dropped=15") ||
		!strings.Contains(out, "setting=WORKER_LOG_LINES_PER_SECOND") || !strings.HasSuffix(strings.TrimSpace(out), "msg=after") {
		t.Fatalf("log:\n%s", out)
	}
}
