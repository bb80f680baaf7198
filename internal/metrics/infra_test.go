package metrics

import (
	"io"
	"log/slog"
	"testing"

	"github.com/virtufin/workmanager/internal/infraevents"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
)

// TestInfraEventsDroppedIsExported: the infrastructure events an emitter
// drops (its queue full: nothing publishing) are a counter on the scrape.
func TestInfraEventsDroppedIsExported(t *testing.T) {
	m, reg := newTest(t)
	e := infraevents.NewEmitter(slog.New(slog.NewTextHandler(io.Discard, nil)), &publishtest.Recorder{}, "n1", 1)
	m.SetInfraDropped(e.Dropped)
	if got := gathered(t, reg, "workmanager_infra_events_dropped_total"); got != "workmanager_infra_events_dropped_total{} 0\n" {
		t.Fatalf("before: %q", got)
	}
	for range 4 { // one queued (Run is not running), three dropped
		e.Emit("workmanager.infra.grouplock", "grouplock.acquired", map[string]string{"group": "g"})
	}
	if got := gathered(t, reg, "workmanager_infra_events_dropped_total"); got != "workmanager_infra_events_dropped_total{} 3\n" {
		t.Fatalf("after 4 events into a queue of 1: %q, want 3 dropped", got)
	}
}
