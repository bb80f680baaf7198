package catalog_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
)

// Issue 43 item 1: a write of a worker's record is conditional on the
// revision the workflow last committed: a late write of an older change
// (a stale Apply attempt) never replaces a newer record, a deleted
// worker's incarnation is never written back (tombstone), and only a new
// incarnation (a create in a new run) may write over the tombstone.
func TestStaleRecordWritesAreRefused(t *testing.T) {
	ctx := context.Background()
	c := catalog.New(state.NewMemoryStore())
	w := catalog.Worker{ID: "w1", Topic: "t", Status: catalog.StatusRunning, CodeVersion: 1, Revision: 1, Incarnation: "run-a"}
	if err := c.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorker(ctx, w); err != nil {
		t.Fatalf("a retry of the same write: %v", err)
	}
	stopped := w
	stopped.Status, stopped.Revision = catalog.StatusStopped, 2
	if err := c.SaveWorker(ctx, stopped); err != nil {
		t.Fatal(err)
	}
	// The create's write, late: it must not turn the stop back.
	if err := c.SaveWorker(ctx, w); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("late write of revision 1 over 2: %v, want ErrStale", err)
	}
	if got, _ := c.GetWorker(ctx, "w1"); got.Status != catalog.StatusStopped {
		t.Fatalf("record %+v, want the stop kept", got)
	}
	// Another incarnation never writes over a live record.
	other := w
	other.Incarnation, other.Revision = "run-b", 5
	if err := c.SaveWorker(ctx, other); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("another incarnation over a live record: %v, want ErrStale", err)
	}

	if err := c.RemoveWorker(ctx, stopped); err != nil {
		t.Fatal(err)
	}
	// The create's write, later still: the worker stays deleted.
	if err := c.SaveWorker(ctx, w); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("late write after delete: %v, want ErrStale", err)
	}
	if _, err := c.GetWorker(ctx, "w1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("GetWorker after delete: %v", err)
	}
	if ids, _ := c.WorkerIDs(ctx); slices.Contains(ids, "w1") {
		t.Fatalf("index after a late write: %v", ids)
	}
	if ws, _ := c.ListWorkers(ctx); len(ws) != 0 {
		t.Fatalf("list after delete: %+v", ws)
	}
	// A create in a new run (after a failed create) is a new incarnation.
	if err := c.SaveWorker(ctx, other); err != nil {
		t.Fatalf("new incarnation over the tombstone: %v", err)
	}
	if got, err := c.GetWorker(ctx, "w1"); err != nil || got.Incarnation != "run-b" {
		t.Fatalf("record %+v %v", got, err)
	}
	// A late delete of the old incarnation does not remove the new one.
	if err := c.RemoveWorker(ctx, stopped); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("late delete of another incarnation: %v, want ErrStale", err)
	}
	if _, err := c.GetWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
}

// Issue 43 item 3: a delete of a worker whose record was never written (a
// failed create's undo) leaves a tombstone too, so the create's own late
// write cannot bring it back.
func TestRemoveOfAnUnwrittenRecordRefusesItsLateWrite(t *testing.T) {
	ctx := context.Background()
	c := catalog.New(state.NewMemoryStore())
	w := catalog.Worker{ID: "w1", Topic: "t", Status: catalog.StatusRunning, CodeVersion: 1, Revision: 1, Incarnation: "run-a"}
	if err := c.RemoveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorker(ctx, w); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("late write after the undo: %v, want ErrStale", err)
	}
	if _, err := c.GetWorker(ctx, "w1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("GetWorker: %v", err)
	}
}
