package workflows

import (
	"time"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
)

// temporalPayloadLimit is Temporal's default limit on one payload (blob
// size limit error): a larger activity result or workflow input fails.
const temporalPayloadLimit = 2 << 20

// Issue 43 item 6: at a million workers one page of the index holds
// 62,500 ids (1/16 of them), 2.4 MB as one activity result, over
// Temporal's 2 MiB payload limit: recovery failed every time. Every
// listing result, and what a run carries into the next, must stay well
// under the limit whatever the number of workers.
func TestRecoveryPayloadsStayBoundedAtAMillionWorkers(t *testing.T) {
	store := state.NewMemoryStore()
	ids := make([]string, 62_500)
	for i := range ids {
		ids[i] = fmt.Sprintf("acme.%032d", i) // a tenant's worker id: 37 bytes
	}
	b, err := json.Marshal(ids)
	require.NoError(t, err)
	require.Greater(t, len(b), temporalPayloadLimit)
	require.NoError(t, store.Put(context.Background(), state.KeyPrefix+"index/0", b, state.PutOptions{}))

	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetTestTimeout(time.Minute) // the default 3 s of workflow-goroutine time failed under -race on a loaded machine
	env.RegisterActivity(&activities.Activities{Catalog: catalog.New(store)})
	env.RegisterWorkflow(WorkerWorkflow)
	env.OnActivity(a.GetWorkers, mock.Anything, mock.Anything).Return(func(_ context.Context, ids []string) ([]catalog.Worker, error) {
		var ws []catalog.Worker
		for _, id := range ids {
			ws = append(ws, catalog.Worker{ID: id, Topic: "in", Status: catalog.StatusRunning})
		}
		return ws, nil
	})
	env.OnWorkflow(WorkerWorkflow, mock.Anything, mock.Anything).Return(WorkerState{}, nil)
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(nil)
	var listed []int // sizes of listing results
	env.SetOnActivityCompletedListener(func(info *activity.Info, result converter.EncodedValue, err error) {
		if info.ActivityType.Name == "GetWorkers" || info.ActivityType.Name == "Activate" || err != nil || !result.HasValue() {
			return
		}
		var raw json.RawMessage
		require.NoError(t, result.Get(&raw))
		listed = append(listed, len(raw))
	})
	env.ExecuteWorkflow(RecoveryWorkflow, RecoveryInput{Batch: 1, Run: 1})
	require.True(t, env.IsWorkflowCompleted())
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "want continue-as-new, got %v", env.GetWorkflowError())
	require.NotEmpty(t, listed)
	for _, n := range listed {
		require.LessOrEqual(t, n, temporalPayloadLimit/8, "a listing result of %d bytes", n)
	}
	carried := 0
	for _, p := range can.Input.GetPayloads() {
		carried += len(p.GetData())
	}
	require.LessOrEqual(t, carried, temporalPayloadLimit/8, "continue-as-new input of %d bytes", carried)
}
