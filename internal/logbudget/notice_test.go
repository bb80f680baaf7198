package logbudget_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/logbudget"
	"github.com/virtufin/workmanager/internal/testsink"
)

// With notice attributes (the node's worker_id), a drop notice names the
// worker once, whether the dropped records came through a logger that
// adds worker_id itself (an engine's With) or not (LogAttrs per record).
func TestNoticeAttrsNameTheWorkerOnce(t *testing.T) {
	defer logbudget.SetFlushAfter(20 * time.Millisecond)()
	var buf testsink.Buffer
	b := logbudget.New(1)
	now := time.Unix(1000, 0)
	b.SetClock(func() time.Time { return now })
	base := slog.New(b.Handler(slog.NewTextHandler(&buf, nil), slog.String("worker_id", "w")))
	engine := base.With("worker_id", "w")
	for range 3 {
		engine.Info("line")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "worker log lines dropped") {
		if time.Now().After(deadline) {
			t.Fatalf("no drop notice; log:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if strings.Count(l, "worker_id=w") != 1 {
			t.Errorf("worker_id not once in %q", l)
		}
	}
}
