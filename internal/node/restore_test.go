package node_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/node/nodetest"
)

// With the restore held (WORKER_RECOVERY_ON_START=false), Reconcile brings
// up no RUNNING worker that is not attached here, while a lifecycle
// operation (Apply) still attaches; once released, Reconcile restores.
func TestHeldRestoreWaitsForRecoverWorkers(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	good, _ := f.Catalog.PutCode(ctx, []byte("good"))
	for _, id := range []string{"a", "b"} {
		w := nodetest.Worker(catalog.StatusRunning, good)
		w.ID = id
		if err := f.Catalog.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	f.Node.HoldRestore()
	res, err := f.Node.Reconcile(ctx)
	if err != nil || res.Held != 2 || res.Running != 0 || f.Dispatcher.Attached("a") || f.Dispatcher.Attached("b") {
		t.Fatalf("held reconcile: %+v %v, attached a %v b %v; want both held", res, err, f.Dispatcher.Attached("a"), f.Dispatcher.Attached("b"))
	}
	c := nodetest.Worker(catalog.StatusRunning, good)
	c.ID = "c"
	if err := f.Node.Apply(ctx, c, nil); err != nil || !f.Dispatcher.Attached("c") {
		t.Fatalf("Apply while held: %v, attached %v; want a lifecycle operation to attach", err, f.Dispatcher.Attached("c"))
	}
	if res, err := f.Node.Reconcile(ctx); err != nil || res.Held != 2 || res.Running != 1 || !f.Dispatcher.Attached("c") {
		t.Fatalf("held reconcile after Apply: %+v %v; want c kept, a and b held", res, err)
	}
	f.Node.ReleaseRestore()
	if res, err := f.Node.Reconcile(ctx); err != nil || res.Held != 0 || res.Running != 3 || !f.Dispatcher.Attached("a") || !f.Dispatcher.Attached("b") {
		t.Fatalf("released reconcile: %+v %v; want all three running", res, err)
	}
}

// A worker that fails to load in a reconcile is announced once as
// worker.error (load_failed), not again on each retry of the same record.
func TestReconcileLoadFailureIsAnnouncedOnce(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	f.Node.SetEvents(f.Events)
	bad, _ := f.Catalog.PutCode(ctx, []byte(nodetest.BadCode))
	w := nodetest.Worker(catalog.StatusRunning, bad)
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if res, err := f.Node.Reconcile(ctx); err != nil || res.Failed != 1 {
			t.Fatalf("reconcile: %+v %v", res, err)
		}
	}
	evs := f.Published.On(lifecycleevents.Topic)
	if len(evs) != 1 || evs[0].Type() != lifecycleevents.TypePrefix+string(lifecycleevents.Error) {
		t.Fatalf("%d lifecycle events (%v), want one worker.error", len(evs), evs)
	}
	var d lifecycleevents.Data
	if err := json.Unmarshal(evs[0].Data(), &d); err != nil || d.WorkerID != w.ID || d.ErrorType != node.ErrorTypeLoad || d.ErrorMessage == "" {
		t.Fatalf("worker.error %s (%v)", evs[0].Data(), err)
	}
}

// A worker's own timeout bounds its calls, capped by the node's
// (WORKER_TIMEOUT; the fixture's is 1 s); none: the node's.
func TestWorkerTimeoutIsCappedByTheNodes(t *testing.T) {
	f := nodetest.New(t)
	for ms, want := range map[int64]time.Duration{0: time.Second, 50: 50 * time.Millisecond, 999: 999 * time.Millisecond, 600000: time.Second} {
		if got := f.Node.TimeoutOf(catalog.Worker{TimeoutMS: ms}); got != want {
			t.Errorf("timeout_ms %d: %v, want %v", ms, got, want)
		}
	}
}
