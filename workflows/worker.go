// Package workflows owns the durable lifecycle of workers: one long-lived
// entity workflow per worker (WorkerWorkflow) whose Updates are the lifecycle
// operations and whose Query is its state, and the cluster-wide recovery
// workflow (RecoveryWorkflow) that runs under a fixed ID so that only one
// recovery runs at a time. Side effects live in package activities.
package workflows

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
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
	// the start never brings the worker back. A continue-as-new clears
	// it: the record was read once, and a later run that re-read it would
	// only hold updates back (and fail on a short state-store outage).
	Recovered bool
	// CreateID names the request that started this run: only a create
	// update carrying the same id may create the worker, so the code that
	// runs is that of the request whose start input (topic, name, request
	// id) the run holds, never that of a request that joined the run. ""
	// (runs started before it existed, and recovery's): any create.
	CreateID string
	// Epoch 1 and later: the run was started by code that knows every
	// change in versionedChanges, so each of them is at its version 1
	// without a GetVersion call — which would record a marker and upsert
	// the TemporalChangeVersion search attribute, two history events and a
	// visibility write per change, three in a create. 0: a run started
	// before epochs existed calls GetVersion, as it did. (A run of epoch 1
	// that older code began, during an upgrade, has markers the newer code
	// does not ask for: the SDK skips version markers and their upserts in
	// its determinism check, and the older code took version 1 too.)
	// Epochs 2 and 3 change commands as well (CurrentEpoch).
	Epoch int
}

// CurrentEpoch is the Epoch of the runs this code starts (a create,
// recovery, continue-as-new). Epoch 2: the fan-out after a change skips
// the node that made it (skipApplier), PrepareCode runs as a local
// activity first (prepare), and a create's timeout timer is cancelled once
// the create is done (awaitCreate). Epoch 3: a run continues as new no
// sooner than MinRunAge after it started (awaitRunEnd). Epoch 4: a create
// sent with the start sets no timer (awaitCreate), and only the search
// attributes that differ from the run's are upserted
// (upsertSearchAttributes: the API starts a create with the status it
// will have; unsetStartStatus takes it off again when the create fails).
// Epoch 5: Apply runs first as a local activity (runApply). Epoch 6: so
// does a delete's Delete (runDelete).
const CurrentEpoch = 6

// MinRunAge is the least time a run of epoch 3 or later lives before it
// continues as new. Temporal enforces a minimal interval between the runs
// of one workflow id (history.workflowIdReuseMinimalInterval, 1 s by
// default): a run continued as new sooner gets its first workflow task
// only that long after its predecessor's execution time, which itself
// moves on by the interval with every short run. A burst of updates on a
// small WORKMANAGER_CONTINUE_AS_NEW_AFTER made runs of 30 ms each, and the
// seventh had its first task 5.4 s after it began (every update held
// meanwhile; some timed out). A cluster whose interval is raised above
// this needs the same of us (docs/architecture.md).
const MinRunAge = time.Second

// skipApplier is the node whose Activate a change's fan-out (syncNodes)
// leaves out: the one whose Apply or Delete made the change, and so
// already matches the record (activities.Applied), in runs of epoch 2 and
// later. On one node this takes the fan-out's activity, and the workflow
// task after it, off every lifecycle call. A run of an older epoch asks
// every node, as it did (its history has that node's Activate).
func (e *entity) skipApplier(done activities.Applied) string {
	if e.epoch >= 2 {
		return done.Node
	}
	return ""
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
	// LoadCode that failed. Such a load's number is taken again by the next
	// LoadCode (its history entry, if written, is replaced and never shown:
	// catalog.History shows the versions the record reached); runs from
	// before that never used a number twice.
	LastVersion int64
	// LastRevision is the highest record revision handed out
	// (catalog.Worker.Revision), also by a change that failed: every Apply
	// writes a new one, so a late attempt of an older change is refused
	// by the catalog.
	LastRevision int64
	// CreateFailed tells that this run's create failed: the run ends, and
	// the worker id is free for a new create once it has ended.
	CreateFailed bool
	// Unsynced is the lifecycle event of the last change that is persisted
	// but that a live node did not apply (a failure event was published
	// instead of it); "" when every node applied every change. A repeated
	// stop or start tries those nodes again and publishes it once true.
	Unsynced lifecycleevents.Kind
	// Unannounced are the events (stopped, code_updated) of the persisted
	// changes that a live node did not apply, still true of the record
	// and not published yet, oldest first. The next change that every
	// live node applies publishes them with its own event (the fan-out
	// brings every node to the whole record), and a repeated stop tries
	// the nodes again until "stopped" is published: a stop answered OK
	// always has its event. A start drops a pending "stopped" (no longer
	// true); a LoadCode a pending "code_updated" (its own says more).
	Unannounced []lifecycleevents.Kind `json:",omitempty"`
}

// CreateRequest is the argument of the create update.
type CreateRequest struct {
	Ref catalog.CodeRef
	// CreateID must be the run's WorkerInput.CreateID (when that is set).
	CreateID string
}

// NotApplied is the application error type of a change that is persisted
// but that a live node did not apply: its lifecycle event was not
// published (an error event says which node failed); the node applies it
// at its next reconcile, or when the operation is repeated.
const NotApplied = "NotApplied"

// ContinueAsNewDue is the application error type (retryable) with which
// the validators refuse an update once the run is due to continue as new:
// the updates in flight finish, the run continues as new, and the caller
// sends the update again, to the new run (services/api does).
const ContinueAsNewDue = "ContinueAsNewDue"

// errNotCreated ends a workflow that was started but never created.
var errNotCreated = errors.New("worker was never created")

type entity struct {
	st       WorkerState
	mu       workflow.Mutex
	updates  int
	failed   error
	createID string
	// canAfter is WorkerInput.ContinueAsNewAfter.
	canAfter int
	// epoch is WorkerInput.Epoch.
	epoch int
	// aged: the run wants to continue as new and is MinRunAge old
	// (awaitRunEnd; epoch 3 and later).
	aged bool
	// createBegun: the create update's handler has begun (awaitCreate).
	createBegun bool
}

