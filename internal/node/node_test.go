package node_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/lull"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/internal/state"
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
	if err := f.Node.Remove(ctx, w); err != nil {
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

// Reconcile makes the node match the catalog: running workers attached
// (parked, engines.Spec.Parked), stopped and deleted ones detached, a
// broken one counted without stopping the others.
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
	w.Status, w.UpdatedAt = catalog.StatusRunning, time.Now()
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := f.Node.Sync(ctx, "stop"); err != nil || !f.Dispatcher.Attached("stop") {
		t.Fatalf("Sync did not attach a worker started elsewhere: %v", err)
	}
	if loads := f.Engine.Loads(); loads != 2 {
		t.Fatalf("%d engine loads, want 2 (run, then stop once started)", loads)
	}
	// Reconcile attaches a worker whose record is older than the node
	// parked (engines.Spec.Parked: no process until its first event where
	// the engine parks idle workers); Sync of a record changed since the
	// node started (a start elsewhere), like Apply, does not; Sync of one
	// unchanged since (recovery's Activate after a restart) does.
	if parked := f.Engine.ParkedLoads(); parked != 1 {
		t.Fatalf("%d parked loads, want 1 (Reconcile's of run; not Sync's of stop)", parked)
	}
	old := records["run"]
	old.ID, old.UpdatedAt = "old", time.Now().Add(-time.Hour)
	if err := f.Catalog.SaveWorker(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := f.Node.Sync(ctx, "old"); err != nil || !f.Dispatcher.Attached("old") {
		t.Fatalf("Sync did not attach a worker unchanged since before the node started: %v", err)
	}
	if parked := f.Engine.ParkedLoads(); parked != 2 {
		t.Fatalf("%d parked loads, want 2 (and Sync's of a record older than the node)", parked)
	}
	// A record created after the node started, reached by a reconcile
	// before its own fan-out: not parked.
	fresh := records["run"]
	fresh.ID, fresh.UpdatedAt = "fresh", time.Now()
	if err := f.Catalog.SaveWorker(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Node.Reconcile(ctx); err != nil || !f.Dispatcher.Attached("fresh") {
		t.Fatalf("Reconcile did not attach a new worker: %v", err)
	}
	if parked := f.Engine.ParkedLoads(); parked != 2 {
		t.Fatalf("%d parked loads, want still 2 (a record newer than the node starts its processes)", parked)
	}
}

// A reconcile stuck in one worker's load (slow user code) holds up only
// that worker: a lifecycle operation on another worker (Sync, as Activate
// runs it) completes meanwhile.
func TestReconcileDoesNotHoldUpOtherWorkers(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	slow, _ := f.Catalog.PutCode(ctx, []byte(nodetest.SlowCode))
	good, _ := f.Catalog.PutCode(ctx, []byte("good"))
	a := nodetest.Worker(catalog.StatusRunning, slow)
	a.ID = "a-slow"
	b := nodetest.Worker(catalog.StatusRunning, good)
	b.ID = "b"
	for _, w := range []catalog.Worker{a, b} {
		if err := f.Catalog.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { _, err := f.Node.Reconcile(ctx); done <- err }()
	waitUntil(t, func() bool { return f.Engine.Attempts() >= 1 }) // the reconcile is in a-slow's load
	synced := make(chan error, 1)
	go func() { synced <- f.Node.Sync(ctx, "b") }()
	select {
	case err := <-synced:
		if err != nil || !f.Dispatcher.Attached("b") {
			t.Fatalf("Sync(b): %v, attached %v", err, f.Dispatcher.Attached("b"))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Sync of another worker waited for the reconcile's slow load")
	}
	f.Engine.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !f.Dispatcher.Attached("a-slow") {
		t.Fatal("the slow worker was not attached once its load finished")
	}
}

// Reconcile retries a broken worker with backoff while its record stays
// the same (its load runs user code), and at once when the record changes;
// Sync, a lifecycle operation, always tries.
func TestReconcileBacksOffBrokenWorkers(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	now := time.Unix(1_800_000_000, 0)
	node.SetClock(f.Node, func() time.Time { return now })
	bad, _ := f.Catalog.PutCode(ctx, []byte(nodetest.BadCode))
	w := nodetest.Worker(catalog.StatusRunning, bad)
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	reconcile := func() node.ReconcileResult {
		t.Helper()
		res, err := f.Node.Reconcile(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := reconcile(); res.Failed != 1 || f.Engine.Attempts() != 1 {
		t.Fatalf("first pass: %+v, %d loads", res, f.Engine.Attempts())
	}
	if res := reconcile(); res.Failed != 1 || len(res.Errors) != 1 || f.Engine.Attempts() != 1 {
		t.Fatalf("second pass within the backoff: %+v, %d loads (want the remembered error, no load)", res, f.Engine.Attempts())
	}
	now = now.Add(node.ReconcileBackoffBase)
	reconcile()
	if f.Engine.Attempts() != 2 {
		t.Fatalf("after the backoff: %d loads, want 2", f.Engine.Attempts())
	}
	now = now.Add(node.ReconcileBackoffBase) // the backoff doubled: not yet
	reconcile()
	if f.Engine.Attempts() != 2 {
		t.Fatalf("within the doubled backoff: %d loads, want 2", f.Engine.Attempts())
	}
	if err := f.Node.Sync(ctx, w.ID); err == nil || f.Engine.Attempts() != 3 {
		t.Fatalf("Sync: %v, %d loads (a lifecycle operation always tries)", err, f.Engine.Attempts())
	}
	good, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w.CodeSHA256, w.CodeVersion = good, 2
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if res := reconcile(); res.Failed != 0 || res.Running != 1 || !f.Dispatcher.Attached(w.ID) {
		t.Fatalf("a changed record is tried at once: %+v", res)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Reconcile brings up to its parallelism of workers up at a time (a node
// back from a lapse loads every worker again: one at a time took minutes
// for a few hundred), never more, and all of them in the end.
func TestReconcileLoadsWorkersInParallel(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	f.Node.SetReconcileParallelism(3)
	slow, _ := f.Catalog.PutCode(ctx, []byte(nodetest.SlowCode))
	for _, id := range []string{"w1", "w2", "w3", "w4", "w5", "w6", "w7"} {
		w := nodetest.Worker(catalog.StatusRunning, slow)
		w.ID = id
		if err := f.Catalog.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan node.ReconcileResult, 1)
	go func() {
		res, err := f.Node.Reconcile(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	// Three loads wait at once (one at a time would stop at one).
	waitUntil(t, func() bool { return f.Engine.Attempts() == 3 })
	f.Engine.Release()
	res := <-done
	if res.Running != 7 || res.Failed != 0 || f.Engine.Loads() != 7 {
		t.Fatalf("result %+v, %d loads; want 7 running", res, f.Engine.Loads())
	}
	if m := f.Engine.MaxInFlight(); m != 3 {
		t.Fatalf("%d loads at once, want 3 (the parallelism)", m)
	}
	for _, id := range []string{"w1", "w4", "w7"} {
		if !f.Dispatcher.Attached(id) {
			t.Fatalf("%s not attached", id)
		}
	}
}

// codeReads counts the reads of code bodies (catalog.GetCode) through a
// store.
type codeReads struct {
	state.Store
	n atomic.Int32
}

func (s *codeReads) Get(ctx context.Context, key string) (state.Item, error) {
	if strings.HasPrefix(key, state.KeyPrefix+"code/") {
		s.n.Add(1)
	}
	return s.Store.Get(ctx, key)
}

// The Apply that follows a Check on the same node loads the body the
// check passed instead of reading it from the store again; an Apply
// without one (another node checked, or a Reconcile) reads the store's.
func TestApplyLoadsTheBodyItsNodeChecked(t *testing.T) {
	reads := &codeReads{}
	f := nodetest.NewOnStore(t, func(st state.Store) state.Store { reads.Store = st; return reads })
	ctx := context.Background()
	body := []byte("good v1")
	sha, err := f.Catalog.PutCode(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	w := nodetest.Worker(catalog.StatusRunning, sha)
	if err := f.Node.Check(ctx, w, body); err != nil {
		t.Fatal(err)
	}
	if err := f.Node.Apply(ctx, w, &catalog.HistoryEntry{Version: 1, SHA256: sha, SourceKind: "content"}); err != nil {
		t.Fatal(err)
	}
	if n := reads.n.Load(); n != 0 || !f.Dispatcher.Attached(w.ID) {
		t.Fatalf("Apply after Check: %d code reads, attached %v; want none, attached", n, f.Dispatcher.Attached(w.ID))
	}

	// A reload not checked here reads the store.
	body2 := []byte("good v2")
	sha2, err := f.Catalog.PutCode(ctx, body2)
	if err != nil {
		t.Fatal(err)
	}
	w.CodeSHA256, w.CodeVersion = sha2, 2
	if err := f.Node.Apply(ctx, w, &catalog.HistoryEntry{Version: 2, SHA256: sha2, SourceKind: "content"}); err != nil {
		t.Fatal(err)
	}
	if n := reads.n.Load(); n != 1 {
		t.Fatalf("Apply without a Check here: %d code reads, want 1", n)
	}
}

// A lifecycle call is in flight on the engines' lull gate (engines/lull)
// while it runs — an Apply whose load has not returned, which holds
// background work back (TestAfterWaitsForALull) — and the check tells
// the engine the worker's tenant (the .NET engine keeps compilers per
// tenant).
func TestLifecycleCallsHoldBackgroundWork(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	g := &lull.Gate{}
	node.SetCalls(f.Node, g)
	slow, err := f.Catalog.PutCode(ctx, []byte(nodetest.SlowCode))
	if err != nil {
		t.Fatal(err)
	}
	w := nodetest.Worker(catalog.StatusRunning, slow)
	w.Tenant = "acme"
	if err := f.Node.Check(ctx, w, []byte(nodetest.SlowCode)); err != nil {
		t.Fatal(err)
	}
	if checks := f.Engine.Checks(); len(checks) != 1 || checks[0].Tenant != "acme" {
		t.Fatalf("checks %+v, want one for tenant acme", checks)
	}
	applied := make(chan error, 1)
	go func() {
		applied <- f.Node.Apply(ctx, w, &catalog.HistoryEntry{Version: 1, SHA256: slow, SourceKind: "content"})
	}()
	for deadline := time.Now().Add(10 * time.Second); f.Engine.Attempts() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the apply's load did not start")
		}
	}
	if n := g.InFlight(); n != 1 {
		t.Fatalf("%d calls in flight on the gate while an apply runs, want 1", n)
	}
	f.Engine.Release()
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if n := g.InFlight(); n != 0 {
		t.Fatalf("%d calls in flight on the gate after the apply, want 0", n)
	}
}
