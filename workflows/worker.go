// Package workflows owns the durable lifecycle of workers: one long-lived
// entity workflow per worker (WorkerWorkflow) whose Updates are the lifecycle
// operations and whose Query is its state, and the cluster-wide recovery
// workflow (RecoveryWorkflow) that runs under a fixed ID so that only one
// recovery runs at a time. Side effects live in package activities.
package workflows

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// Names of the worker workflow's updates and query.
const (
	UpdateCreate   = "create"
	UpdateStart    = "start"
	UpdateStop     = "stop"
	UpdateLoadCode = "load_code"
	UpdateDelete   = "delete"
	QueryState     = "state"
)

// TaskQueue is where WorkManager nodes poll for workflow and activity tasks.
const TaskQueue = "workmanager"

// WorkflowID is the ID of a worker's entity workflow.
func WorkflowID(workerID string) string { return "workmanager-worker-" + workerID }

// Search attributes the workflow keeps up to date (register them in the
// Temporal server; the dev stack does).
var (
	SAWorkerID     = temporal.NewSearchAttributeKeyKeyword("WorkerId")
	SAWorkerTopic  = temporal.NewSearchAttributeKeyKeyword("WorkerTopic")
	SAWorkerGroup  = temporal.NewSearchAttributeKeyKeyword("WorkerGroup")
	SAWorkerStatus = temporal.NewSearchAttributeKeyKeyword("WorkerStatus")
	SAWorkerTenant = temporal.NewSearchAttributeKeyKeyword("WorkerTenant")
)

// WorkerInput starts (or continues) a worker's workflow.
type WorkerInput struct {
	State WorkerState
	// ContinueAsNewAfter forces a continue-as-new after this many updates in
	// one run (0: only when the server suggests it).
	ContinueAsNewAfter int
	// CreateTimeout ends a workflow that was started but never created (the
	// caller went away); 0 means 5 minutes.
	CreateTimeout time.Duration
	// Recovered marks a run that recovery started from a catalog record it
	// read before the start. The run re-reads the record first, holding
	// every update back meanwhile, and ends at once as deleted when the
	// record is gone: a delete that completed between recovery's read and
	// the start never brings the worker back.
	Recovered bool
}

// WorkerState is what the workflow knows and carries across continue-as-new.
type WorkerState struct {
	Worker  catalog.Worker
	Created bool
	Deleted bool
	// Seq numbers lifecycle events within a run (continue-as-new carries
	// it on; a run that recovery starts begins at 0 again, which is why
	// event ids also hold the run id).
	Seq int64
	// LastVersion is the highest code version number handed out, also by a
	// LoadCode that failed (its history entry may have been written): the
	// next LoadCode never uses a number twice.
	LastVersion int64
}

// CreateRequest is the argument of the create update.
type CreateRequest struct {
	Ref catalog.CodeRef
}

// errNotCreated ends a workflow that was started but never created.
var errNotCreated = errors.New("worker was never created")

type entity struct {
	st      WorkerState
	mu      workflow.Mutex
	updates int
	failed  error
}