// version is the version of changeID in this run: for a run of epoch 1
// or later (WorkerInput.Epoch) version 1, the version GetVersion gives a
// run that starts with this code, without its marker and search attribute
// upsert; for older runs GetVersion's. Every change here was introduced
// before epoch 1 with versions DefaultVersion and 1; a later change calls
// workflow.GetVersion itself (or comes with the next epoch).
func (e *entity) version(ctx workflow.Context, changeID string) workflow.Version {
	if e.epoch >= 1 {
		return 1
	}
	return workflow.GetVersion(ctx, changeID, workflow.DefaultVersion, 1)
}

// awaitCreate waits until the create has succeeded or failed, for at most
// timeout; ok is false when the timeout passed first. In runs of epoch 2
// the timeout's timer is cancelled once the create is done: the SDK's
// AwaitWithTimeout (as older runs use it) leaves it to fire, a workflow
// task with nothing to do, CreateTimeout (5 min) after every create.
func (e *entity) awaitCreate(ctx workflow.Context, timeout time.Duration) (ok bool, err error) {
	done := func() bool { return e.st.Created || e.failed != nil }
	if e.epoch < 2 {
		return workflow.AwaitWithTimeout(ctx, timeout, done)
	}
	if e.epoch >= 4 {
		// A create sent with the start (UpdateWithStart, as the API
		// does) has its handler begun by the first workflow task: its
		// coroutine was made when the handlers were registered, so it
		// runs before this one's (made now). Such a run needs no
		// timer (two history events and a timer task a create): the
		// handler ends one way or the other, and a timeout would wait
		// for it all the same (WorkerWorkflow). The timer is for a run
		// whose create never came.
		yielded := false
		workflow.Go(ctx, func(workflow.Context) { yielded = true })
		if err := workflow.Await(ctx, func() bool { return yielded }); err != nil {
			return false, err
		}
		if e.createBegun {
			if err := workflow.Await(ctx, done); err != nil {
				return false, err
			}
			return true, nil
		}
	}
	tctx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	timer := workflow.NewTimer(tctx, timeout)
	if err := workflow.Await(ctx, func() bool { return done() || timer.IsReady() }); err != nil {
		return false, err
	}
	return done(), nil
}

// WorkerWorkflow is the entity workflow of one worker.
func WorkerWorkflow(ctx workflow.Context, in WorkerInput) (WorkerState, error) {
	e := &entity{st: in.State, mu: workflow.NewMutex(ctx), createID: in.CreateID, canAfter: in.ContinueAsNewAfter, epoch: in.Epoch}
	if e.st.Unsynced != "" && len(e.st.Unannounced) == 0 {
		// Carried from a run that knew only Unsynced.
		e.st.Unannounced = []lifecycleevents.Kind{e.st.Unsynced}
	}
	reread := in.Recovered && e.version(ctx, "recovered-rereads-catalog") == 1
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
		ok, err := e.awaitCreate(ctx, timeout)
		if err != nil {
			return e.st, err
		}
		if !ok || e.failed != nil {
			_ = workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
			e.unsetStartStatus(ctx)
			// A create that was still running when the timeout passed (an
			// Emit waiting out a broker outage) and then succeeded made a
			// worker that is served: its workflow lives on to manage it.
			outlasted := e.failed == nil && e.st.Created &&
				e.version(ctx, "create-outlasting-timeout-lives") == 1
			if !outlasted {
				if e.failed != nil {
					return e.st, temporal.NewNonRetryableApplicationError("create failed: "+e.failed.Error(), "CreateFailed", nil)
				}
				return e.st, temporal.NewNonRetryableApplicationError(errNotCreated.Error(), "CreateFailed", nil)
			}
		}
	}
	if err := e.awaitRunEnd(ctx); err != nil {
		return e.st, err
	}
	if e.st.Deleted {
		return e.st, nil
	}
	next := in
	next.State, next.Recovered, next.Epoch = e.st, false, CurrentEpoch
	return e.st, workflow.NewContinueAsNewError(ctx, WorkerWorkflow, next)
}

// unsetStartStatus takes the WorkerStatus a run of epoch 4 or later was
// started with (the API sets what a created worker has) off a run whose
// create failed or never came, as older runs never had it: a query for
// running workers does not list it.
func (e *entity) unsetStartStatus(ctx workflow.Context) {
	if e.epoch < 4 || e.st.Created {
		return
	}
	if _, ok := workflow.GetTypedSearchAttributes(ctx).GetKeyword(SAWorkerStatus); !ok {
		return
	}
	if err := workflow.UpsertTypedSearchAttributes(ctx, SAWorkerStatus.ValueUnset()); err != nil {
		workflow.GetLogger(ctx).Warn("unset search attribute", "err", err)
	}
}

// awaitRunEnd waits until the run is to end: its worker deleted, or the
// run due to continue as new (continueAsNewDue), and no handler running.
// From epoch 3 on a run that would continue as new younger than MinRunAge
// first waits until it is that old (a timer, only then), taking updates
// meanwhile; from then on the validators refuse new ones.
func (e *entity) awaitRunEnd(ctx workflow.Context) error {
	if e.epoch < 3 {
		return workflow.Await(ctx, func() bool {
			return (e.st.Deleted || e.continueAsNewDue(ctx)) && workflow.AllHandlersFinished(ctx)
		})
	}
	if err := workflow.Await(ctx, func() bool { return e.st.Deleted || e.continueAsNewWanted(ctx) }); err != nil {
		return err
	}
	if !e.st.Deleted {
		if wait := MinRunAge - workflow.Now(ctx).Sub(workflow.GetInfo(ctx).WorkflowStartTime); wait > 0 {
			tctx, cancel := workflow.WithCancel(ctx)
			timer := workflow.NewTimer(tctx, wait)
			err := workflow.Await(ctx, func() bool { return e.st.Deleted || timer.IsReady() })
			cancel()
			if err != nil {
				return err
			}
		}
		e.aged = true
	}
	return workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
}

// continueAsNewDue tells that the run is to continue as new: it is wanted
// (continueAsNewWanted) and, from epoch 3 on, the run is MinRunAge old
// (awaitRunEnd). It does so once no handler runs; meanwhile the validators
// refuse new updates (ContinueAsNewDue), so that a steady stream of
// updates cannot postpone it without end.
func (e *entity) continueAsNewDue(ctx workflow.Context) bool {
	if e.epoch >= 3 {
		return e.aged
	}
	return e.continueAsNewWanted(ctx)
}

