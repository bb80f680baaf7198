package reconcile

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/mock"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/mocks"

	"github.com/virtufin/workmanager/workflows"
)

// Issue 43 item 1: the node refuses a record whose workflow completed (the
// worker was deleted); a workflow that is running, or that was lost
// (failed, terminated, purged: recovery's), does not make it refuse one.
func TestWorkflowDeletedOnlyForACompletedWorkflow(t *testing.T) {
	tc := mocks.NewClient(t)
	status := map[string]enumspb.WorkflowExecutionStatus{
		"done": enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, "live": enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING,
		"failed": enumspb.WORKFLOW_EXECUTION_STATUS_FAILED, "terminated": enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED,
	}
	for id, st := range status {
		tc.On("DescribeWorkflowExecution", mock.Anything, workflows.WorkflowID(id), "").Return(&workflowservice.DescribeWorkflowExecutionResponse{
			WorkflowExecutionInfo: &workflowpb.WorkflowExecutionInfo{Status: st}}, nil)
	}
	tc.On("DescribeWorkflowExecution", mock.Anything, workflows.WorkflowID("purged"), "").Return(nil, serviceerror.NewNotFound("workflow not found"))
	tc.On("DescribeWorkflowExecution", mock.Anything, workflows.WorkflowID("unknown"), "").Return(nil, serviceerror.NewUnavailable("down"))
	check := WorkflowDeleted(tc)
	for id, want := range map[string]bool{"done": true, "live": false, "failed": false, "terminated": false, "purged": false} {
		if got, err := check(context.Background(), id); err != nil || got != want {
			t.Errorf("%s: deleted %v, %v; want %v", id, got, err, want)
		}
	}
	if _, err := check(context.Background(), "unknown"); !errors.As(err, new(*serviceerror.Unavailable)) {
		t.Errorf("Temporal unavailable: %v, want the error", err)
	}
}
