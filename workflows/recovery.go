package workflows

import (
	"context"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// RecoveryWorkflowID is fixed: starting recovery while one runs joins it, so
// only one recovery runs in the cluster at a time (leader election).
const RecoveryWorkflowID = "workmanager-recovery"

// RecoveryResult counts the recovered and failed workers.
type RecoveryResult struct {
	Recovered int
	Failed    int
	// FailedIDs lists the workers that could not be recovered (the first
	// MaxFailedIDs of them).
	FailedIDs []string
}

// Recovery sizes: workers recovered concurrently, and workers per run before
// continuing as new (each worker adds about ten events to the history).
const (
	DefaultRecoveryBatch = 50
	DefaultRecoveryRun   = 500
	MaxFailedIDs         = 100
)

// RecoveryInput carries a recovery across continue-as-new. The zero value
// starts one.
type RecoveryInput struct {
	// Listed tells that Pending holds what is left of the worker list
	// (histories from before the paged index: the whole list).
	Listed  bool
	Pending []string
	// Paged tells that the index is taken a page at a time: NextPage is the
	// next page to list once Pending is done. Pending then holds at most
	// one page, whatever the number of workers.
	Paged    bool
	NextPage int
	// Chunked tells that the index is taken a chunk at a time
	// (catalog.IndexChunkBytes at most): Cursor is where the next chunk
	// starts once Pending is done. Pending then holds at most one chunk,
	// whatever the number of workers and the size of a page.
	Chunked bool
	Cursor  catalog.IndexCursor
	Done    RecoveryResult
	// ContinueAsNewAfter is given to the worker workflows recovery starts
	// (WorkerInput.ContinueAsNewAfter, the API's setting).
	ContinueAsNewAfter int
	// Batch and Run override DefaultRecoveryBatch and DefaultRecoveryRun
	// (tests).
	Batch, Run int
}

// RecoveryWorkflow brings every persisted worker back: it makes sure each
// worker's entity workflow runs (starting it from the persisted record when
// Temporal lost it) and that the worker is attached (RUNNING) or detached
// (STOPPED) on the node that runs the activity. Workers are taken in batches
// of Batch ids, and the workflow continues as new every Run workers, so the
// list, the history and the concurrency stay bounded whatever the number of
// workers. One broken worker does not stop the others: it is logged and
// counted. From version "recovery-window" on (recoverWindow) the index is
// listed in bounded chunks, up to Batch workers are recovered at once with
// no batch waiting for its slowest, a run also continues as new after
// RecoveryRunBudget, and a worker not recovered gets an error event.
func RecoveryWorkflow(ctx workflow.Context, in RecoveryInput) (RecoveryResult, error) {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		// Reads of a bounded chunk or batch: seconds at most. A node that
		// dies holding one (its own restart joins this recovery) is not
		// waited for a minute (only timeouts change: replay-safe).
		StartToCloseTimeout: 15 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond, MaximumInterval: 2 * time.Second, MaximumAttempts: 3,
		},
	})
	// The worker workflows recovery starts get the configured bound
	// (recoverOne reads it from the context).
	ctx = workflow.WithValue(ctx, continueAsNewAfterKey{}, in.ContinueAsNewAfter)
	batch, run := in.Batch, in.Run
	if batch <= 0 {
		batch = DefaultRecoveryBatch
	}
	if run <= 0 {
		run = DefaultRecoveryRun
	}
	if workflow.GetVersion(ctx, "recovery-window", workflow.DefaultVersion, 1) == 1 {
		return recoverWindow(ctx, actx, in, batch, run)
	}
	if !in.Listed && !in.Paged {
		if workflow.GetVersion(ctx, "paged-index", workflow.DefaultVersion, 1) == workflow.DefaultVersion {
			if err := workflow.ExecuteActivity(actx, a.ListWorkerIDs).Get(ctx, &in.Pending); err != nil {
				return in.Done, err
			}
			in.Listed = true
		} else {
			in.Paged = true
		}
	}
	for handled := 0; ; {
		if in.Paged && len(in.Pending) == 0 && in.NextPage < catalog.IndexPages {
			if err := workflow.ExecuteActivity(actx, a.ListWorkerIDsPage, in.NextPage).Get(ctx, &in.Pending); err != nil {
				return in.Done, err
			}
			in.NextPage++
			continue
		}
		if len(in.Pending) == 0 {
			break
		}
		if handled >= run || workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
			return RecoveryResult{}, workflow.NewContinueAsNewError(ctx, RecoveryWorkflow, in)
		}
		n := min(batch, len(in.Pending))
		var ws []catalog.Worker
		if err := workflow.ExecuteActivity(actx, a.GetWorkers, in.Pending[:n]).Get(ctx, &ws); err != nil {
			return in.Done, err
		}
		recoverBatch(ctx, actx, ws, &in.Done)
		in.Pending = in.Pending[n:]
		handled += n
	}
	return in.Done, nil
}