// continueAsNewWanted: the server suggests continuing as new, or the run
// handled its ContinueAsNewAfter updates.
func (e *entity) continueAsNewWanted(ctx workflow.Context) bool {
	if workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
		return true
	}
	return e.canAfter > 0 && e.updates >= e.canAfter
}

func (e *entity) registerUpdates(ctx workflow.Context) error {
	// Validators do not run on replay, so what they refuse may change
	// without a version.
	alive := func(ctx workflow.Context) error {
		switch {
		case e.st.Deleted:
			return failure.New(failure.NotFound, fmt.Sprintf("worker %s is deleted", e.st.Worker.ID))
		case !e.st.Created:
			return failure.New(failure.NotFound, fmt.Sprintf("worker %s is not created", e.st.Worker.ID))
		case e.continueAsNewDue(ctx):
			return temporal.NewApplicationError(fmt.Sprintf("worker %s: its workflow is continuing as new; send the update again", e.st.Worker.ID), ContinueAsNewDue)
		}
		return nil
	}
	handlers := []struct {
		name     string
		fn       any
		validate any
	}{
		{UpdateCreate, e.create, func(_ workflow.Context, r CreateRequest) error {
			if e.st.Created || e.failed != nil {
				return failure.New(failure.AlreadyExists, fmt.Sprintf("worker %s already exists", e.st.Worker.ID))
			}
			if e.createID != "" && r.CreateID != e.createID {
				return failure.New(failure.AlreadyExists, fmt.Sprintf("worker %s is being created by another request", e.st.Worker.ID))
			}
			return nil
		}},
		{UpdateStart, e.start, func(ctx workflow.Context) error { return alive(ctx) }},
		{UpdateStop, e.stop, func(ctx workflow.Context) error { return alive(ctx) }},
		{UpdateLoadCode, e.loadCode, func(ctx workflow.Context, r catalog.CodeRef) error {
			if err := alive(ctx); err != nil {
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
		{UpdateDelete, e.delete, func(ctx workflow.Context) error { return alive(ctx) }},
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

// applyCtx is activityCtx for Apply, which heartbeats while it works
// (activities.Apply): Apply goes to any node polling the shared task
// queue, and a node paused or frozen with a poll open can be handed the
// task and never run it. The attempt then fails within ApplyHeartbeat
// instead of the whole minute, and its retry goes to a node that polls (a
// paused node held a stop's Apply for 61 s on a busy CI machine).
func applyCtx(ctx workflow.Context) workflow.Context {
	ctx = activityCtx(ctx)
	o := workflow.GetActivityOptions(ctx)
	o.HeartbeatTimeout = ApplyHeartbeat
	o.StartToCloseTimeout = ApplyTimeout
	return workflow.WithActivityOptions(ctx, o)
}

// ApplyTimeout bounds one attempt of Apply, which loads the code on its
// node: longer than the longest engine load (.NET's 120 s compile and
// host start, engines/dotnet.DefaultLoadTimeout; issue 43 item 13: with
// the one minute of the other activities, a slow .NET load failed every
// attempt). A paused node is noticed within ApplyHeartbeat anyway. The
// timeout is not part of what replay compares (activity type and id), so
// histories recorded with one minute replay unchanged.
const ApplyTimeout = 3 * time.Minute

// ApplyHeartbeat is how long Apply may go without a heartbeat (it sends
// one every 2 s while it works), as ActivateHeartbeat.
const ApplyHeartbeat = 20 * time.Second

// prepareCtx is activityCtx with room for an engine's load check: a .NET
// compile may take up to its engine's 120 s load timeout. PrepareCode
// heartbeats like Apply and goes to any node as well: an attempt handed to
// a node that is then paused or cut off from Temporal fails within
// ApplyHeartbeat, not after the whole 3 minutes (a LoadCode of the
// 60-minute soak waited 3 min for such an attempt; docs/reliability.md,
// finding 12).
func prepareCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(activityCtx(ctx), workflow.ActivityOptions{
		StartToCloseTimeout: PrepareTimeout,
		HeartbeatTimeout:    ApplyHeartbeat,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        200 * time.Millisecond,
			BackoffCoefficient:     2,
			MaximumInterval:        10 * time.Second,
			MaximumAttempts:        8,
			NonRetryableErrorTypes: prepareRefusals,
		},
	})
}

// PrepareTimeout bounds one attempt of PrepareCode (a fetch, a .NET
// compile).
const PrepareTimeout = 3 * time.Minute

// prepareRefusals are the failures of PrepareCode that no retry, on any
// node, turns into a success: the code or the call is refused.
var prepareRefusals = []string{failure.InvalidArgument, failure.PermissionDenied, failure.AlreadyExists}

// prepareLocalCtx runs PrepareCode once as a local activity.
func prepareLocalCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: PrepareTimeout,
		StartToCloseTimeout:    PrepareTimeout,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1, NonRetryableErrorTypes: prepareRefusals},
	})
}

// prepare runs PrepareCode. In runs of epoch 2 (CurrentEpoch) it runs
// first as a local activity, once, on the node that runs the workflow
// task: no activity task to dispatch and no workflow task after it, which
// takes about a tenth off a create, a LoadCode and a rollback. The code's
// refusal (prepareRefusals) is the answer; any other failure (the store
// not answering, a node that cannot check this code, a fetch cut off) is
// left to the PrepareCode activity, which any node may run and which is
// retried as before: a check that fails on one node may pass on another
// (issue 43 item 13). Older runs run the activity only, as their history
// has it.
func (e *entity) prepare(ctx workflow.Context, in activities.PrepareCodeInput) (catalog.CodeRef, error) {
	var ref catalog.CodeRef
	if e.epoch >= 2 {
		err := workflow.ExecuteLocalActivity(prepareLocalCtx(ctx), a.PrepareCode, in).Get(ctx, &ref)
		if localAnswered(err, prepareRefusals) {
			return ref, err
		}
		workflow.GetLogger(ctx).Warn("code not prepared on this node; the PrepareCode activity goes on trying", "worker_id", in.Worker.ID, "err", err)
	}
	err := workflow.ExecuteActivity(prepareCtx(ctx), a.PrepareCode, in).Get(ctx, &ref)
	return ref, err
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

// rereadCtx retries reading the record until the store answers: a run that
// failed on a short state-store outage would leave a live worker without a
// workflow (Stop and Delete NOT_FOUND). Updates wait meanwhile.
func rereadCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 30 * time.Second,
			MaximumAttempts: 0, // until it succeeds
		},
	})
}

