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
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/lull"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/logbudget"
)

// Node runs workers on this process.
//
// Operations on one worker (Apply, Remove, Sync, its step of Reconcile) are
// serialized by that worker's lock, and each re-reads or writes the
// worker's record under it, so the node and the catalog never disagree for
// long. Operations on different workers run concurrently: an engine load or
// a detach that takes long holds up only its own worker. mu guards the maps
// and is never held across a load, a detach or a store call.
type Node struct {
	log     *slog.Logger
	catalog *catalog.Catalog
	engines *engines.Registry
	disp    *dispatch.Dispatcher
	timeout time.Duration
	now     func() time.Time
	// calls is where the node marks its lifecycle calls (Check, Apply,
	// Remove) so that the engines' background work (spares started again,
	// kept compilers staging) waits for a pause between them
	// (engines/lull).
	calls *lull.Gate
	// started is when the node was made: a worker whose record has not
	// changed since is attached again, not started anew (sync).
	started  time.Time
	mu       sync.Mutex
	locks    map[string]*workerLock
	attached map[string]string // worker id → code sha256 attached
	policy   map[string]dispatch.Worker
	broken   map[string]brokenWorker
	fenced   atomic.Bool // some holder fences the node
	fenceMu  sync.Mutex
	fencers  map[string]bool // who fences it (FenceBy)
	// logLines is each worker's log budget per second (0: unlimited);
	// budgets holds the budget of each worker, shared by its reloads.
	logLines int
	budgets  map[string]*logbudget.Budget
	// expected tells that expectRunning has read the catalog once (under
	// expectMu): until then every apply that attaches a worker reads it
	// first. A starting node's first attach may come from the recovery
	// workflow's Activate or a lifecycle change, before its first
	// Reconcile.
	expectMu sync.Mutex
	expected bool
	// parallelism is how many workers Reconcile brings up at a time.
	parallelism int
	// wfCheck asks whether a worker's workflow completed
	// (SetWorkflowCheck); checked holds its answers (under mu).
	wfCheck WorkflowCheck
	checked map[string]checkedRecord
	// checkedBodies are the bodies Check passed, for the load that follows
	// here (checked.go).
	checkedBodies checkedCode
	// quarantine knows the workers that crashed this node (quarantine.go).
	quarantine quarantineState
	// place tells which topics this node serves (SetPlacement; nil: all).
	place Placement
	// events announces a worker that fails to load outside a lifecycle
	// operation (SetEvents; nil: only logged).
	events *lifecycleevents.Emitter
	// holdRestore: a RUNNING worker that is not attached here is not
	// brought up by Reconcile until ReleaseRestore (HoldRestore:
	// WORKER_RECOVERY_ON_START=false).
	holdRestore atomic.Bool
}

// SetEvents makes the node announce, as a worker.error lifecycle event
// (error_type ErrorTypeLoad), a worker that Reconcile could not load
// (recovery, the periodic reconcile): once per record, not per retry.
// Call it before serving.
func (n *Node) SetEvents(e *lifecycleevents.Emitter) { n.events = e }

// ErrorTypeLoad is the error_type of the worker.error event for a worker
// that could not be loaded outside a lifecycle operation (whose caller
// gets the error itself).
const ErrorTypeLoad = "load_failed"

// HoldRestore stops Reconcile bringing up RUNNING workers that are not
// attached here (it still detaches stopped and deleted ones, and keeps
// those attached in step): with WORKER_RECOVERY_ON_START=false a node
// restores workers only when RecoverWorkers runs (ReleaseRestore).
// Lifecycle operations (Apply, Sync) attach as always.
func (n *Node) HoldRestore() { n.holdRestore.Store(true) }

// ReleaseRestore ends HoldRestore: the next Reconcile brings up every
// RUNNING worker this node serves.
func (n *Node) ReleaseRestore() { n.holdRestore.Store(false) }

// RestoreHeld reports whether HoldRestore is in force.
func (n *Node) RestoreHeld() bool { return n.holdRestore.Load() }

// SetLogBudget bounds what each worker's code may log, in lines per second
// (WORKER_LOG_LINES_PER_SECOND; 0: unlimited). Call it before serving.
func (n *Node) SetLogBudget(perSecond int) { n.logLines = perSecond }