// WorkerWorkflow is the entity workflow of one worker.
func WorkerWorkflow(ctx workflow.Context, in WorkerInput) (WorkerState, error) {
	e := &entity{st: in.State, mu: workflow.NewMutex(ctx)}
	reread := in.Recovered && workflow.GetVersion(ctx, "recovered-rereads-catalog", workflow.DefaultVersion, 1) == 1
	if reread {
		// Held before the update handlers exist, so that no update (not
		// even one delivered with the first task) acts on the stale record.
		if err := e.mu.Lock(ctx); err != nil {
			return e.st, err
		}
	}
	if err := workflow.SetQueryHandler(ctx, QueryState, func() (WorkerState, error) { return e.st, nil }); err != nil {
		return e.st, err
	}
	if err := e.registerUpdates(ctx); err != nil {
		return e.st, err
	}
	if reread {
		err := e.reread(ctx)
		e.mu.Unlock()
		if err != nil {
			return e.st, err
		}
	}
	if e.st.Created && !e.st.Deleted {
		e.upsertSearchAttributes(ctx)
	}
	if !e.st.Created {
		timeout := in.CreateTimeout
		if timeout == 0 {
			timeout = 5 * time.Minute
		}
		ok, err := workflow.AwaitWithTimeout(ctx, timeout, func() bool { return e.st.Created || e.failed != nil })
		if err != nil {
			return e.st, err
		}
		if !ok || e.failed != nil {
			_ = workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
			if e.failed != nil {
				return e.st, temporal.NewNonRetryableApplicationError("create failed: "+e.failed.Error(), "CreateFailed", nil)
			}
			return e.st, temporal.NewNonRetryableApplicationError(errNotCreated.Error(), "CreateFailed", nil)
		}
	}
	continueAsNew := func() bool {
		if workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			return true
		}
		return in.ContinueAsNewAfter > 0 && e.updates >= in.ContinueAsNewAfter
	}
	if err := workflow.Await(ctx, func() bool {
		return (e.st.Deleted || continueAsNew()) && workflow.AllHandlersFinished(ctx)
	}); err != nil {
		return e.st, err
	}
	if e.st.Deleted {
		return e.st, nil
	}
	next := in
	next.State = e.st
	return e.st, workflow.NewContinueAsNewError(ctx, WorkerWorkflow, next)
}

func (e *entity) registerUpdates(ctx workflow.Context) error {
	alive := func() error {
		switch {
		case e.st.Deleted:
			return failure.New(failure.NotFound, fmt.Sprintf("worker %s is deleted", e.st.Worker.ID))
		case !e.st.Created:
			return failure.New(failure.NotFound, fmt.Sprintf("worker %s is not created", e.st.Worker.ID))
		}
		return nil
	}
	handlers := []struct {
		name     string
		fn       any
		validate any
	}{
		{UpdateCreate, e.create, func(workflow.Context, CreateRequest) error {
			if e.st.Created || e.failed != nil {
				return failure.New(failure.AlreadyExists, fmt.Sprintf("worker %s already exists", e.st.Worker.ID))
			}
			return nil
		}},
		{UpdateStart, e.start, func(workflow.Context) error { return alive() }},
		{UpdateStop, e.stop, func(workflow.Context) error { return alive() }},
		{UpdateLoadCode, e.loadCode, func(_ workflow.Context, r catalog.CodeRef) error {
			if err := alive(); err != nil {
				return err
			}
			// An unpinned URL (CODE_URL_ALLOW_UNPINNED, checked by the API)
			// gets its SHA-256 when PrepareCode fetches it.
			if r.SHA256 == "" && r.SourceKind == "url" {
				return nil
			}
			if err := catalog.ValidateSHA256(r.SHA256); err != nil {
				return failure.New(failure.InvalidArgument, err.Error())
			}
			return nil
		}},
		{UpdateDelete, e.delete, func(workflow.Context) error { return alive() }},
	}
	for _, h := range handlers {
		if err := workflow.SetUpdateHandlerWithOptions(ctx, h.name, h.fn, workflow.UpdateHandlerOptions{Validator: h.validate}); err != nil {
			return err
		}
	}
	return nil
}

// activityCtx sets the options of lifecycle activities. Update handlers run
// on the workflow's root context, so options are set here, in the handler.
func activityCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        200 * time.Millisecond,
			BackoffCoefficient:     2,
			MaximumInterval:        10 * time.Second,
			MaximumAttempts:        8,
			NonRetryableErrorTypes: []string{failure.InvalidArgument},
		},
	})
}

var a *activities.Activities // method values name the activities

// eventID is a lifecycle event's id: unique for ever (the run id differs
// between every run, including one recovery starts after the worker's
// workflow was lost), and the same when an activity retries its emit.
func eventID(workflowID, runID string, seq int64, kind lifecycleevents.Kind) string {
	return fmt.Sprintf("%s/%s/%d/%s", workflowID, runID, seq, kind)
}