// reread replaces the state's worker with the catalog's record, or marks
// the worker deleted when the catalog has none. The caller holds e.mu.
func (e *entity) reread(ctx workflow.Context) error {
	var ws []catalog.Worker
	if err := workflow.ExecuteActivity(rereadCtx(ctx), a.GetWorkers, []string{e.st.Worker.ID}).Get(ctx, &ws); err != nil {
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
	e.createBegun = true
	unlock, err := e.lock(ctx)
	if err != nil {
		return catalog.Worker{}, err
	}
	defer unlock()
	// A create queued behind another one (accepted while that one ran)
	// must not run: the worker exists, or that create failed and the run
	// is ending.
	if (e.st.Created || e.failed != nil) && e.version(ctx, "create-rechecks-after-lock") == 1 {
		return catalog.Worker{}, failure.New(failure.AlreadyExists, fmt.Sprintf("worker %s already exists", e.st.Worker.ID))
	}
	in, err := e.withCodeFor(ctx, req.Ref, 1, true)
	if err != nil {
		e.failed, e.st.CreateFailed = err, true
		return catalog.Worker{}, err
	}
	in.Worker.Status, in.Worker.CreatedAt = catalog.StatusRunning, in.Worker.UpdatedAt
	// The worker's incarnation is this run: its tombstone never lets a late
	// write of this create back, while a create in a new run may follow a
	// failed one. Versioned: a run created before incarnations replays
	// without one, as its record was written ("" never conflicts with "").
	if e.version(ctx, "worker-incarnation") == 1 {
		in.Worker.Incarnation = workflow.GetInfo(ctx).WorkflowExecution.RunID
	}
	e.revise(&in.Worker)
	in.History.Revision = in.Worker.Revision
	if applied, err := e.apply(ctx, in, e.event(ctx, lifecycleevents.Created), e.event(ctx, lifecycleevents.Started)); err != nil {
		// Not applied: the record was read back and is not there, but an
		// attempt of Apply still running (its node paused) may write it
		// later; the undo's tombstone refuses that write.
		if applied || e.version(ctx, "failed-create-always-undone") == 1 {
			e.undoCreate(ctx, in.Worker)
		}
		e.failed, e.st.CreateFailed = err, true
		return catalog.Worker{}, err
	}
	e.st.Worker, e.st.Created = in.Worker, true
	e.upsertSearchAttributes(ctx)
	return in.Worker, nil
}

// withCode stores the code ref names (PrepareCode) and returns the change
// that makes it the worker's code version: the record and its history entry.
func (e *entity) withCode(ctx workflow.Context, ref catalog.CodeRef, version int64) (activities.ApplyInput, error) {
	return e.withCodeFor(ctx, ref, version, false)
}

// withCodeFor is withCode; create tells PrepareCode that the worker must not
// have a record yet (a create never writes over a live worker whose
// workflow was lost).
func (e *entity) withCodeFor(ctx workflow.Context, ref catalog.CodeRef, version int64, create bool) (activities.ApplyInput, error) {
	ref, err := e.prepare(ctx, activities.PrepareCodeInput{Worker: e.st.Worker, Ref: ref, Create: create})
	if err != nil {
		return activities.ApplyInput{}, err
	}
	now := workflow.Now(ctx).UTC()
	w := e.st.Worker
	w.CodeVersion, w.CodeSHA256, w.UpdatedAt = version, ref.SHA256, now
	if ref.GroupKey != nil {
		// LoadCode's new group key (data only: no command changes).
		w.GroupKey = *ref.GroupKey
	}
	action := catalog.HistoryLoadCode
	switch {
	case ref.RollbackTo > 0:
		action = catalog.HistoryRollback
	case version == 1:
		action = catalog.HistoryCreate
	}
	h := &catalog.HistoryEntry{Version: version, SHA256: ref.SHA256, SourceKind: ref.SourceKind, URL: ref.URL, CreatedAt: now,
		Actor: ref.Actor, Action: action, RollbackTo: ref.RollbackTo, GroupKey: w.GroupKey}
	if action == catalog.HistoryCreate {
		// Only an activity's input: no command changes, replay-safe.
		h.Placement = w.Placement
	}
	return activities.ApplyInput{Worker: w, History: h}, nil
}

// undoCreate removes a worker whose create failed (Apply may have
// persisted and attached it, or may still), so that a failed create leaves
// nothing behind: not in the catalog (a tombstone of this incarnation
// instead), not on any node. It is retried until the store answers: a
// record left behind would be a worker the API reported as not created.
func (e *entity) undoCreate(ctx workflow.Context, w catalog.Worker) {
	err := workflow.ExecuteActivity(untilDoneCtx(ctx), a.Delete, activities.DeleteInput{Worker: w}).Get(ctx, nil)
	if err != nil {
		workflow.GetLogger(ctx).Error("failed create not undone; recovery will bring the worker back", "worker_id", w.ID, "err", err)
		return
	}
	e.syncNodes(ctx, "")
}

func (e *entity) setStatus(ctx workflow.Context, status catalog.Status, kind lifecycleevents.Kind) (catalog.Worker, error) {
	unlock, err := e.lock(ctx)
	if err != nil {
		return catalog.Worker{}, err
	}
	defer unlock()
	if e.st.Worker.Status == status {
		// The same change again. If its event was never published (a live
		// node did not apply it, and no change since reached every node),
		// try the nodes again: answered OK only with its event published.
		pending := e.stillTrue(e.st.Worker, nil)
		mine, before := slices.Contains(pending, kind), e.st.Unsynced == kind
		if (mine != before || (mine && len(pending) > 1)) &&
			e.version(ctx, announcedVersion) == 1 {
			if !mine {
				return e.st.Worker, nil
			}
			return e.st.Worker, e.announce(ctx, kind, pending)
		}
		if before {
			return e.st.Worker, e.resync(ctx, kind)
		}
		return e.st.Worker, nil // idempotent
	}
	w := e.st.Worker
	w.Status, w.UpdatedAt = status, workflow.Now(ctx).UTC()
	e.revise(&w)
	if _, err := e.apply(ctx, activities.ApplyInput{Worker: w}, e.event(ctx, kind)); err != nil {
		if isNotApplied(err) { // persisted: the workflow follows the record
			e.st.Worker = w
			e.upsertSearchAttributes(ctx)
		}
		return catalog.Worker{}, err
	}
	e.st.Worker = w
	e.upsertSearchAttributes(ctx)
	return w, nil
}

// resync runs the node fan-out again for a persisted change that a live
// node did not apply, and publishes its event once every live node has.
func (e *entity) resync(ctx workflow.Context, kind lifecycleevents.Kind) error {
	ev := e.event(ctx, kind)
	if err := e.reportNodes(ctx, e.st.Worker, kind, e.syncNodes(ctx, "")); err != nil {
		return err
	}
	e.st.Unsynced, e.st.Unannounced = "", nil
	return e.emit(ctx, activities.EmitInput{Worker: e.st.Worker, Events: []activities.EventSpec{ev}})
}

// announcedVersion versions publishing the events of Unannounced (issue
// 43 item 7): runs before it published the event of a change that a live
// node did not apply only when that same change was repeated right after.
const announcedVersion = "unannounced-events-published"

// announce is resync for the repeat of a change of kind whose event, with
// the others of pending (WorkerState.Unannounced still true of the
// record), was never published: it runs the node fan-out again and
// publishes them all once every live node has applied the record.
func (e *entity) announce(ctx workflow.Context, kind lifecycleevents.Kind, pending []lifecycleevents.Kind) error {
	evs := make([]activities.EventSpec, 0, len(pending))
	for _, k := range pending {
		evs = append(evs, e.event(ctx, k))
	}
	if err := e.reportNodes(ctx, e.st.Worker, kind, e.syncNodes(ctx, "")); err != nil {
		return err
	}
	e.st.Unsynced, e.st.Unannounced = "", nil
	return e.emit(ctx, activities.EmitInput{Worker: e.st.Worker, Events: evs})
}

// stillTrue is WorkerState.Unannounced without the events that w, the
// record, no longer bears out ("stopped" of a running worker) and those
// that the events of the change being made supersede (its own kind).
func (e *entity) stillTrue(w catalog.Worker, events []activities.EventSpec) []lifecycleevents.Kind {
	var out []lifecycleevents.Kind
	for _, k := range e.st.Unannounced {
		switch {
		case k == lifecycleevents.Stopped && w.Status != catalog.StatusStopped:
		case slices.ContainsFunc(events, func(ev activities.EventSpec) bool { return ev.Kind == k }):
		case slices.Contains(out, k):
		default:
			out = append(out, k)
		}
	}
	return out
}

func isNotApplied(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == NotApplied
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
	// A load that failed before its record was saved did not take its
	// number: this load takes it, and its history entry (of a higher
	// revision) replaces the failed one's, which was never shown.
	version := e.st.Worker.CodeVersion + 1
	if e.st.LastVersion >= version &&
		e.version(ctx, "failed-load-number-reused") == workflow.DefaultVersion {
		version = e.st.LastVersion + 1 // runs from before: a failed load's number was never used again
	}
	in, err := e.withCode(ctx, ref, version)
	if err != nil {
		return catalog.Worker{}, err
	}
	e.st.LastVersion = max(e.st.LastVersion, version)
	e.revise(&in.Worker)
	in.History.Revision = in.Worker.Revision
	if _, err := e.apply(ctx, in, e.event(ctx, lifecycleevents.CodeUpdated)); err != nil {
		if isNotApplied(err) { // persisted: the workflow follows the record
			e.st.Worker = in.Worker
		}
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
	done, err := e.runDelete(ctx, activities.DeleteInput{Worker: e.st.Worker})
	if err != nil {
		return err
	}
	failed := e.syncNodes(ctx, e.skipApplier(done))
	if len(failed) > 0 && e.version(ctx, "delete-failures-reported") == 1 {
		// The record is gone, so the deletion completes ("deleted" is
		// published), but the live nodes that did not detach the worker are
		// named in a not_applied error event; they detach it at their next
		// reconcile.
		_ = e.reportNodes(ctx, e.st.Worker, lifecycleevents.Deleted, failed)
	}
	if err := e.emit(ctx, activities.EmitInput{Worker: e.st.Worker, Events: []activities.EventSpec{ev}}); err != nil {
		return err
	}
	e.st.Deleted = true
	if e.version(ctx, "deleted-search-attribute") == 1 {
		// The closed workflow keeps its search attributes: a visibility
		// query on WorkerStatus must not list a deleted worker as RUNNING
		// (issue 44 item 6).
		if err := workflow.UpsertTypedSearchAttributes(ctx, SAWorkerStatus.ValueSet(StatusDeleted)); err != nil {
			workflow.GetLogger(ctx).Warn("upsert search attributes", "err", err)
		}
	}
	return nil
}

// StatusDeleted is the WorkerStatus search attribute of a deleted
// worker's (closed) workflow; the others carry the worker's status
// (RUNNING, STOPPED).
const StatusDeleted = "DELETED"

// apply persists a change and applies it on the node that runs Apply, then
// on every other live node, and only then publishes its lifecycle events: a
// consumer that sees "stopped" or "code_updated" can rely on no live node
// running the worker, or its old code, any more. When a live node did not
// apply such a change (after retries), its event is not published: an
// "error" event names the node, and the change fails as NotApplied (it is
// persisted; the node applies it at its next reconcile). applied tells
// whether the change was persisted, also when a later step failed.
func (e *entity) apply(ctx workflow.Context, in activities.ApplyInput, events ...activities.EventSpec) (applied bool, err error) {
	done, err := e.runApply(ctx, in)
	if err != nil {
		done = activities.Applied{} // no node is known to match: ask each
		if e.version(ctx, "apply-failure-reads-record") == workflow.DefaultVersion {
			return false, err
		}
		if !e.persisted(ctx, in.Worker) {
			// Not made. Apply may have changed its node before failing (it
			// attaches the new code before it writes the history and the
			// record): every node goes back to the record, so that no node
			// runs a change the API reported as failed.
			if e.version(ctx, "apply-failure-resyncs-nodes") == 1 {
				e.syncNodes(ctx, "")
			}
			return false, err
		}
		// The record was saved, only the answer was lost: the change is
		// made, and is finished (nodes, events) like any other.
		workflow.GetLogger(ctx).Warn("Apply failed after the record was saved; finishing the change", "worker_id", in.Worker.ID, "err", err)
	}
	failed := e.syncNodes(ctx, e.skipApplier(done))
	everywhere := len(failed) == 0
	if kind := strictKind(events); kind != "" && len(failed) > 0 &&
		e.version(ctx, "node-failures-reported") == 1 {
		if err := e.reportNodes(ctx, in.Worker, kind, failed); err != nil {
			e.st.Unsynced = kind
			e.st.Unannounced = append(e.stillTrue(in.Worker, events), kind)
			return true, err
		}
		everywhere = true // the nodes that failed have left the membership
	}
	e.st.Unsynced = ""
	// Every live node now runs the whole record: the events of earlier
	// changes held back for a node that did not apply them are true too.
	pending := e.stillTrue(in.Worker, events)
	e.st.Unannounced = pending
	if len(pending) > 0 && everywhere && e.version(ctx, announcedVersion) == 1 {
		held := make([]activities.EventSpec, 0, len(pending))
		for _, k := range pending {
			held = append(held, e.event(ctx, k))
		}
		events = append(held, events...)
		e.st.Unannounced = nil
	}
	return true, e.emit(ctx, activities.EmitInput{Worker: in.Worker, Events: events})
}

// runApply runs Apply. In runs of epoch 5 it runs first as a local
// activity, once, on the node that runs the workflow task, as PrepareCode
// does (prepare): no activity task to dispatch, and no workflow task
// after it, so a create, a stop, a start and a reload are each one
// workflow task (two before). Its refusal (InvalidArgument) is the
// answer; any other failure is left to the Apply activity, which any node
// may run and which is retried as before — one more attempt of a change
// that each attempt makes conditionally (the record's revision, the
// tombstone). A node paused in the local attempt loses the workflow task
// at its timeout, and another node runs it again (the paused node's late
// write is refused like a late activity attempt's). Older runs run the
// activity only, as their history has it.
func (e *entity) runApply(ctx workflow.Context, in activities.ApplyInput) (activities.Applied, error) {
	return e.localFirst(ctx, 5, "Apply", a.Apply, in, applyCtx(ctx), in.Worker.ID)
}

// runDelete runs Delete. In runs of epoch 6 it runs first as a local
// activity, once, on the node that runs the workflow task, as Apply does
// (runApply): a delete is then one workflow task, not an activity task
// and a second workflow task after it. A failure that no attempt
// changes (non-retryable) is the answer; any other is left to the Delete
// activity, retried on any node as before. Every step of Delete may run
// again (a late attempt of a paused node included): the code marked,
// the record removed, the not-recovered note cleared are the same after
// a second run. Older runs run the activity only, as their history has it.
func (e *entity) runDelete(ctx workflow.Context, in activities.DeleteInput) (activities.Applied, error) {
	return e.localFirst(ctx, 6, "Delete", a.Delete, in, activityCtx(ctx), in.Worker.ID)
}

// localFirst runs activity fn, named name (Apply, Delete), on in: in runs
// of epoch from or later once as a local activity first, whose success or
// refusal (applyRefusals, or any non-retryable failure) is the answer;
// otherwise, and in older runs, as an activity with actx's options.
func (e *entity) localFirst(ctx workflow.Context, from int, name string, fn, in any, actx workflow.Context, workerID string) (activities.Applied, error) {
	var done activities.Applied
	if e.epoch >= from {
		err := workflow.ExecuteLocalActivity(applyLocalCtx(ctx), fn, in).Get(ctx, &done)
		if localAnswered(err, applyRefusals) {
			return done, err
		}
		workflow.GetLogger(ctx).Warn(name+" not done on this node; the "+name+" activity goes on trying", "worker_id", workerID, "err", err)
		done = activities.Applied{}
	}
	err := workflow.ExecuteActivity(actx, fn, in).Get(ctx, &done)
	return done, err
}

// applyRefusals are the failures of Apply that are its answer.
var applyRefusals = []string{failure.InvalidArgument}

// applyLocalCtx runs Apply once as a local activity.
func applyLocalCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: ApplyTimeout,
		StartToCloseTimeout:    ApplyTimeout,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1, NonRetryableErrorTypes: applyRefusals},
	})
}