// workerLog is the logger worker w's code logs to, under its budget. The
// engines put worker_id on every record they make with it (the worker's
// output lines, their records about its processes), so it carries no
// worker_id of its own: each line names the worker once. The budget's drop
// notices, which no engine makes, get it here.
func (n *Node) workerLog(id string) *slog.Logger {
	n.mu.Lock()
	b := n.budgets[id]
	if b == nil {
		if n.budgets == nil {
			n.budgets = map[string]*logbudget.Budget{}
		}
		b = logbudget.New(n.logLines)
		n.budgets[id] = b
	}
	n.mu.Unlock()
	return slog.New(b.Handler(n.log.Handler(), slog.String("worker_id", id)))
}

type workerLock struct {
	mu    sync.Mutex
	users int
}

// brokenWorker remembers a record that failed to attach, so that Reconcile
// retries it with backoff instead of re-running its load (user code) on
// every pass.
type brokenWorker struct {
	record   catalog.Worker
	err      error
	failures int
	next     time.Time
}

// Reconcile's retry of a broken worker: after ReconcileBackoffBase, doubling
// to ReconcileBackoffMax. Apply and Sync (lifecycle operations) always try.
const (
	ReconcileBackoffBase = 30 * time.Second
	ReconcileBackoffMax  = 15 * time.Minute
)

// New returns a Node. timeout bounds one message in a worker (0: engine default).
func New(log *slog.Logger, cat *catalog.Catalog, reg *engines.Registry, disp *dispatch.Dispatcher, timeout time.Duration) *Node {
	return &Node{log: log, catalog: cat, engines: reg, disp: disp, timeout: timeout, now: time.Now, started: time.Now(), calls: lull.Node,
		locks: map[string]*workerLock{}, attached: map[string]string{}, policy: map[string]dispatch.Worker{}, broken: map[string]brokenWorker{},
		parallelism: DefaultReconcileParallelism}
}

// timeoutOf bounds one event in w: its own timeout (catalog.Worker.
// TimeoutMS), capped by the node's (WORKER_TIMEOUT, the longest any
// worker's call may run here: a grouped call must end before its lock's
// max age); the node's when it has none.
func (n *Node) timeoutOf(w catalog.Worker) time.Duration {
	if t := time.Duration(w.TimeoutMS) * time.Millisecond; t > 0 && (n.timeout <= 0 || t < n.timeout) {
		return t
	}
	return n.timeout
}

// lockWorker takes worker id's lock; the returned function gives it back.
func (n *Node) lockWorker(id string) func() {
	n.mu.Lock()
	l := n.locks[id]
	if l == nil {
		l = &workerLock{}
		n.locks[id] = l
	}
	l.users++
	n.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		n.mu.Lock()
		if l.users--; l.users == 0 {
			delete(n.locks, id)
		}
		n.mu.Unlock()
	}
}

// Spec is the engine spec for a worker.
func (n *Node) Spec(w catalog.Worker) engines.Spec {
	return engines.Spec{WorkerID: w.ID, MIMEType: w.MIMEType, Topic: w.Topic, Group: w.Group, Tenant: w.TenantName(), Timeout: n.timeoutOf(w), GatewayTargets: w.GatewayTargets,
		MaxConcurrency: w.MaxConcurrency, MaxProcesses: w.MaxProcesses, Logger: n.workerLog(w.ID)}
}

// Check load-checks code for w with its engine without running it.
func (n *Node) Check(ctx context.Context, w catalog.Worker, code []byte) error {
	defer n.calls.Begin()()
	e, err := n.engines.Lookup(w.MIMEType)
	if err != nil {
		return err
	}
	s := n.Spec(w)
	// The check runs on whichever node takes the activity; a node that
	// does not serve the topic never loads the worker, so its engine keeps
	// nothing of the check for a Load here (a parked Python runner held
	// its memory and a sandbox user id for 30 s). Judged by the placement
	// view the node has: no read on a create's path.
	s.LoadsElsewhere = n.place != nil && !n.place.ServesByView(w.Topic)
	if err := e.Check(ctx, s, code); err != nil {
		return err
	}
	if !s.LoadsElsewhere {
		n.checkedBodies.put(code, n.now())
	}
	return nil
}