// event numbers the next lifecycle event of this run.
func (e *entity) event(ctx workflow.Context, kind lifecycleevents.Kind) activities.EventSpec {
	e.st.Seq++
	x := workflow.GetInfo(ctx).WorkflowExecution
	return activities.EventSpec{ID: eventID(x.ID, x.RunID, e.st.Seq, kind), Kind: kind}
}

// reread replaces the state's worker with the catalog's record, or marks
// the worker deleted when the catalog has none. The caller holds e.mu.
func (e *entity) reread(ctx workflow.Context) error {
	var ws []catalog.Worker
	if err := workflow.ExecuteActivity(activityCtx(ctx), a.GetWorkers, []string{e.st.Worker.ID}).Get(ctx, &ws); err != nil {
		return err
	}
	if len(ws) == 0 {
		workflow.GetLogger(ctx).Info("recovered worker was deleted meanwhile; not bringing it back", "worker_id", e.st.Worker.ID)
		e.st.Deleted = true
		return nil
	}
	e.st.Worker = ws[0]
	return nil
}

// lock serializes handlers. A handler that waited for the lock while the
// worker was deleted fails as NotFound instead of acting on it.
func (e *entity) lock(ctx workflow.Context) (func(), error) {
	if err := e.mu.Lock(ctx); err != nil {
		return nil, err
	}
	if e.st.Deleted {
		e.mu.Unlock()
		return nil, failure.New(failure.NotFound, fmt.Sprintf("worker %s is deleted", e.st.Worker.ID))
	}
	e.updates++
	return e.mu.Unlock, nil
}

func (e *entity) create(ctx workflow.Context, req CreateRequest) (catalog.Worker, error) {
	unlock, err := e.lock(ctx)
	if err != nil {
		return catalog.Worker{}, err
	}
	defer unlock()
	in, err := e.withCode(ctx, req.Ref, 1)
	if err != nil {
		e.failed = err
		return catalog.Worker{}, err
	}
	in.Worker.Status, in.Worker.CreatedAt = catalog.StatusRunning, in.Worker.UpdatedAt
	if applied, err := e.apply(ctx, in, e.event(ctx, lifecycleevents.Created), e.event(ctx, lifecycleevents.Started)); err != nil {
		if applied {
			e.undoCreate(ctx, in.Worker)
		}
		e.failed = err
		return catalog.Worker{}, err
	}
	e.st.Worker, e.st.Created = in.Worker, true
	e.upsertSearchAttributes(ctx)
	return in.Worker, nil
}

// withCode stores the code ref names (PrepareCode) and returns the change
// that makes it the worker's code version: the record and its history entry.
func (e *entity) withCode(ctx workflow.Context, ref catalog.CodeRef, version int64) (activities.ApplyInput, error) {
	err := workflow.ExecuteActivity(activityCtx(ctx), a.PrepareCode, activities.PrepareCodeInput{Worker: e.st.Worker, Ref: ref}).Get(ctx, &ref)
	if err != nil {
		return activities.ApplyInput{}, err
	}
	now := workflow.Now(ctx).UTC()
	w := e.st.Worker
	w.CodeVersion, w.CodeSHA256, w.UpdatedAt = version, ref.SHA256, now
	action := catalog.HistoryLoadCode
	switch {
	case ref.RollbackTo > 0:
		action = catalog.HistoryRollback
	case version == 1:
		action = catalog.HistoryCreate
	}
	return activities.ApplyInput{
		Worker: w,
		History: &catalog.HistoryEntry{Version: version, SHA256: ref.SHA256, SourceKind: ref.SourceKind, URL: ref.URL, CreatedAt: now,
			Actor: ref.Actor, Action: action, RollbackTo: ref.RollbackTo},
	}, nil
}

