package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/node/nodetest"
)

// Issue 44 item 1: a quarantined worker's code is not loaded (its topic
// stays attached with a stand-in, so that its crashing events can be
// dead-lettered); once the quarantine record is cleared (LoadCode or
// StartWorker) the next apply loads the code and tells the crash journal
// to forget the worker.
func TestQuarantinedWorkerIsNotLoadedUntilCleared(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	sha, err := f.Catalog.PutCode(ctx, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	var lifted []string
	f.Node.OnQuarantineLifted(func(id string) { lifted = append(lifted, id) })
	w := nodetest.Worker(catalog.StatusRunning, sha)
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	// Held locally at start, before the record is written.
	q := catalog.Quarantine{Crashes: 2, LastEvent: "boom", Node: "n1", At: time.Now()}
	f.Node.Quarantine(w.ID, q)
	if _, err := f.Node.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Engine.Loads() != 0 || !f.Dispatcher.Attached(w.ID) {
		t.Fatalf("held quarantined: %d loads, attached %v; want no load, attached (stand-in)", f.Engine.Loads(), f.Dispatcher.Attached(w.ID))
	}
	// Recorded cluster-wide: the record keeps it quarantined.
	if err := f.Catalog.SetQuarantine(ctx, w.ID, q); err != nil {
		t.Fatal(err)
	}
	f.Node.QuarantineRecorded(w.ID)
	if _, err := f.Node.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Engine.Loads() != 0 {
		t.Fatalf("loaded while the record says quarantined: %d loads", f.Engine.Loads())
	}
	got, ok, err := f.Catalog.GetQuarantine(ctx, w.ID)
	if err != nil || !ok || got.Reason() != "quarantined: crashed the node 2 times (last event boom); reload or start it to try again" {
		t.Fatalf("quarantine record %+v %v %v", got, ok, err)
	}
	// Cleared: the code loads, the journal forgets the worker.
	if cleared, err := f.Catalog.ClearQuarantine(ctx, w.ID); err != nil || !cleared {
		t.Fatalf("clear: %v %v", cleared, err)
	}
	if _, err := f.Node.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Engine.Loads() != 1 || !f.Dispatcher.Attached(w.ID) || len(lifted) != 1 || lifted[0] != w.ID {
		t.Fatalf("after the clear: %d loads, attached %v, lifted %v", f.Engine.Loads(), f.Dispatcher.Attached(w.ID), lifted)
	}
}
