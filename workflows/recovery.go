package workflows

import (
	"context"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/internal/catalog"
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
	Done     RecoveryResult
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
// counted.
func RecoveryWorkflow(ctx workflow.Context, in RecoveryInput) (RecoveryResult, error) {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond, MaximumInterval: 2 * time.Second, MaximumAttempts: 3,
		},
	})
	batch, run := in.Batch, in.Run
	if batch <= 0 {
		batch = DefaultRecoveryBatch
	}
	if run <= 0 {
		run = DefaultRecoveryRun
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
		child := workflow.ExecuteChildWorkflow(cctx, WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}, Recovered: true})
		if err := child.GetChildWorkflowExecution().Get(ctx, nil); err != nil && !temporal.IsWorkflowExecutionAlreadyStartedError(err) {
			set.Set(nil, err)
			return
		}
		set.Set(nil, workflow.ExecuteActivity(actx, a.Activate, w.ID).Get(ctx, nil))
	})
	return f
}

// RecoveryRunTimeout bounds one run of the recovery workflow (at most
// DefaultRecoveryRun workers), so that a stuck recovery does not keep every
// node joining it for ever. It bounds each run, not the whole recovery: a
// recovery of many workers continues as new as often as it needs.
const RecoveryRunTimeout = 10 * time.Minute

// RunRecovery executes the recovery workflow under its fixed ID, joining one
// that is already running (only one recovery runs in the cluster).
func RunRecovery(ctx context.Context, c client.Client) (RecoveryResult, error) {
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:                       RecoveryWorkflowID,
		TaskQueue:                TaskQueue,
		WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING,
		WorkflowIDReusePolicy:    enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		WorkflowRunTimeout:       RecoveryRunTimeout,
	}, RecoveryWorkflow, RecoveryInput{})
	if err != nil {
		return RecoveryResult{}, fmt.Errorf("start recovery: %w", err)
	}
	var res RecoveryResult
	if err := run.Get(ctx, &res); err != nil {
		return res, fmt.Errorf("recovery: %w", err)
	}
	return res, nil
}