// localAnswered reports whether a local activity's outcome is the answer
// (success, cancellation, or a refusal no other node would turn into a
// success) rather than a failure to hand to the ordinary activity.
func localAnswered(err error, refusals []string) bool {
	var appErr *temporal.ApplicationError
	return err == nil || temporal.IsCanceledError(err) ||
		(errors.As(err, &appErr) && (appErr.NonRetryable() || slices.Contains(refusals, appErr.Type())))
}

// strictKind is the event among events that promises that no live node
// runs the old state (stopped, code_updated), or "".
func strictKind(events []activities.EventSpec) lifecycleevents.Kind {
	for _, ev := range events {
		if ev.Kind == lifecycleevents.Stopped || ev.Kind == lifecycleevents.CodeUpdated {
			return ev.Kind
		}
	}
	return ""
}

// reportNodes checks whether the nodes that did not apply a change of kind
// are still alive, in the cluster's membership (ListNodes): a node that left
// it serves nothing, and fences and reconciles before it serves again
// (services/reconcile.MemberGate), while a live member that is paused or
// stuck may still serve the old state. If some are alive, or the members
// could not be listed for the fan-out (node ""), it publishes an error event
// (error_type not_applied) naming them and returns a NotApplied error;
// otherwise nil.
func (e *entity) reportNodes(ctx workflow.Context, w catalog.Worker, kind lifecycleevents.Kind, failed []nodeFailure) error {
	if len(failed) == 0 {
		return nil
	}
	var alive []string
	if err := e.listNodes(ctx, &alive); err != nil {
		alive = nil // unknown: count every failed node as alive
		for _, f := range failed {
			alive = append(alive, f.node)
		}
	}
	var ids, details []string
	unknown := false
	for _, f := range failed {
		switch {
		case f.node == "":
			unknown = true
			details = append(details, fmt.Sprintf("cluster members: %v", f.err))
		case slices.Contains(alive, f.node):
			ids = append(ids, f.node)
			details = append(details, fmt.Sprintf("node %s: %v", f.node, f.err))
		}
	}
	if len(ids) == 0 && !unknown {
		return nil
	}
	what := fmt.Sprintf("live node(s) %s did not apply it", strings.Join(ids, ", "))
	if unknown {
		what = "the live nodes could not be listed to apply it on each"
	}
	// The API shows msg to the caller; the nodes' errors go to the event
	// (for operators) and the log only.
	msg := fmt.Sprintf("worker %s: the change is persisted but %s, so %q is not announced; they apply it at their next reconcile (or repeat the operation)",
		w.ID, what, kind)
	if kind == lifecycleevents.Deleted {
		msg = fmt.Sprintf("worker %s is deleted, but %s; they detach it at their next reconcile", w.ID, what)
	}
	workflow.GetLogger(ctx).Warn("change not applied on every live node", "worker_id", w.ID, "kind", kind, "nodes", details)
	ev := e.event(ctx, lifecycleevents.Error)
	ev.ErrorType, ev.ErrorMessage = "not_applied", msg+": "+strings.Join(details, "; ")
	if err := e.emit(ctx, activities.EmitInput{Worker: w, Events: []activities.EventSpec{ev}}); err != nil {
		workflow.GetLogger(ctx).Warn("failure event not published", "worker_id", w.ID, "err", err)
	}
	return temporal.NewNonRetryableApplicationError(msg, NotApplied, nil)
}