// undoCreate removes a worker whose create failed after Apply persisted and
// attached it (its events could not be published), so that a failed create
// leaves nothing behind: not in the catalog, not on any node.
func (e *entity) undoCreate(ctx workflow.Context, w catalog.Worker) {
	err := workflow.ExecuteActivity(activityCtx(ctx), a.Delete, activities.DeleteInput{Worker: w}).Get(ctx, nil)
	if err != nil {
		workflow.GetLogger(ctx).Error("failed create not undone; recovery will bring the worker back", "worker_id", w.ID, "err", err)
		return
	}
	e.syncNodes(ctx)
}

func (e *entity) setStatus(ctx workflow.Context, status catalog.Status, kind lifecycleevents.Kind) (catalog.Worker, error) {
	unlock, err := e.lock(ctx)
	if err != nil {
		return catalog.Worker{}, err
	}
	defer unlock()
	if e.st.Worker.Status == status {
		return e.st.Worker, nil // idempotent
	}
	w := e.st.Worker
	w.Status, w.UpdatedAt = status, workflow.Now(ctx).UTC()
	if _, err := e.apply(ctx, activities.ApplyInput{Worker: w}, e.event(ctx, kind)); err != nil {
		return catalog.Worker{}, err
	}
	e.st.Worker = w
	e.upsertSearchAttributes(ctx)
	return w, nil
}

func (e *entity) start(ctx workflow.Context) (catalog.Worker, error) {
	return e.setStatus(ctx, catalog.StatusRunning, lifecycleevents.Started)
}

func (e *entity) stop(ctx workflow.Context) (catalog.Worker, error) {
	return e.setStatus(ctx, catalog.StatusStopped, lifecycleevents.Stopped)
}

func (e *entity) loadCode(ctx workflow.Context, ref catalog.CodeRef) (catalog.Worker, error) {
	unlock, err := e.lock(ctx)
	if err != nil {
		return catalog.Worker{}, err
	}
	defer unlock()
	version := max(e.st.Worker.CodeVersion, e.st.LastVersion) + 1
	in, err := e.withCode(ctx, ref, version)
	if err != nil {
		return catalog.Worker{}, err
	}
	e.st.LastVersion = version
	if _, err := e.apply(ctx, in, e.event(ctx, lifecycleevents.CodeUpdated)); err != nil {
		return catalog.Worker{}, err
	}
	e.st.Worker = in.Worker
	return in.Worker, nil
}

func (e *entity) delete(ctx workflow.Context) error {
	unlock, err := e.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	ev := e.event(ctx, lifecycleevents.Deleted)
	if err := workflow.ExecuteActivity(activityCtx(ctx), a.Delete, activities.DeleteInput{Worker: e.st.Worker}).Get(ctx, nil); err != nil {
		return err
	}
	e.syncNodes(ctx)
	if err := workflow.ExecuteActivity(emitCtx(ctx), a.Emit, activities.EmitInput{Worker: e.st.Worker, Events: []activities.EventSpec{ev}}).Get(ctx, nil); err != nil {
		return err
	}
	e.st.Deleted = true
	return nil
}

// apply persists a change and applies it on the node that runs Apply, then
// on every other live node, and only then publishes its lifecycle events: a
// consumer that sees "stopped" can rely on no node running the worker any
// more. applied tells whether the change was persisted, also when a later
// step failed.
func (e *entity) apply(ctx workflow.Context, in activities.ApplyInput, events ...activities.EventSpec) (applied bool, err error) {
	if err := workflow.ExecuteActivity(activityCtx(ctx), a.Apply, in).Get(ctx, nil); err != nil {
		if workflow.GetVersion(ctx, "apply-failure-reads-record", workflow.DefaultVersion, 1) == workflow.DefaultVersion {
			return false, err
		}
		if !e.persisted(ctx, in.Worker) {
			// Not made. Apply may have changed its node before failing (it
			// attaches the new code before it writes the history and the
			// record): every node goes back to the record, so that no node
			// runs a change the API reported as failed.
			if workflow.GetVersion(ctx, "apply-failure-resyncs-nodes", workflow.DefaultVersion, 1) == 1 {
				e.syncNodes(ctx)
			}
			return false, err
		}
		// The record was saved, only the answer was lost: the change is
		// made, and is finished (nodes, events) like any other.
		workflow.GetLogger(ctx).Warn("Apply failed after the record was saved; finishing the change", "worker_id", in.Worker.ID, "err", err)
	}
	e.syncNodes(ctx)
	return true, workflow.ExecuteActivity(emitCtx(ctx), a.Emit, activities.EmitInput{Worker: in.Worker, Events: events}).Get(ctx, nil)
}

