package logbudget_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/logbudget"
	"github.com/virtufin/workmanager/internal/testsink"
)

// A flood is cut to the budget; the drops are counted and announced once
// logging is allowed again.
func TestFloodIsCutAndCounted(t *testing.T) {
	defer logbudget.SetFlushAfter(time.Hour)() // no notice on its own here
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
	defer logbudget.SetFlushAfter(time.Hour)() // no notice on its own here
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

// A worker that floods and then goes quiet still has its drops announced,
// once, a moment later (TestSandboxOnTheRealStack waited for a notice that
// came only if the flooding worker logged again).
func TestDropsAreAnnouncedWhenTheWorkerGoesQuiet(t *testing.T) {
	defer logbudget.SetFlushAfter(20 * time.Millisecond)()
	var buf testsink.Buffer
	b := logbudget.New(10)
	now := time.Unix(1000, 0)
	b.SetClock(func() time.Time { return now })
	log := slog.New(b.Handler(slog.NewTextHandler(&buf, nil))).With("worker_id", "w")
	for range 25 {
		log.Info("line")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "worker log lines dropped") {
		if time.Now().After(deadline) {
			t.Fatalf("no drop notice without a later record; log:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	out := buf.String()
	if !strings.Contains(out, "dropped=15") || !strings.Contains(out, "worker_id=w") {
		t.Fatalf("notice without its count or the worker's id:\n%s", out)
	}
	// The next record let through does not announce the same drops again.
	now = now.Add(time.Second)
	log.Info("after")
	if n := strings.Count(buf.String(), "worker log lines dropped"); n != 1 {
		t.Fatalf("%d notices, want 1:\n%s", n, buf.String())
	}
}