// persisted reports whether the catalog holds exactly w (the change Apply
// was asked to save). The read is retried until the store answers: a
// guess would finish a change that was not made, or abandon one that was
// (a failed create left served).
func (e *entity) persisted(ctx workflow.Context, w catalog.Worker) bool {
	var ws []catalog.Worker
	if err := workflow.ExecuteActivity(untilDoneCtx(ctx), a.GetWorkers, []string{w.ID}).Get(ctx, &ws); err != nil || len(ws) != 1 {
		return false
	}
	got := ws[0]
	return got.Status == w.Status && got.CodeVersion == w.CodeVersion && got.CodeSHA256 == w.CodeSHA256 && got.UpdatedAt.Equal(w.UpdatedAt)
}

// revise gives w the next record revision (catalog.Worker.Revision).
func (e *entity) revise(w *catalog.Worker) {
	e.st.LastRevision = max(e.st.Worker.Revision, e.st.LastRevision) + 1
	w.Revision = e.st.LastRevision
}

// untilDoneCtx is activityCtx retried until the activity succeeds (or fails
// for good), for the state-store reads and writes a change cannot be left
// without.
func untilDoneCtx(ctx workflow.Context) workflow.Context {
	ctx = activityCtx(ctx)
	o := workflow.GetActivityOptions(ctx)
	p := *o.RetryPolicy
	p.MaximumAttempts, p.MaximumInterval = 0, 30*time.Second
	p.NonRetryableErrorTypes = append(slices.Clone(p.NonRetryableErrorTypes), activities.StaleWrite)
	o.RetryPolicy = &p
	return workflow.WithActivityOptions(ctx, o)
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

// localVersion versions running ListNodes and Emit as local activities
// (issue 48 item 2). A lifecycle change waits for nothing after its answer,
// but each activity it schedules on the server costs two tasks of the
// history shard's transfer queue (the activity's, then the workflow task
// its completion schedules), and Temporal reads that queue at most
// history.transferProcessorMaxPollRPS times a second per shard (20 by
// default; the dev server has one shard): calls issued back to back
// spent that budget, so each waited about 50 ms a task, ~400 ms a stop.
// A local activity runs inside the workflow task on the node that runs
// it, recorded as a marker: no transfer task. Apply and PrepareCode (any
// node, heartbeated) and Activate (each node's own queue) stay activities.
const localVersion = "local-list-and-emit"

// local tells whether this run takes localVersion.
func (e *entity) local(ctx workflow.Context) bool {
	return e.version(ctx, localVersion) == 1
}

// listNodes runs ListNodes (a local activity since localVersion) into out.
func (e *entity) listNodes(ctx workflow.Context, out *[]string) error {
	if e.local(ctx) {
		return workflow.ExecuteLocalActivity(listLocalCtx(ctx), a.ListNodes).Get(ctx, out)
	}
	return workflow.ExecuteActivity(listCtx(ctx), a.ListNodes).Get(ctx, out)
}

// emit publishes lifecycle events with Emit. Since localVersion it runs as
// a local activity first, a few quick attempts on the node that runs the
// workflow task; events still not published then (a broker outage, that
// node's daprd down) are left to the Emit activity, which any node may
// run, retried until it succeeds as before (emitCtx): no event is dropped,
// and the workflow task is not held open for the length of an outage.
func (e *entity) emit(ctx workflow.Context, in activities.EmitInput) error {
	if !e.local(ctx) {
		return workflow.ExecuteActivity(emitCtx(ctx), a.Emit, in).Get(ctx, nil)
	}
	err := workflow.ExecuteLocalActivity(emitLocalCtx(ctx), a.Emit, in).Get(ctx, nil)
	var appErr *temporal.ApplicationError
	if err == nil || temporal.IsCanceledError(err) || (errors.As(err, &appErr) && appErr.NonRetryable()) {
		return err // published, or refused for good (as the Emit activity is)
	}
	workflow.GetLogger(ctx).Warn("events not published yet; the Emit activity goes on trying", "worker_id", in.Worker.ID, "err", err)
	return workflow.ExecuteActivity(emitCtx(ctx), a.Emit, in).Get(ctx, nil)
}

// emitLocalCtx is emitCtx for the local Emit: EmitLocalAttempts attempts
// (200 ms, then 400 ms apart) within 30 s at most.
func emitLocalCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: 30 * time.Second,
		StartToCloseTimeout:    10 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second,
			MaximumAttempts: EmitLocalAttempts,
		},
	})
}