// Apply makes this node serve w and then persists it, under one lock so that
// a concurrent Reconcile never sees the node and the catalog disagree: a
// RUNNING worker is attached with the code w.CodeSHA256 (hot-swapped if other
// code is attached), a STOPPED one is detached; then the history entry (when
// not nil) and the record are saved. The node goes first so that a worker
// whose code cannot be attached is never persisted. It is idempotent.
//
// A change the catalog has moved past (a late attempt of an older change,
// or of a deleted worker: catalog.CheckWrite) is refused with
// catalog.ErrStale before the node acts on it; one overtaken while it ran
// leaves the node matching the record again.
func (n *Node) Apply(ctx context.Context, w catalog.Worker, history *catalog.HistoryEntry) error {
	defer n.calls.Begin()()
	defer n.lockWorker(w.ID)()
	read, err := n.catalog.CheckWrite(ctx, w)
	if err != nil {
		return err
	}
	if err := n.apply(ctx, w, false); err != nil {
		return err
	}
	// The history entry first, then the record: the record is the commit
	// point (reconcile and every node follow it), so a change cut off
	// between the two leaves an entry for a version the record never
	// reached (corrected by the next write of that version), never a record
	// whose version the history lacks.
	if history != nil {
		if err := n.catalog.AppendHistory(ctx, w.ID, *history); err != nil {
			return err
		}
	}
	err = n.catalog.SaveWorkerOver(ctx, w, read)
	if errors.Is(err, catalog.ErrStale) {
		if serr := n.sync(ctx, w.ID); serr != nil {
			n.log.Error("node not brought back to the record after a stale change", "worker_id", w.ID, "err", serr)
		}
	}
	return err
}

// hotPath is how the dispatcher knows w (Engine names its engine in the
// metrics' labels).
func (n *Node) hotPath(w catalog.Worker) dispatch.Worker {
	engine := "unknown"
	if e, err := n.engines.Lookup(w.MIMEType); err == nil {
		engine = e.Info().Name
	}
	return dispatch.Worker{ID: w.ID, Name: w.Name, Topic: w.Topic, Group: w.Group, GroupKey: w.GroupKey, Tenant: w.TenantName(), MaxAttempts: w.MaxAttempts, RetryBackoff: w.RetryBackoff,
		AllowedOutputs: w.AllowedOutputs, TopicPrefix: w.TopicPrefix, Engine: engine}
}