// Bounds of one recovery run (issue 43 item 2). A run starts no worker
// after RecoveryRunBudget; it then waits for the workers in flight, each
// done within RecoveryWorkerBound (and the bounded publication of its
// failure event), and continues as new with what is left. So every run
// ends well within RecoveryRunTimeout and carries its progress on, however
// slowly the workers load: a run that timed out would be started again
// from the first worker by the next node's RunRecovery.
const (
	RecoveryRunBudget = 3 * time.Minute
	// RecoveryWorkerBound bounds one worker's Activate in recovery, all
	// attempts together; a worker not activated by then is counted as
	// failed (an error event says why) and the node's reconcile tries it
	// again.
	RecoveryWorkerBound = ActivateTimeout
)

// RecoveryFailedType is the error_type of the error event of a worker
// that recovery could not bring back.
const RecoveryFailedType = activities.NotRecoveredType

// recoverWindow is RecoveryWorkflow from version "recovery-window" on: the
// index is taken a chunk at a time; up to batch workers are recovered at
// once, a finished one making room for the next (one slow worker holds
// one place, not a batch); the run continues as new after run workers or
// RecoveryRunBudget, whichever comes first.
func recoverWindow(ctx, lctx workflow.Context, in RecoveryInput, batch, run int) (RecoveryResult, error) {
	if in.Paged { // continued from a run that took whole pages
		in.Paged, in.Chunked, in.Cursor, in.NextPage = false, true, catalog.IndexCursor{Page: in.NextPage}, 0
	}
	if !in.Listed {
		in.Chunked = true
	}
	began := workflow.Now(ctx)
	due := func(started int) bool {
		return started >= run || workflow.Now(ctx).Sub(began) >= RecoveryRunBudget || workflow.GetInfo(ctx).GetContinueAsNewSuggested()
	}
	sel := workflow.NewSelector(ctx)
	var ready []catalog.Worker // read, not started yet
	inflight, started := 0, 0
	for {
		if inflight < batch && !due(started) {
			switch {
			case len(ready) > 0:
				w := ready[0]
				ready = ready[1:]
				inflight++
				started++
				sel.AddFuture(recoverOne(ctx, recoveryActivateCtx(ctx), w), func(f workflow.Future) {
					inflight--
					count(ctx, w.ID, f.Get(ctx, nil), &in.Done)
				})
				continue
			case len(in.Pending) > 0:
				n := min(batch, len(in.Pending))
				if err := workflow.ExecuteActivity(lctx, a.GetWorkers, in.Pending[:n]).Get(ctx, &ready); err != nil {
					return in.Done, err
				}
				in.Pending = in.Pending[n:]
				continue
			case in.Chunked && !in.Cursor.Done():
				var ch catalog.IndexChunk
				if err := workflow.ExecuteActivity(lctx, a.ListWorkerIDsChunk, in.Cursor).Get(ctx, &ch); err != nil {
					return in.Done, err
				}
				in.Pending, in.Cursor = ch.IDs, ch.Next
				continue
			}
		}
		if inflight == 0 {
			break
		}
		sel.Select(ctx)
	}
	if len(ready) == 0 && len(in.Pending) == 0 && (!in.Chunked || in.Cursor.Done()) {
		return in.Done, nil
	}
	left := make([]string, 0, len(ready)+len(in.Pending))
	for _, w := range ready { // read again by the next run
		left = append(left, w.ID)
	}
	in.Pending = append(left, in.Pending...)
	return RecoveryResult{}, workflow.NewContinueAsNewError(ctx, RecoveryWorkflow, in)
}

// recoveryActivateCtx gives recovery's Activate the node fan-out's timeout
// and heartbeat (syncNodes), all attempts bounded by RecoveryWorkerBound,
// and has recoverOne publish an error event for a worker not recovered.
func recoveryActivateCtx(ctx workflow.Context) workflow.Context {
	ctx = workflow.WithValue(ctx, reportFailureKey{}, true)
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		ScheduleToCloseTimeout: RecoveryWorkerBound,
		StartToCloseTimeout:    ActivateTimeout,
		HeartbeatTimeout:       ActivateHeartbeat,
		RetryPolicy: &temporal.RetryPolicy{InitialInterval: 500 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second,
			MaximumAttempts: 4, NonRetryableErrorTypes: []string{failure.InvalidArgument}},
	})
}

// reportFailureKey marks a context whose recoverOne publishes an error
// event for a worker it could not recover.
type reportFailureKey struct{}

