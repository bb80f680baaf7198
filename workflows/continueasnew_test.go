package workflows

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
)

// Issue 43 item 5: with one update always in flight the run never had a
// moment without a running handler, so it never continued as new (200
// LoadCodes in one run configured for 5; a real server terminates the run
// near 51,200 events). Once continue-as-new is due, the validator refuses
// new updates with a retryable error (the API retries it on the next run),
// the updates in flight drain, and the run continues as new.
func (s *WorkerWorkflowSuite) TestContinueAsNewIsNotPostponedByUpdatesInFlight() {
	// Every change takes 1.5 s and a new one arrives every second: from the
	// second update on, one is always running or queued.
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).After(1500*time.Millisecond).Return(activities.Applied{}, nil)
	s.env.OnActivity(a.ListNodes, mock.Anything).Return([]string{}, nil)
	const sent = 20
	var accepted, completed int
	var due []error // refusals: continue-as-new due
	for i := range sent {
		name := UpdateStop
		if i%2 == 1 {
			name = UpdateStart
		}
		s.env.RegisterDelayedCallback(func() {
			s.env.UpdateWorkflow(name, name+"-"+time.Now().String(), &testsuite.TestUpdateCallback{
				OnReject:   func(err error) { due = append(due, err) },
				OnAccept:   func() { accepted++ },
				OnComplete: func(any, error) { completed++ },
			})
		}, time.Duration(i+1)*time.Second)
	}
	w := newWorker()
	w.Status, w.CodeVersion, w.CodeSHA256 = catalog.StatusRunning, 1, sha1
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}, ContinueAsNewAfter: 2})

	var can *workflow.ContinueAsNewError
	s.Require().True(errors.As(s.env.GetWorkflowError(), &can), "got %v", s.env.GetWorkflowError())
	s.Less(accepted, sent, "the run took every update and only then continued as new")
	s.LessOrEqual(accepted, 3, "updates accepted after continue-as-new was due")
	s.Equal(accepted, completed, "an accepted update did not finish before continue-as-new")
	s.Require().NotEmpty(due, "no update was refused while continue-as-new was due")
	for _, err := range due {
		var appErr *temporal.ApplicationError
		s.Require().True(errors.As(err, &appErr), "got %v", err)
		s.Equal(ContinueAsNewDue, appErr.Type())
		s.False(appErr.NonRetryable(), "the refusal must be retryable")
	}
	var next WorkerInput
	s.NoError(converterDecode(can, &next))
	s.Equal(2, next.ContinueAsNewAfter, "the next run keeps the bound")
}

// A run that recovery starts gets the configured bound (it started with 0,
// continuing as new only when the server suggested it).
func TestRecoveredRunsGetTheContinueAsNewBound(t *testing.T) {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestWorkflowEnvironment()
	env.RegisterActivity(&activities.Activities{})
	env.RegisterWorkflow(WorkerWorkflow)
	env.OnActivity(a.ListWorkerIDsPage, mock.Anything, mock.Anything).Return(func(_ context.Context, page int) ([]string, error) {
		if page == 0 {
			return []string{"w0", "w1", "w2"}, nil
		}
		return nil, nil
	})
	// Recovery takes the index in chunks (issue 43 item 6): page 0 in one.
	env.OnActivity(a.ListWorkerIDsChunk, mock.Anything, mock.Anything).Return(func(_ context.Context, cur catalog.IndexCursor) (catalog.IndexChunk, error) {
		ch := catalog.IndexChunk{Next: catalog.IndexCursor{Page: cur.Page + 1}}
		if cur.Page == 0 {
			ch.IDs = []string{"w0", "w1", "w2"}
		}
		return ch, nil
	})
	env.OnActivity(a.GetWorkers, mock.Anything, mock.Anything).Return(func(_ context.Context, ids []string) ([]catalog.Worker, error) {
		var ws []catalog.Worker
		for _, id := range ids {
			ws = append(ws, catalog.Worker{ID: id, Topic: "in", Status: catalog.StatusRunning})
		}
		return ws, nil
	})
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(nil)
	var mu sync.Mutex
	var bounds []int
	env.OnWorkflow(WorkerWorkflow, mock.Anything, mock.Anything).Return(
		func(_ workflow.Context, in WorkerInput) (WorkerState, error) {
			mu.Lock()
			bounds = append(bounds, in.ContinueAsNewAfter)
			mu.Unlock()
			return WorkerState{}, nil
		})
	// Batch 2, run 2: the bound also survives the recovery's own
	// continue-as-new.
	env.ExecuteWorkflow(RecoveryWorkflow, RecoveryInput{ContinueAsNewAfter: 7, Batch: 2, Run: 2})
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(env.GetWorkflowError(), &can), "got %v", env.GetWorkflowError())
	require.Equal(t, []int{7, 7}, bounds)
	var next RecoveryInput
	require.NoError(t, converterDecode(can, &next))
	require.Equal(t, 7, next.ContinueAsNewAfter)
}