// apply makes the node serve w; the caller holds w's lock. A fenced node
// serves nothing.
func (n *Node) apply(ctx context.Context, w catalog.Worker, reattach bool) error {
	if w.Status != catalog.StatusRunning {
		n.remove(ctx, w.ID)
		n.disp.ClearUnrunnable(w.ID)
		return nil
	}
	if n.fenced.Load() {
		// The catalog runs it, a fenced node does not: its messages wait
		// for another node rather than being acked here without it.
		n.park(ctx, n.hotPath(w))
		return nil
	}
	if !n.placedHere(ctx, w) {
		// Another node serves its topic: parked, not detached, so that a
		// message of the topic that still reaches this node (an attach
		// racing a move) is given back, never acked without it.
		n.unplace(ctx, n.hotPath(w))
		return nil
	}
	if why := n.cannotRun(w); why != "" {
		// Its topic is served here (no node can run every worker of it,
		// or the placement is catching up): its messages wait here, or
		// dead-letter as not_runnable, as for a worker that does not load.
		n.mu.Lock()
		_, was := n.attached[w.ID]
		n.mu.Unlock()
		if was || !n.disp.Unrunnable(w.ID) {
			n.log.Warn("worker not runnable on this node", "worker_id", w.ID, "reason", why)
		}
		if n.unplaceable(w) {
			// No live node can run it: its topic stays subscribed here
			// so that its messages dead-letter as not_runnable after
			// their attempts and NOT_RUNNABLE_GRACE, not wait unseen.
			n.hold(ctx, n.hotPath(w))
			return nil
		}
		n.park(ctx, n.hotPath(w))
		return nil
	}
	n.expectOnce(ctx)
	q, quarantined, err := n.quarantined(ctx, w)
	if err != nil {
		// Unknown: stay as attached (a store blip must not swap workers).
		n.log.Warn("worker's quarantine not read; left as it is", "worker_id", w.ID, "err", err)
		n.mu.Lock()
		quarantined = strings.HasPrefix(n.attached[w.ID], quarantineMark)
		n.mu.Unlock()
		q = catalog.Quarantine{}
	}
	want := w.CodeSHA256
	if quarantined {
		want = quarantineMark + w.CodeSHA256
	}
	n.mu.Lock()
	was := n.attached[w.ID]
	same := was == want && n.policy[w.ID].Equal(n.hotPath(w))
	n.mu.Unlock()
	if same && n.disp.Attached(w.ID) {
		return nil
	}
	var inst engines.Instance
	if quarantined {
		inst = quarantinedInstance{id: w.ID, reason: q.Reason()} // its code is not loaded
	} else {
		inst, err = n.load(ctx, w, reattach)
	}
	if err != nil {
		// The catalog runs it, this node cannot: its messages must wait for
		// a node that can (or dead-letter as not_runnable), not be acked
		// without it.
		n.park(ctx, n.hotPath(w))
		return err
	}
	n.disp.Attach(n.hotPath(w), inst)
	n.mu.Lock()
	n.policy[w.ID] = n.hotPath(w)
	n.attached[w.ID] = want
	delete(n.broken, w.ID)
	// Read under n.mu after recording the worker as attached: a Fence
	// either lists it (and parks it once this apply lets go of the
	// worker's lock) or was set before this read (issue 33, item 6: a load
	// that outlasts a Fence must not leave the worker served).
	fenced := n.fenced.Load()
	n.mu.Unlock()
	if fenced {
		n.park(ctx, n.hotPath(w))
		return nil
	}
	// Read after recording the worker as attached, as the fence above: a
	// move of its topic away either lists it (ConvergePlacement) or is
	// seen here.
	if !n.placedHere(ctx, w) {
		n.unplace(ctx, n.hotPath(w))
		return nil
	}
	if quarantined {
		n.log.Warn("worker quarantined: its code is not loaded, its messages wait (events that crashed the node are dead-lettered as crashed)",
			"worker_id", w.ID, "topic", w.Topic, "reason", q.Reason())
		return nil
	}
	n.unquarantined(w.ID, was)
	n.log.Info("worker attached", "worker_id", w.ID, "topic", w.Topic, "code_sha256", w.CodeSHA256)
	// It loads again: no longer "not recovered" (GetWorker's status_reason).
	if err := n.catalog.ClearNotRecovered(ctx, w.ID); err != nil {
		n.log.Warn("why the worker was not recovered is still recorded; the next attach clears it", "worker_id", w.ID, "err", err)
	}
	return nil
}

// load loads w's code with its engine; reattach (Reconcile) loads it
// parked where the engine parks idle workers (engines.Spec.Parked).
func (n *Node) load(ctx context.Context, w catalog.Worker, reattach bool) (engines.Instance, error) {
	// The body this node just checked for this change (checkedCode), else
	// the store's.
	code, ok := n.checkedBodies.take(w.CodeSHA256, n.now())
	if !ok {
		var err error
		if code, err = n.catalog.GetCode(ctx, w.CodeSHA256); err != nil {
			return nil, fmt.Errorf("load code %s of worker %s: %w", w.CodeSHA256, w.ID, err)
		}
	}
	e, err := n.engines.Lookup(w.MIMEType)
	if err != nil {
		return nil, err
	}
	spec := n.Spec(w)
	spec.Parked = reattach
	inst, err := e.Load(ctx, spec, code)
	if err != nil {
		return nil, fmt.Errorf("load worker %s: %w", w.ID, err)
	}
	return inst, nil
}

