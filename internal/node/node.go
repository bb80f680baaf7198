// Package node owns the set of workers running on this WorkManager node: it
// loads a worker's code into its engine and attaches it to the hot path
// (Apply), detaches it (Remove), and makes the node match the catalog
// (Reconcile) after a restart or when another node changed a worker.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/dispatch"
)

// Node runs workers on this process.
type Node struct {
	log      *slog.Logger
	catalog  *catalog.Catalog
	engines  *engines.Registry
	disp     *dispatch.Dispatcher
	timeout  time.Duration
	mu       sync.Mutex        // serializes Apply, Remove and Reconcile
	attached map[string]string // worker id → code sha256 attached
	policy   map[string]dispatch.Worker
}

// New returns a Node. timeout bounds one message in a worker (0: engine default).
func New(log *slog.Logger, cat *catalog.Catalog, reg *engines.Registry, disp *dispatch.Dispatcher, timeout time.Duration) *Node {
	return &Node{log: log, catalog: cat, engines: reg, disp: disp, timeout: timeout, attached: map[string]string{}, policy: map[string]dispatch.Worker{}}
}

// Spec is the engine spec for a worker.
func (n *Node) Spec(w catalog.Worker) engines.Spec {
	return engines.Spec{WorkerID: w.ID, MIMEType: w.MIMEType, Topic: w.Topic, Group: w.Group, Timeout: n.timeout,
		Logger: n.log.With("worker_id", w.ID)}
}

// Check load-checks code for w with its engine without running it.
func (n *Node) Check(ctx context.Context, w catalog.Worker, code []byte) error {
	e, err := n.engines.Lookup(w.MIMEType)
	if err != nil {
		return err
	}
	return e.Check(ctx, n.Spec(w), code)
}

// Apply makes this node serve w and then persists it, under one lock so that
// a concurrent Reconcile never sees the node and the catalog disagree: a
// RUNNING worker is attached with the code w.CodeSHA256 (hot-swapped if other
// code is attached), a STOPPED one is detached; then the record (and history,
// when not nil) is saved. The node goes first so that a worker whose code
// cannot be attached is never persisted. It is idempotent.
func (n *Node) Apply(ctx context.Context, w catalog.Worker, history *catalog.HistoryEntry) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.apply(ctx, w); err != nil {
		return err
	}
	if err := n.catalog.SaveWorker(ctx, w); err != nil {
		return err
	}
	if history != nil {
		return n.catalog.AppendHistory(ctx, w.ID, *history)
	}
	return nil
}

// hotPath is how the dispatcher knows w.
func hotPath(w catalog.Worker) dispatch.Worker {
	return dispatch.Worker{ID: w.ID, Topic: w.Topic, Group: w.Group, MaxAttempts: w.MaxAttempts, RetryBackoff: w.RetryBackoff}
}

func (n *Node) apply(ctx context.Context, w catalog.Worker) error {
	if w.Status != catalog.StatusRunning {
		n.remove(ctx, w.ID)
		n.disp.ClearUnrunnable(w.ID)
		return nil
	}
	if n.attached[w.ID] == w.CodeSHA256 && n.disp.Attached(w.ID) && n.policy[w.ID] == hotPath(w) {
		return nil
	}
	inst, err := n.load(ctx, w)
	if err != nil {
		// The catalog runs it, this node cannot: its messages must wait for
		// a node that can (or dead-letter as not_runnable), not be acked
		// without it.
		n.remove(ctx, w.ID)
		n.disp.SetUnrunnable(hotPath(w))
		return err
	}
	n.disp.Attach(hotPath(w), inst)
	n.policy[w.ID] = hotPath(w)
	n.attached[w.ID] = w.CodeSHA256
	n.log.Info("worker attached", "worker_id", w.ID, "topic", w.Topic, "code_sha256", w.CodeSHA256)
	return nil
}

func (n *Node) load(ctx context.Context, w catalog.Worker) (engines.Instance, error) {
	code, err := n.catalog.GetCode(ctx, w.CodeSHA256)
	if err != nil {
		return nil, fmt.Errorf("load code %s of worker %s: %w", w.CodeSHA256, w.ID, err)
	}
	e, err := n.engines.Lookup(w.MIMEType)
	if err != nil {
		return nil, err
	}
	inst, err := e.Load(ctx, n.Spec(w), code)
	if err != nil {
		return nil, fmt.Errorf("load worker %s: %w", w.ID, err)
	}
	return inst, nil
}

// Remove detaches a worker (no-op when it is not attached) and then deletes
// its record, under the same lock (see Apply).
func (n *Node) Remove(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.remove(ctx, id)
	n.disp.ClearUnrunnable(id)
	return n.catalog.DeleteWorker(ctx, id)
}

func (n *Node) remove(ctx context.Context, id string) {
	if _, ok := n.attached[id]; !ok {
		return
	}
	n.disp.Detach(ctx, id)
	delete(n.attached, id)
	delete(n.policy, id)
	n.log.Info("worker detached", "worker_id", id)
}

// ReconcileResult counts what Reconcile did.
type ReconcileResult struct {
	Running, Stopped, Failed int
	Errors                   []error
}

// Reconcile makes the node match the catalog: RUNNING workers attached with
// their current code, everything else detached. One broken worker does not
// stop the others; it is counted and its error returned in the result.
func (n *Node) Reconcile(ctx context.Context) (ReconcileResult, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ws, err := n.catalog.ListWorkers(ctx)
	if err != nil {
		return ReconcileResult{}, fmt.Errorf("list workers: %w", err)
	}
	var res ReconcileResult
	known := map[string]bool{}
	for _, w := range ws {
		known[w.ID] = true
		if err := n.apply(ctx, w); err != nil {
			res.Failed++
			res.Errors = append(res.Errors, err)
			n.log.Error("worker could not be recovered", "worker_id", w.ID, "err", err)
			continue
		}
		if w.Status == catalog.StatusRunning {
			res.Running++
		} else {
			res.Stopped++
		}
	}
	for id := range n.attached {
		if !known[id] {
			n.remove(ctx, id)
		}
	}
	n.disp.RetainUnrunnable(known)
	return res, nil
}

// Shutdown detaches every worker.
func (n *Node) Shutdown(ctx context.Context) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.disp.DetachAll(ctx)
	clear(n.attached)
	clear(n.policy)
}

// Sync makes this node match the catalog's current record of one worker
// (detached when it is gone), reading the record under the node's lock.
func (n *Node) Sync(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	w, err := n.catalog.GetWorker(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) {
		n.remove(ctx, id)
		n.disp.ClearUnrunnable(id)
		return nil
	}
	if err != nil {
		return err
	}
	return n.apply(ctx, w)
}