// persisted reports whether the catalog holds exactly w (the change Apply
// was asked to save). An unreadable catalog counts as not persisted.
func (e *entity) persisted(ctx workflow.Context, w catalog.Worker) bool {
	var ws []catalog.Worker
	if err := workflow.ExecuteActivity(activityCtx(ctx), a.GetWorkers, []string{w.ID}).Get(ctx, &ws); err != nil || len(ws) != 1 {
		return false
	}
	got := ws[0]
	return got.Status == w.Status && got.CodeVersion == w.CodeVersion && got.CodeSHA256 == w.CodeSHA256 && got.UpdatedAt.Equal(w.UpdatedAt)
}

// emitCtx retries publishing until the broker takes the events: the change
// is already persisted, so its events must not be dropped (their ids are
// deterministic, so retries cannot duplicate them for a consumer that
// deduplicates).
func emitCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second,
			MaximumAttempts: 0, // until it succeeds
		},
	})
}

// NodeTaskQueue is the task queue that only node nodeID polls: an activity
// scheduled there runs on that node.
func NodeTaskQueue(nodeID string) string { return TaskQueue + "-node-" + nodeID }

// syncNodes runs Activate (make this node match the persisted record) on
// every live node's own task queue, after the change was persisted and
// applied on the node that ran Apply. A node that does not answer in time is
// logged and skipped, never fails the update: the change is persisted, and
// the node's periodic reconcile (or its recovery when it comes back) applies
// it.
func (e *entity) syncNodes(ctx workflow.Context) {
	log := workflow.GetLogger(ctx)
	lctx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, MaximumAttempts: 3},
	})
	var nodes []string
	if err := workflow.ExecuteActivity(lctx, a.ListNodes).Get(ctx, &nodes); err != nil {
		log.Warn("cluster members unknown; other nodes catch up by reconcile", "err", err)
		return
	}
	futures := make([]workflow.Future, len(nodes))
	for i, n := range nodes {
		nctx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			TaskQueue: NodeTaskQueue(n),
			// A live node polls its queue all the time; one that does not
			// pick the task up quickly is gone or stuck.
			ScheduleToStartTimeout: 5 * time.Second,
			StartToCloseTimeout:    20 * time.Second,
			RetryPolicy: &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, MaximumAttempts: 2,
				NonRetryableErrorTypes: []string{failure.InvalidArgument}},
		})
		futures[i] = workflow.ExecuteActivity(nctx, a.Activate, e.st.Worker.ID)
	}
	for i, f := range futures {
		if err := f.Get(ctx, nil); err != nil {
			log.Warn("node did not apply the change; it catches up by reconcile", "node_id", nodes[i], "err", err)
		}
	}
}

func (e *entity) upsertSearchAttributes(ctx workflow.Context) {
	w := e.st.Worker
	err := workflow.UpsertTypedSearchAttributes(ctx,
		SAWorkerID.ValueSet(w.ID), SAWorkerTopic.ValueSet(w.Topic),
		SAWorkerGroup.ValueSet(w.Group), SAWorkerStatus.ValueSet(string(w.Status)), SAWorkerTenant.ValueSet(w.TenantName()))
	if err != nil {
		workflow.GetLogger(ctx).Warn("upsert search attributes", "err", err)
	}
}