// Remove detaches a worker (no-op when it is not attached) and then deletes
// its record, under the same lock (see Apply).
// A removal of another incarnation than the record's (a late attempt) is
// refused with catalog.ErrStale and leaves the node matching the record.
func (n *Node) Remove(ctx context.Context, w catalog.Worker) error {
	defer n.calls.Begin()()
	id := w.ID
	defer n.lockWorker(id)()
	if err := n.catalog.CheckRemove(ctx, w); err != nil {
		return err
	}
	n.remove(ctx, id)
	n.disp.ClearUnrunnable(id)
	err := n.catalog.RemoveWorker(ctx, w)
	if errors.Is(err, catalog.ErrStale) {
		if serr := n.sync(ctx, id); serr != nil {
			n.log.Error("node not brought back to the record after a stale removal", "worker_id", id, "err", serr)
		}
	}
	if err == nil {
		// As a Sync that finds no record would (the delete's fan-out may
		// skip this node: activities.Applied).
		n.forgetChecked(id, nil)
	}
	return err
}

// WorkflowCheck tells whether worker id's entity workflow has completed
// (the worker was deleted).
type WorkflowCheck func(ctx context.Context, id string) (deleted bool, err error)

// SetWorkflowCheck makes Reconcile and Sync ask check before they serve a
// RUNNING record they have not checked yet (each incarnation and revision
// once): a record whose workflow completed is a deleted worker written
// back (by a late write of a node of an older version, or one that
// outlived its tombstone) and is not served; an unanswered check serves
// it and asks again next time. Call it before serving.
func (n *Node) SetWorkflowCheck(check WorkflowCheck) { n.wfCheck = check }

// recordKey names one revision of a record for the workflow check.
type recordKey struct {
	incarnation string
	revision    int64
}

// closedWorkflow tells whether w is a RUNNING record whose workflow has
// completed (SetWorkflowCheck); the caller holds w's lock.
func (n *Node) closedWorkflow(ctx context.Context, w catalog.Worker) bool {
	if n.wfCheck == nil || w.Status != catalog.StatusRunning {
		return false
	}
	key := recordKey{w.Incarnation, w.Revision}
	n.mu.Lock()
	checked, ok := n.checked[w.ID]
	n.mu.Unlock()
	if ok && checked.key == key {
		return checked.closed
	}
	closed, err := n.wfCheck(ctx, w.ID)
	if err != nil {
		n.log.Warn("could not ask whether the worker's workflow is open; serving its record", "worker_id", w.ID, "err", err)
		return false
	}
	if closed {
		n.log.Error("record of a worker whose workflow has completed (deleted): not served", "worker_id", w.ID,
			"incarnation", w.Incarnation, "revision", w.Revision)
	}
	n.mu.Lock()
	if n.checked == nil {
		n.checked = map[string]checkedRecord{}
	}
	n.checked[w.ID] = checkedRecord{key: key, closed: closed}
	n.mu.Unlock()
	return closed
}

type checkedRecord struct {
	key    recordKey
	closed bool
}

// remove detaches worker id; the caller holds its lock.
func (n *Node) remove(ctx context.Context, id string) {
	n.mu.Lock()
	_, ok := n.attached[id]
	delete(n.broken, id)
	n.mu.Unlock()
	if !ok {
		return
	}
	n.disp.Detach(ctx, id)
	n.mu.Lock()
	delete(n.attached, id)
	delete(n.policy, id)
	delete(n.budgets, id)
	n.mu.Unlock()
	n.log.Info("worker detached", "worker_id", id)
}

// park stops serving w here while the catalog still runs it
// (dispatch.Park: its topic's messages are not acked here without it); the
// caller holds its lock.
func (n *Node) park(ctx context.Context, w dispatch.Worker) {
	n.disp.Park(ctx, w)
	if n.forget(w.ID) {
		n.log.Info("worker detached here; it stays running in the catalog", "worker_id", w.ID)
	}
}

// hold is park for a worker no live node can run (dispatch.Hold): its
// topic stays subscribed here.
func (n *Node) hold(ctx context.Context, w dispatch.Worker) {
	n.disp.Hold(ctx, w)
	if n.forget(w.ID) {
		n.log.Info("worker detached here; no live node can run it, so its messages dead-letter as not_runnable", "worker_id", w.ID)
	}
}

// forget drops what the node keeps for an attached worker id, reporting
// whether it was attached.
func (n *Node) forget(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, was := n.attached[id]
	delete(n.attached, id)
	delete(n.policy, id)
	delete(n.budgets, id)
	return was
}

