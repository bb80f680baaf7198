package workflows

import (
	"context"
	"errors"
	"fmt"
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

// A burst of updates on a small ContinueAsNewAfter made runs of a few
// milliseconds, and Temporal holds the first task of a run continued as
// new until its minimal interval after the previous run's execution time,
// which moves on by the interval with every short run (the seventh run of
// TestConcurrentUpdatesAcrossContinueAsNew got its first task 5.4 s late).
// From epoch 3 on a run is MinRunAge old before it continues as new:
// updates that arrive sooner are taken by the run; one that arrives after
// that is refused (retryable) and the run continues as new. An epoch-2 run
// continues as new as soon as its bound is reached, as it did.
func (s *WorkerWorkflowSuite) TestContinueAsNewWaitsForTheRunsMinimalAge() {
	for _, epoch := range []int{2, CurrentEpoch} {
		s.Run(fmt.Sprint("epoch ", epoch), func() {
			s.SetupTest()
			s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
			s.env.OnActivity(a.ListNodes, mock.Anything).Return([]string{}, nil)
			var accepted int
			var refused []error
			send := func(name string, after time.Duration) {
				s.env.RegisterDelayedCallback(func() {
					s.env.UpdateWorkflow(name, name+after.String(), &testsuite.TestUpdateCallback{
						OnReject: func(err error) { refused = append(refused, err) }, OnAccept: func() { accepted++ }, OnComplete: func(any, error) {},
					})
				}, after)
			}
			// Four within the first 400 ms (the bound is 2), one after
			// MinRunAge.
			for i, name := range []string{UpdateStop, UpdateStart, UpdateStop, UpdateStart} {
				send(name, time.Duration(i+1)*100*time.Millisecond)
			}
			send(UpdateStop, MinRunAge+500*time.Millisecond)
			start := s.env.Now()
			w := newWorker()
			w.Status, w.CodeVersion, w.CodeSHA256 = catalog.StatusRunning, 1, sha1
			s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}, ContinueAsNewAfter: 2, Epoch: epoch})

			var can *workflow.ContinueAsNewError
			s.Require().True(errors.As(s.env.GetWorkflowError(), &can), "got %v", s.env.GetWorkflowError())
			lived := s.env.Now().Sub(start)
			if epoch < 3 {
				s.Equal(2, accepted, "an epoch-2 run continues as new at its bound")
				s.Less(lived, MinRunAge)
				return
			}
			s.Equal(4, accepted, "updates within MinRunAge are taken by the run")
			s.GreaterOrEqual(lived, MinRunAge, "the run continued as new younger than MinRunAge")
			s.Less(lived, MinRunAge+500*time.Millisecond, "the run waited for an update instead of its timer")
			var next WorkerInput
			s.NoError(converterDecode(can, &next))
			s.Equal(CurrentEpoch, next.Epoch)
		})
	}
}

// A worker deleted while its run waits out MinRunAge ends as deleted.
func (s *WorkerWorkflowSuite) TestDeleteWhileTheRunWaitsOutItsMinimalAge() {
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	s.env.OnActivity(a.ListNodes, mock.Anything).Return([]string{}, nil)
	for i, name := range []string{UpdateStop, UpdateStart, UpdateDelete} {
		s.env.RegisterDelayedCallback(func() {
			s.env.UpdateWorkflow(name, name, &testsuite.TestUpdateCallback{OnReject: func(err error) { s.Fail("refused", "%s: %v", name, err) }, OnAccept: func() {}, OnComplete: func(any, error) {}})
		}, time.Duration(i+1)*100*time.Millisecond)
	}
	w := newWorker()
	w.Status, w.CodeVersion, w.CodeSHA256 = catalog.StatusRunning, 1, sha1
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}, ContinueAsNewAfter: 2, Epoch: CurrentEpoch})
	s.Require().NoError(s.env.GetWorkflowError())
	var st WorkerState
	s.Require().NoError(s.env.GetWorkflowResult(&st))
	s.True(st.Deleted)
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
