package node_test

import (
	"context"
	"errors"
	"testing"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/node/nodetest"
)

// Apply attaches, then persists; Remove detaches, then deletes. A worker whose
// code cannot be attached is never persisted.
func TestApplyAndRemoveOrderNodeBeforeCatalog(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	sha, err := f.Catalog.PutCode(ctx, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	w := nodetest.Worker(catalog.StatusRunning, sha)
	h := &catalog.HistoryEntry{Version: 1, SHA256: sha, SourceKind: "content"}
	if err := f.Node.Apply(ctx, w, h); err != nil {
		t.Fatal(err)
	}
	if got, err := f.Catalog.GetWorker(ctx, w.ID); err != nil || got.Status != catalog.StatusRunning || !f.Dispatcher.Attached(w.ID) {
		t.Fatalf("after Apply: record %+v %v, attached %v", got, err, f.Dispatcher.Attached(w.ID))
	}
	if err := f.Node.Remove(ctx, w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Catalog.GetWorker(ctx, w.ID); !errors.Is(err, catalog.ErrNotFound) || f.Dispatcher.Attached(w.ID) {
		t.Fatalf("after Remove: %v, attached %v", err, f.Dispatcher.Attached(w.ID))
	}

	bad, err := f.Catalog.PutCode(ctx, []byte(nodetest.BadCode))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Node.Apply(ctx, nodetest.Worker(catalog.StatusRunning, bad), nil); err == nil {
		t.Fatal("Apply of code the engine refuses must fail")
	}
	if _, err := f.Catalog.GetWorker(ctx, w.ID); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a worker that could not be attached was persisted: %v", err)
	}
}

// Reconcile makes the node match the catalog: running workers attached,
// stopped and deleted ones detached, a broken one counted without stopping
// the others.
func TestReconcileMatchesTheCatalog(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	good, _ := f.Catalog.PutCode(ctx, []byte("good"))
	bad, _ := f.Catalog.PutCode(ctx, []byte(nodetest.BadCode))
	records := map[string]catalog.Worker{}
	for id, w := range map[string]catalog.Worker{
		"run":    nodetest.Worker(catalog.StatusRunning, good),
		"stop":   nodetest.Worker(catalog.StatusStopped, good),
		"broken": nodetest.Worker(catalog.StatusRunning, bad),
	} {
		w.ID = id
		records[id] = w
		if err := f.Catalog.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	res, err := f.Node.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Running != 1 || res.Stopped != 1 || res.Failed != 1 || len(res.Errors) != 1 {
		t.Fatalf("result %+v", res)
	}
	if !f.Dispatcher.Attached("run") || f.Dispatcher.Attached("stop") || f.Dispatcher.Attached("broken") {
		t.Fatal("attached set does not match the catalog")
	}
	// Deleted elsewhere: the next reconcile detaches it; Sync does the same
	// for one worker.
	if err := f.Catalog.DeleteWorker(ctx, "run"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Node.Reconcile(ctx); err != nil || f.Dispatcher.Attached("run") {
		t.Fatalf("deleted worker still attached: %v", err)
	}
	w := records["stop"]
	w.Status = catalog.StatusRunning
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := f.Node.Sync(ctx, "stop"); err != nil || !f.Dispatcher.Attached("stop") {
		t.Fatalf("Sync did not attach a worker started elsewhere: %v", err)
	}
	if loads := f.Engine.Loads(); loads != 2 {
		t.Fatalf("%d engine loads, want 2 (run, then stop once started)", loads)
	}
}