// ReconcileResult counts what Reconcile did.
type ReconcileResult struct {
	Running, Stopped, Failed int
	Errors                   []error
	// Share counts the running workers whose topics this node serves
	// (all of them without placement) and Here those of them attached
	// here afterwards: readiness says "recovered Here of Share".
	Share, Here int
	// Held counts the RUNNING workers not brought up here because of
	// HoldRestore (they wait for RecoverWorkers).
	Held int
}

// statusHeld is reconcileOne's answer for a worker HoldRestore kept down.
const statusHeld catalog.Status = "held"

// DefaultReconcileParallelism is how many workers Reconcile brings up at a
// time: a node that lapsed or restarts in a cluster loads every worker it
// serves again (a Python or .NET load is mostly a child process starting),
// and one at a time that took minutes for a few hundred workers.
const DefaultReconcileParallelism = 4

// SetReconcileParallelism sets how many workers Reconcile brings up at a
// time (below 1: DefaultReconcileParallelism). Call it before serving.
func (n *Node) SetReconcileParallelism(p int) {
	if p < 1 {
		p = DefaultReconcileParallelism
	}
	n.parallelism = p
}

// Reconcile makes the node match the catalog: RUNNING workers attached with
// their current code, everything else detached. It takes up to
// SetReconcileParallelism workers at a time, each under its own lock and
// from its record as read under that lock, so lifecycle operations on other
// workers go on meanwhile. One broken worker does not stop the others: it
// is counted and its error returned in the result, and its load is retried
// with backoff (ReconcileBackoffBase doubling to ReconcileBackoffMax) while
// its record stays the same.
func (n *Node) Reconcile(ctx context.Context) (ReconcileResult, error) {
	ids, err := n.catalog.WorkerIDs(ctx)
	if err != nil {
		return ReconcileResult{}, fmt.Errorf("list workers: %w", err)
	}
	if n.expectRunning(ctx, ids) {
		n.expectMu.Lock()
		n.expected = true
		n.expectMu.Unlock()
	}
	var (
		res   ReconcileResult
		resMu sync.Mutex
		g     errgroup.Group
	)
	g.SetLimit(max(n.parallelism, 1))
	known := map[string]bool{}
	for _, id := range ids {
		known[id] = true
		g.Go(func() error {
			status, err := n.reconcileOne(ctx, id)
			resMu.Lock()
			defer resMu.Unlock()
			switch {
			case err != nil:
				res.Failed++
				res.Errors = append(res.Errors, err)
			case status == catalog.StatusRunning:
				res.Running++
			case status == catalog.StatusStopped:
				res.Stopped++
			case status == statusHeld:
				res.Held++
			}
			return nil
		})
	}
	_ = g.Wait() // each worker's error is in res
	if here, share, err := n.Share(ctx); err == nil {
		res.Here, res.Share = here, share
	}
	n.mu.Lock()
	var stale []string
	for id := range n.attached {
		if !known[id] {
			stale = append(stale, id)
		}
	}
	n.mu.Unlock()
	for _, id := range stale {
		if err := n.Sync(ctx, id); err != nil {
			n.log.Error("worker not in the catalog list could not be synced", "worker_id", id, "err", err)
		}
	}
	n.disp.RetainUnrunnable(known)
	return res, nil
}

// expectRunning records every worker the catalog runs that is not served
// here yet as not runnable here, before Reconcile attaches any: a restarting
// node attaches its workers one at a time (each load takes a while), and the
// first attach on a topic subscribes to it, so without this the topic's
// messages would be acked by the workers attached so far and never reach the
// others (found by the chaos soak, issue 25; issue 30 item 1). Each apply
// then attaches its worker (clearing the mark) or parks it. A failed read
// leaves the marks to the applies.
func (n *Node) expectRunning(ctx context.Context, ids []string) bool {
	ws, err := n.catalog.GetWorkers(ctx, ids)
	if err != nil {
		n.log.Warn("reconcile: reading the workers to expect failed", "err", err)
		return false
	}
	for _, w := range ws {
		n.mu.Lock()
		c, ok := n.checked[w.ID]
		n.mu.Unlock()
		if ok && c.closed && c.key == (recordKey{w.Incarnation, w.Revision}) {
			continue // refused (closedWorkflow)
		}
		if w.Status == catalog.StatusRunning && !n.disp.Attached(w.ID) {
			n.disp.SetUnrunnable(n.hotPath(w))
		}
	}
	return true
}

