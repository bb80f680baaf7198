package workflows

import (
	"time"

	enumspb "go.temporal.io/api/enums/v1"
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
	// FailedIDs lists the workers that could not be recovered.
	FailedIDs []string
}

// RecoveryWorkflow brings every persisted worker back: it makes sure each
// worker's entity workflow runs (starting it from the persisted record when
// Temporal lost it) and that the worker is attached (RUNNING) or detached
// (STOPPED) on the node that runs the activity. One broken worker does not
// stop the others: it is logged and counted.
func RecoveryWorkflow(ctx workflow.Context) (RecoveryResult, error) {
	log := workflow.GetLogger(ctx)
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: 200 * time.Millisecond, MaximumInterval: 2 * time.Second, MaximumAttempts: 3,
		},
	})
	var ws []catalog.Worker
	if err := workflow.ExecuteActivity(actx, a.ListWorkers).Get(ctx, &ws); err != nil {
		return RecoveryResult{}, err
	}
	futures := make([]workflow.Future, len(ws))
	for i, w := range ws {
		futures[i] = recoverOne(ctx, actx, w)
	}
	var res RecoveryResult
	for i, f := range futures {
		if err := f.Get(ctx, nil); err != nil {
			log.Error("worker not recovered", "worker_id", ws[i].ID, "err", err)
			res.Failed++
			res.FailedIDs = append(res.FailedIDs, ws[i].ID)
			continue
		}
		res.Recovered++
	}
	return res, nil
}

// recoverOne ensures the entity workflow, then activates the worker.
func recoverOne(ctx, actx workflow.Context, w catalog.Worker) workflow.Future {
	f, set := workflow.NewFuture(ctx)
	workflow.Go(ctx, func(ctx workflow.Context) {
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:            WorkflowID(w.ID),
			TaskQueue:             TaskQueue,
			ParentClosePolicy:     enumspb.PARENT_CLOSE_POLICY_ABANDON,
			WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
		})
		child := workflow.ExecuteChildWorkflow(cctx, WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})
		if err := child.GetChildWorkflowExecution().Get(ctx, nil); err != nil && !temporal.IsWorkflowExecutionAlreadyStartedError(err) {
			set.Set(nil, err)
			return
		}
		set.Set(nil, workflow.ExecuteActivity(actx, a.Activate, w.ID).Get(ctx, nil))
	})
	return f
}