// reportNotRecovered publishes the error event of a worker recovery could
// not bring back, with the reason. Publishing is bounded: a broker outage
// must not hold the recovery (the failure is logged and counted anyway).
func reportNotRecovered(ctx workflow.Context, w catalog.Worker, cause error) {
	ectx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		ScheduleToCloseTimeout: time.Minute,
		StartToCloseTimeout:    30 * time.Second,
		RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 200 * time.Millisecond, BackoffCoefficient: 2, MaximumInterval: 10 * time.Second},
	})
	x := workflow.GetInfo(ctx).WorkflowExecution
	ev := activities.EventSpec{ID: eventID(WorkflowID(w.ID), x.RunID, 0, lifecycleevents.Error), Kind: lifecycleevents.Error, ErrorType: RecoveryFailedType,
		ErrorMessage: activities.NotRecoveredMessage(w.ID, cause)}
	if err := workflow.ExecuteActivity(ectx, a.Emit, activities.EmitInput{Worker: w, Events: []activities.EventSpec{ev}}).Get(ctx, nil); err != nil {
		workflow.GetLogger(ctx).Warn("not_recovered event not published", "worker_id", w.ID, "err", err)
	}
}

// count adds one worker's outcome to res.
func count(ctx workflow.Context, id string, err error, res *RecoveryResult) {
	if err != nil {
		workflow.GetLogger(ctx).Error("worker not recovered", "worker_id", id, "err", err)
		res.Failed++
		if len(res.FailedIDs) < MaxFailedIDs {
			res.FailedIDs = append(res.FailedIDs, id)
		}
		return
	}
	res.Recovered++
}

// recoverBatch recovers ws concurrently and adds the outcome to res.
func recoverBatch(ctx, actx workflow.Context, ws []catalog.Worker, res *RecoveryResult) {
	futures := make([]workflow.Future, len(ws))
	for i, w := range ws {
		futures[i] = recoverOne(ctx, actx, w)
	}
	for i, f := range futures {
		if err := f.Get(ctx, nil); err != nil {
			workflow.GetLogger(ctx).Error("worker not recovered", "worker_id", ws[i].ID, "err", err)
			res.Failed++
			if len(res.FailedIDs) < MaxFailedIDs {
				res.FailedIDs = append(res.FailedIDs, ws[i].ID)
			}
			continue
		}
		res.Recovered++
	}
}

// recoverOne ensures the entity workflow, then activates the worker.
func recoverOne(ctx, actx workflow.Context, w catalog.Worker) workflow.Future {
	f, set := workflow.NewFuture(ctx)
	workflow.Go(ctx, func(ctx workflow.Context) {
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:        WorkflowID(w.ID),
			TaskQueue:         TaskQueue,
			ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_ABANDON,
			// A run that completed is a deleted worker: never start it
			// again. One that failed, was terminated or timed out is
			// started again from the record.
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY,
		})
		bound, _ := ctx.Value(continueAsNewAfterKey{}).(int)
		child := workflow.ExecuteChildWorkflow(cctx, WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}, Recovered: true,
			ContinueAsNewAfter: bound, Epoch: CurrentEpoch})
		err := child.GetChildWorkflowExecution().Get(ctx, nil)
		if err == nil || temporal.IsWorkflowExecutionAlreadyStartedError(err) {
			err = workflow.ExecuteActivity(actx, a.Activate, w.ID).Get(ctx, nil)
		}
		if report, _ := actx.Value(reportFailureKey{}).(bool); report && err != nil {
			reportNotRecovered(ctx, w, err)
		}
		set.Set(nil, err)
	})
	return f
}

// continueAsNewAfterKey carries RecoveryInput.ContinueAsNewAfter to
// recoverOne.
type continueAsNewAfterKey struct{}

// RecoveryRunTimeout bounds one run of the recovery workflow (at most
// DefaultRecoveryRun workers), so that a stuck recovery does not keep every
// node joining it for ever. It bounds each run, not the whole recovery: a
// recovery of many workers continues as new as often as it needs.
const RecoveryRunTimeout = 10 * time.Minute

// RunRecovery executes the recovery workflow under its fixed ID, joining one
// that is already running (only one recovery runs in the cluster).
func RunRecovery(ctx context.Context, c client.Client) (RecoveryResult, error) {
	return RunRecoveryWith(ctx, c, RecoveryInput{})
}

// RunRecoveryWith is RunRecovery starting from in (its ContinueAsNewAfter:
// the bound of the worker workflows it starts). A recovery joined keeps
// the input it was started with.
func RunRecoveryWith(ctx context.Context, c client.Client, in RecoveryInput) (RecoveryResult, error) {
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       RecoveryWorkflowID,
		TaskQueue:                TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowRunTimeout:       RecoveryRunTimeout,
	}, RecoveryWorkflow, in)
	if err != nil {
		return RecoveryResult{}, fmt.Errorf("start recovery: %w", err)
	}
	var res RecoveryResult
	if err := run.Get(ctx, &res); err != nil {
		return res, fmt.Errorf("recovery: %w", err)
	}
	return res, nil
}