// expectOnce runs expectRunning over the whole catalog before this node's
// first attach, whatever asks for it (the recovery workflow's Activate, a
// lifecycle change or Reconcile): on a restarting node the recovery
// workflow attached the workers one at a time before the node's first
// Reconcile, and the first attach on a topic subscribed to it, so the
// topic's messages were acked without the workers still to come (chaos
// soak, seed 4, after the fix of a2a9dcd, which covered Reconcile only).
// Concurrent applies wait for the one read; a read that fails is tried
// again by the next apply.
func (n *Node) expectOnce(ctx context.Context) {
	n.expectMu.Lock()
	defer n.expectMu.Unlock()
	if n.expected {
		return
	}
	ids, err := n.catalog.WorkerIDs(ctx)
	if err != nil {
		n.log.Warn("reading the catalog's workers to expect failed", "err", err)
		return
	}
	if n.expectRunning(ctx, ids) {
		n.expected = true
	}
}

// reconcileOne syncs worker id unless its unchanged record failed recently;
// it returns the status it applied ("" when the worker is gone).
func (n *Node) reconcileOne(ctx context.Context, id string) (catalog.Status, error) {
	defer n.lockWorker(id)()
	w, err := n.catalog.GetWorker(ctx, id)
	if err == nil && n.closedWorkflow(ctx, w) {
		err = catalog.ErrNotFound
	}
	if errors.Is(err, catalog.ErrNotFound) {
		n.remove(ctx, id)
		n.disp.ClearUnrunnable(id)
		n.forgetChecked(id, err)
		return "", nil
	}
	if err != nil {
		return "", err
	}
	n.mu.Lock()
	b, wasBroken := n.broken[id]
	_, attached := n.attached[id]
	n.mu.Unlock()
	if wasBroken && reflect.DeepEqual(b.record, w) && n.now().Before(b.next) {
		return w.Status, b.err
	}
	if w.Status == catalog.StatusRunning && !attached && n.holdRestore.Load() {
		// Restored only by RecoverWorkers (HoldRestore).
		return statusHeld, nil
	}
	if err := n.apply(ctx, w, n.unchangedSinceStart(w)); err != nil {
		if !wasBroken || !reflect.DeepEqual(b.record, w) {
			n.announceLoadFailure(ctx, w, err)
		}
		if !wasBroken || !reflect.DeepEqual(b.record, w) {
			b = brokenWorker{record: w}
		}
		b.err, b.failures = err, b.failures+1
		b.next = n.now().Add(min(ReconcileBackoffBase<<min(b.failures-1, 10), ReconcileBackoffMax))
		n.mu.Lock()
		n.broken[id] = b
		n.mu.Unlock()
		n.log.Error("worker could not be recovered", "worker_id", id, "err", err, "retry_after", b.next.Sub(n.now()).Round(time.Second))
		return w.Status, err
	}
	return w.Status, nil
}

// announceLoadFailure publishes worker.error for w, which Reconcile could
// not load (its error text cut to 1 KiB).
func (n *Node) announceLoadFailure(ctx context.Context, w catalog.Worker, err error) {
	if n.events == nil {
		return
	}
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1024] + " …"
	}
	data := lifecycleevents.Data{WorkerID: w.ID, WorkerName: w.Name, Group: w.Group, Topic: w.Topic, ErrorType: ErrorTypeLoad, ErrorMessage: msg}
	if eerr := n.events.Emit(ctx, "", lifecycleevents.Error, data); eerr != nil {
		n.log.Warn("publishing worker.error failed", "worker_id", w.ID, "err", eerr)
	}
}

// Fence holders: why a node is fenced. Each lifts its own fence; the node
// serves again once none holds one.
const (
	// FenceLease: cut off from Temporal (reconcile.LeaseLoop).
	FenceLease = "lease"
	// FenceMembership: not a cluster member (reconcile.MemberGate).
	FenceMembership = "membership"
)

