package reconcile

import (
	"context"
	"errors"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/workflows"
)

// WorkflowDeleted is the node's check (node.SetWorkflowCheck) of a
// worker's entity workflow: deleted when its latest run completed (the
// entity workflow completes only when the worker is deleted). A run that
// failed, was terminated or timed out, or a workflow Temporal no longer
// has, is a live worker whose workflow was lost (recovery's): not deleted.
func WorkflowDeleted(c client.Client) node.WorkflowCheck {
	return func(ctx context.Context, id string) (bool, error) {
		resp, err := c.DescribeWorkflowExecution(ctx, workflows.WorkflowID(id), "")
		var nf *serviceerror.NotFound
		switch {
		case errors.As(err, &nf):
			return false, nil
		case err != nil:
			return false, err
		}
		return resp.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, nil
	}
}
