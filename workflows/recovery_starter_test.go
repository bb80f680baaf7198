package workflows

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/mocks"
)

// RunRecovery starts (or joins) the one recovery of the cluster under its
// fixed id and returns its result; a refused start says so.
func TestRunRecoveryJoinsTheOneRecovery(t *testing.T) {
	tc := mocks.NewClient(t)
	run := mocks.NewWorkflowRun(t)
	run.On("Get", mock.Anything, mock.Anything).Return(func(_ context.Context, v any) error {
		*(v.(*RecoveryResult)) = RecoveryResult{Recovered: 3, Failed: 1, FailedIDs: []string{"w9"}}
		return nil
	})
	tc.On("ExecuteWorkflow", mock.Anything, mock.MatchedBy(func(o client.StartWorkflowOptions) bool {
		return o.ID == RecoveryWorkflowID && o.TaskQueue == TaskQueue &&
			o.WorkflowIDConflictPolicy == enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING
	}), mock.Anything, mock.Anything).Return(run, nil).Once()
	res, err := RunRecovery(context.Background(), tc)
	require.NoError(t, err)
	require.Equal(t, RecoveryResult{Recovered: 3, Failed: 1, FailedIDs: []string{"w9"}}, res)

	refused := mocks.NewClient(t)
	refused.On("ExecuteWorkflow", mock.Anything, mock.Anything, mock.Anything, mock.Anything).Return(nil, errors.New("namespace not found")).Once()
	_, err = RunRecovery(context.Background(), refused)
	require.ErrorContains(t, err, "start recovery: namespace not found")
}