// Fence stops this node serving any worker until Unfence: every attached
// worker is detached (its subscription closed, so its messages go to the
// other nodes), and Apply, Sync and Reconcile attach nothing meanwhile. A
// node that can no longer confirm its assignments (cut off from Temporal)
// fences itself. Fence is FenceBy(ctx, FenceLease).
func (n *Node) Fence(ctx context.Context) { n.FenceBy(ctx, FenceLease) }

// FenceBy fences the node (see Fence) on behalf of holder.
func (n *Node) FenceBy(ctx context.Context, holder string) {
	n.fenceMu.Lock()
	if n.fencers == nil {
		n.fencers = map[string]bool{}
	}
	n.fencers[holder] = true
	n.fenced.Store(true)
	n.fenceMu.Unlock()
	n.mu.Lock()
	ids := make([]string, 0, len(n.attached))
	for id := range n.attached {
		ids = append(ids, id)
	}
	n.mu.Unlock()
	for _, id := range ids {
		unlock := n.lockWorker(id)
		n.mu.Lock()
		w, ok := n.policy[id]
		n.mu.Unlock()
		if ok {
			// Still running in the catalog as far as this node knows: its
			// messages are given back here, never acked without it.
			n.park(ctx, w)
		}
		unlock()
	}
}

// Unfence lifts the lease's fence (UnfenceBy(FenceLease)); the caller
// reconciles the node against the catalog next.
func (n *Node) Unfence() { n.UnfenceBy(FenceLease) }

// UnfenceBy lifts holder's fence: the node serves again once no holder
// fences it. The caller reconciles it against the catalog next.
func (n *Node) UnfenceBy(holder string) {
	n.fenceMu.Lock()
	defer n.fenceMu.Unlock()
	delete(n.fencers, holder)
	n.fenced.Store(len(n.fencers) > 0)
}

// Fenced reports whether the lease fences the node (FencedBy(FenceLease)).
func (n *Node) Fenced() bool { return n.FencedBy(FenceLease) }

// FencedBy reports whether holder fences the node.
func (n *Node) FencedBy(holder string) bool {
	n.fenceMu.Lock()
	defer n.fenceMu.Unlock()
	return n.fencers[holder]
}

// Serving reports whether no holder fences the node.
func (n *Node) Serving() bool { return !n.fenced.Load() }

// Shutdown detaches every worker.
func (n *Node) Shutdown(ctx context.Context) {
	n.disp.DetachAll(ctx)
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.attached)
	clear(n.policy)
}

// Sync makes this node match the catalog's current record of one worker
// (detached when it is gone), reading the record under the worker's lock.
func (n *Node) Sync(ctx context.Context, id string) error {
	defer n.lockWorker(id)()
	return n.sync(ctx, id)
}

// sync is Sync; the caller holds id's lock.
func (n *Node) sync(ctx context.Context, id string) error {
	w, err := n.catalog.GetWorker(ctx, id)
	if err == nil && n.closedWorkflow(ctx, w) {
		err = catalog.ErrNotFound
	}
	if errors.Is(err, catalog.ErrNotFound) {
		n.remove(ctx, id)
		n.disp.ClearUnrunnable(id)
		n.forgetChecked(id, err)
		return nil
	}
	if err != nil {
		return err
	}
	return n.apply(ctx, w, n.unchangedSinceStart(w))
}

// unchangedSinceStart reports whether w's record is older than this node:
// attaching it here (a reconcile, recovery's Activate after a restart) is
// attaching it again, parked where the engine parks idle workers
// (engines.Spec.Parked). A record a lifecycle call changed since (a
// create, a start, a reload), even one a reconcile reaches before that
// call's own fan-out, starts its processes as Apply does.
func (n *Node) unchangedSinceStart(w catalog.Worker) bool {
	return w.UpdatedAt.Before(n.started)
}

// forgetChecked drops the workflow check's answer for a worker the catalog
// no longer has (err is not a refusal of its record).
func (n *Node) forgetChecked(id string, err error) {
	if err == catalog.ErrNotFound { //nolint:errorlint // the refusal itself, unwrapped
		return
	}
	n.mu.Lock()
	delete(n.checked, id)
	n.mu.Unlock()
}