// EmitLocalAttempts is how many times the local Emit is tried before the
// Emit activity takes over.
const EmitLocalAttempts = 3

// listLocalCtx is listCtx for the local ListNodes.
func listLocalCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: 30 * time.Second,
		StartToCloseTimeout:    10 * time.Second,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, MaximumAttempts: 3},
	})
}

// NodeTaskQueue is the task queue that only node nodeID polls: an activity
// scheduled there runs on that node.
func NodeTaskQueue(nodeID string) string { return TaskQueue + "-node-" + nodeID }

func listCtx(ctx workflow.Context) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 10 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, MaximumAttempts: 3},
	})
}

// ActivateTimeout bounds one Activate attempt on a node: long enough for a
// .NET load (its engine allows 120 s) and for a detach that waits for the
// calls in flight (up to WORKER_TIMEOUT).
const ActivateTimeout = 5 * time.Minute

// ActivateHeartbeat is how long a node's Activate may go without a
// heartbeat (activities.Activate sends one every 2 s while it works): a
// node that picked the task up and then stopped running it (SIGSTOPped,
// frozen, cut off from Temporal) fails the attempt within this, not
// within ActivateTimeout. Its retry goes to a node that polls again, or
// ends at its pick-up timeout (ActivatePickUp).
const ActivateHeartbeat = 20 * time.Second

// nodeFailure is a live node that did not apply a change.
type nodeFailure struct {
	node string
	err  error
}

// syncNodes runs Activate (make this node match the persisted record) on
// every live node's own task queue, after the change was persisted and
// applied on the node that ran Apply; a failed Activate is retried. The
// nodes that did not apply the change are returned: those whose Activate
// failed, and (issue 33 item 5) those that did not pick it up in time
// (schedule-to-start): such a node is paused, stuck or cut off from
// Temporal and may still serve the old state; reportNodes holds the event
// back for it while it is still a member. When the members cannot be
// listed, no other node was asked: one failure with node "" says so.
// skip, when not empty, is the node that made the change and is not asked
// again (skipApplier).
func (e *entity) syncNodes(ctx workflow.Context, skip string) []nodeFailure {
	log := workflow.GetLogger(ctx)
	strict := e.version(ctx, "unconfirmed-nodes-not-applied") == 1
	var nodes []string
	if err := e.listNodes(ctx, &nodes); err != nil {
		log.Warn("cluster members unknown: the change is not confirmed on the other nodes", "err", err)
		if strict {
			return []nodeFailure{{err: err}}
		}
		return nil
	}
	if skip != "" {
		nodes = slices.DeleteFunc(nodes, func(n string) bool { return n == skip })
	}
	futures := make([]workflow.Future, len(nodes))
	for i, n := range nodes {
		nctx := onNode(ctx, n, ActivateHeartbeat, &temporal.RetryPolicy{InitialInterval: 500 * time.Millisecond, BackoffCoefficient: 2,
			MaximumInterval: 10 * time.Second, MaximumAttempts: 4, NonRetryableErrorTypes: []string{failure.InvalidArgument}})
		futures[i] = workflow.ExecuteActivity(nctx, a.Activate, e.st.Worker.ID)
	}
	var failed []nodeFailure
	for i, f := range futures {
		err := f.Get(ctx, nil)
		var te *temporal.TimeoutError
		switch {
		case err == nil:
		case errors.As(err, &te) && te.TimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START:
			log.Warn("node did not pick the change up in time: gone, paused, stuck or cut off", "node_id", nodes[i], "err", err)
			if strict {
				failed = append(failed, nodeFailure{node: nodes[i], err: fmt.Errorf("did not pick the change up within %s (paused, stuck or cut off)", ActivatePickUp)})
			}
		default:
			log.Warn("node did not apply the change", "node_id", nodes[i], "err", err)
			failed = append(failed, nodeFailure{node: nodes[i], err: err})
		}
	}
	return failed
}

// onNode runs the activities of ctx on node's own task queue: a live node
// polls it all the time, so one that does not pick a task up within
// ActivatePickUp is gone, paused or stuck; an attempt may take
// ActivateTimeout while it heartbeats within heartbeat.
func onNode(ctx workflow.Context, node string, heartbeat time.Duration, retry *temporal.RetryPolicy) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:              NodeTaskQueue(node),
		ScheduleToStartTimeout: ActivatePickUp,
		StartToCloseTimeout:    ActivateTimeout,
		HeartbeatTimeout:       heartbeat,
		RetryPolicy:            retry,
	})
}

// ActivatePickUp is how long a node has to pick up its Activate
// (schedule-to-start).
const ActivatePickUp = 5 * time.Second

func (e *entity) upsertSearchAttributes(ctx workflow.Context) {
	w := e.st.Worker
	want := []struct {
		key   temporal.SearchAttributeKeyKeyword
		value string
	}{{SAWorkerID, w.ID}, {SAWorkerTopic, w.Topic}, {SAWorkerGroup, w.Group}, {SAWorkerStatus, string(w.Status)}, {SAWorkerTenant, w.TenantName()}}
	var updates []temporal.SearchAttributeUpdate
	cur := workflow.GetTypedSearchAttributes(ctx)
	for _, a := range want {
		// From epoch 4 on only what differs from the run's attributes
		// (set at its start, or carried by continue-as-new) is upserted:
		// each upsert is a history event and a visibility write, and a
		// create's start already sets what the created worker has.
		if v, ok := cur.GetKeyword(a.key); e.epoch >= 4 && ok && v == a.value {
			continue
		}
		updates = append(updates, a.key.ValueSet(a.value))
	}
	if len(updates) == 0 {
		return
	}
	err := workflow.UpsertTypedSearchAttributes(ctx, updates...)
	if err != nil {
		workflow.GetLogger(ctx).Warn("upsert search attributes", "err", err)
	}
}
