package workflows

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/mocks"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// Issue 33 item 1: a create accepted while another create of the same run
// was running (its validator saw the worker not created yet) must not run
// once it gets the lock: the worker keeps the first create's code, and the
// second is told AlreadyExists.
func (s *WorkerWorkflowSuite) TestSecondCreateQueuedBehindTheFirstIsRefused() {
	var prepared []string
	s.env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).After(2 * time.Second).Return(
		func(_ context.Context, in activities.PrepareCodeInput) (catalog.CodeRef, error) {
			s.mu.Lock()
			prepared = append(prepared, in.Ref.SHA256)
			s.mu.Unlock()
			return in.Ref, nil
		})
	applied := []activities.ApplyInput{}
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.ApplyInput) (activities.Applied, error) {
		s.mu.Lock()
		applied = append(applied, in)
		s.mu.Unlock()
		return activities.Applied{}, nil
	})
	var first, second updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &first, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &second, CreateRequest{Ref: catalog.CodeRef{SHA256: sha2, SourceKind: "content"}})
	}, 1500*time.Millisecond)
	var st WorkerState
	s.env.RegisterDelayedCallback(func() {
		v, err := s.env.QueryWorkflow(QueryState)
		s.Require().NoError(err)
		s.Require().NoError(v.Get(&st))
		s.env.CancelWorkflow()
	}, time.Minute)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})

	s.NoError(first.reject)
	s.NoError(first.err)
	s.Equal(sha1, first.result.(catalog.Worker).CodeSHA256)
	if second.reject == nil {
		s.Require().Error(second.err, "the queued create ran")
		s.Equal(failure.AlreadyExists, failure.Kind(second.err))
	}
	s.Equal([]string{sha1}, prepared, "only the first create prepared code")
	s.Len(applied, 1)
	s.Equal(sha1, st.Worker.CodeSHA256)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Created, lifecycleevents.Started}}, s.emitted)
}

// Issue 33 item 1: a run started for one request (WorkerInput.CreateID)
// creates only with that request's create, even when another request's
// create (which joined the run) is delivered first: the code that runs is
// the code of the request whose topic, name and request id the run holds.
func (s *WorkerWorkflowSuite) TestCreateOfAnotherRequestIsRejected() {
	applied := s.recordApplies()
	var other, own updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &other, CreateRequest{Ref: catalog.CodeRef{SHA256: sha2, SourceKind: "content"}, CreateID: "request-b"})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &own, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}, CreateID: "request-a"})
	}, 2*time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, time.Minute)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}, CreateID: "request-a"})

	s.ErrorContains(other.reject, "being created by another request")
	s.NoError(own.reject)
	s.NoError(own.err)
	s.Require().Len(*applied, 1)
	s.Equal(sha1, (*applied)[0].Worker.CodeSHA256)
}

// Issue 33 item 1: when the first create fails, a create queued behind it
// does not succeed in a run that is about to end FAILED (which would leave
// a live worker without a workflow): it is refused and the run ends.
func (s *WorkerWorkflowSuite) TestCreateQueuedBehindAFailedCreateIsRefused() {
	s.env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).After(2 * time.Second).Return(
		func(_ context.Context, in activities.PrepareCodeInput) (catalog.CodeRef, error) {
			if in.Ref.SHA256 == sha1 {
				return catalog.CodeRef{}, failure.New(failure.InvalidArgument, "SyntaxError")
			}
			return in.Ref, nil
		})
	applied := 0
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(context.Context, activities.ApplyInput) (activities.Applied, error) {
		s.mu.Lock()
		applied++
		s.mu.Unlock()
		return activities.Applied{}, nil
	})
	var first, second updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &first, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &second, CreateRequest{Ref: catalog.CodeRef{SHA256: sha2, SourceKind: "content"}})
	}, 1500*time.Millisecond)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})

	s.Equal(failure.InvalidArgument, failure.Kind(first.err))
	if second.reject == nil {
		s.Equal(failure.AlreadyExists, failure.Kind(second.err), "second create: %v", second.err)
	}
	s.Zero(applied, "nothing was applied")
	s.True(s.env.IsWorkflowCompleted())
	s.ErrorContains(s.env.GetWorkflowError(), "create failed")
}

// Issue 33 item 2: a create that outlasts CreateTimeout (its Emit waited
// out a broker outage) and then succeeds leaves a managed worker: the
// workflow lives on and answers later updates, instead of ending FAILED.
func (s *WorkerWorkflowSuite) TestCreateOutlastingTheCreateTimeoutKeepsItsWorkflow() {
	for _, epoch := range []int{0, CurrentEpoch} {
		s.Run(fmt.Sprintf("epoch %d", epoch), func() { s.createOutlastingTheCreateTimeout(epoch) })
	}
}

func (s *WorkerWorkflowSuite) createOutlastingTheCreateTimeout(epoch int) {
	emits := 0
	var kinds []lifecycleevents.Kind
	env := s.envWithEmit(func(in activities.EmitInput) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if emits++; emits <= 8 { // about 30 s of retries
			return errors.New("broker unavailable")
		}
		for _, e := range in.Events {
			kinds = append(kinds, e.Kind)
		}
		return nil
	})
	s.prepareAnyCode(env)
	env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	var create, stop, del updater
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(UpdateCreate, "c", callback(&create), CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s", callback(&stop)) }, 5*time.Minute)
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateDelete, "d", callback(&del)) }, 6*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}, CreateTimeout: 10 * time.Second, Epoch: epoch})

	s.NoError(create.err)
	s.NoError(stop.reject)
	s.NoError(stop.err, "the worker's workflow still manages it")
	s.NoError(del.err)
	s.True(env.IsWorkflowCompleted())
	s.NoError(env.GetWorkflowError())
	s.Equal([]lifecycleevents.Kind{lifecycleevents.Created, lifecycleevents.Started, lifecycleevents.Stopped, lifecycleevents.Deleted}, kinds)
}

// envWithEmit is a test environment whose Emit is emit.
func (s *WorkerWorkflowSuite) envWithEmit(emit func(activities.EmitInput) error) *testsuite.TestWorkflowEnvironment {
	env := s.NewTestWorkflowEnvironment()
	env.RegisterActivity(&activities.Activities{})
	env.OnActivity(a.Emit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.EmitInput) error { return emit(in) })
	return env
}

func callback(u *updater) *testsuite.TestUpdateCallback {
	return &testsuite.TestUpdateCallback{
		OnReject: func(err error) { u.reject = err }, OnAccept: func() {},
		OnComplete: func(r any, err error) { u.result, u.err = r, err },
	}
}

// Issue 33 item 3: a run that recovery started re-reads the record, and a
// state-store outage longer than the activity's usual retries does not
// fail it (which would leave a live worker unmanageable): the read is
// retried until the store answers. The continue-as-new does not ask the
// next run to read it again.
func (s *WorkerWorkflowSuite) TestRecoveredRunOutlivesAStateStoreOutage() {
	s.recordApplies()
	w := newWorker()
	w.Status = catalog.StatusRunning
	reads := 0
	s.env.OnActivity(a.GetWorkers, mock.Anything, []string{"w1"}).Return(func(context.Context, []string) ([]catalog.Worker, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if reads++; reads <= 9 { // more than the usual 8 attempts (the test environment caps "until it succeeds" at 10)
			return nil, errors.New("redis: connection refused")
		}
		return []catalog.Worker{w}, nil
	})
	var stop updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stop) }, time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}, Recovered: true, ContinueAsNewAfter: 1})

	s.NoError(stop.reject)
	s.NoError(stop.err)
	s.Equal(10, reads)
	var can *workflow.ContinueAsNewError
	s.Require().True(errors.As(s.env.GetWorkflowError(), &can), "got %v", s.env.GetWorkflowError())
	var next WorkerInput
	s.NoError(converterDecode(can, &next))
	s.False(next.Recovered, "the next run reads the record again")
	s.Equal(catalog.StatusStopped, next.State.Worker.Status)
}

// Issue 33 item 5: "stopped" is not announced while a live node still
// runs the worker: its Activate is retried, and when it keeps failing the
// stop fails as NotApplied and an error event names the node. The
// workflow follows the persisted record; repeating the stop once the node
// applies it publishes "stopped".
func (s *WorkerWorkflowSuite) TestStoppedIsNotAnnouncedWhileALiveNodeRunsTheWorker() {
	var emitted [][]lifecycleevents.Kind
	var errorEvents []activities.EventSpec
	env := s.envWithEmit(func(in activities.EmitInput) error {
		var ks []lifecycleevents.Kind
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, e := range in.Events {
			ks = append(ks, e.Kind)
			if e.Kind == lifecycleevents.Error {
				errorEvents = append(errorEvents, e)
			}
		}
		emitted = append(emitted, ks)
		return nil
	})
	s.prepareAnyCode(env)
	env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	broken := true
	attempts := map[string]int{}
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(func(ctx context.Context, _ string) error {
		tq := activity.GetInfo(ctx).TaskQueue
		s.mu.Lock()
		defer s.mu.Unlock()
		attempts[tq]++
		if tq == NodeTaskQueue("n2") && broken {
			return errors.New("detach: context deadline exceeded")
		}
		return nil
	})
	w := newWorker()
	w.Status, w.CodeVersion = catalog.StatusRunning, 1
	var stop, again updater
	var st WorkerState
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
	env.RegisterDelayedCallback(func() {
		v, err := env.QueryWorkflow(QueryState)
		s.Require().NoError(err)
		s.Require().NoError(v.Get(&st))
		s.mu.Lock()
		broken = false
		s.mu.Unlock()
		env.UpdateWorkflow(UpdateStop, "s2", callback(&again))
	}, 2*time.Minute)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 3*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})

	s.Require().Error(stop.err)
	s.Equal(NotApplied, failure.Kind(stop.err))
	s.ErrorContains(stop.err, "node(s) n2 did not apply it")
	s.NotContains(stop.err.Error(), "deadline exceeded", "the node's error stays in the event and the log")
	s.Equal(5, attempts[NodeTaskQueue("n2")], "n2 tried 4 times for the stop, once for the repeat")
	s.Require().Len(errorEvents, 1)
	s.Equal("not_applied", errorEvents[0].ErrorType)
	s.Contains(errorEvents[0].ErrorMessage, "n2")
	s.Contains(errorEvents[0].ErrorMessage, "detach: context deadline exceeded")
	s.Equal(catalog.StatusStopped, st.Worker.Status, "the workflow follows the persisted record")
	s.Equal(lifecycleevents.Stopped, st.Unsynced)
	s.NoError(again.err)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Error}, {lifecycleevents.Stopped}}, emitted)
}

// Issue 33 item 5: a node that failed the change but has left the cluster
// meanwhile serves nothing: the change is announced.
func (s *WorkerWorkflowSuite) TestANodeThatLeftDoesNotHoldTheEventBack() {
	s.prepareAnyCode(s.env)
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	lists := 0
	s.env.OnActivity(a.ListNodes, mock.Anything).Return(func(context.Context) ([]string, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if lists++; lists == 1 {
			return []string{"n1", "n2"}, nil
		}
		return []string{"n1"}, nil
	})
	s.env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(func(ctx context.Context, _ string) error {
		if activity.GetInfo(ctx).TaskQueue == NodeTaskQueue("n2") {
			return errors.New("node shutting down")
		}
		return nil
	})
	w := newWorker()
	w.Status, w.CodeVersion = catalog.StatusRunning, 1
	var load updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateLoadCode, &load, catalog.CodeRef{SHA256: sha2, SourceKind: "content"}) }, time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, 2*time.Minute)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})
	s.NoError(load.err)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.CodeUpdated}}, s.emitted)
}

// Issue 33 item 9: the recovery's timeout bounds each run, not the whole
// recovery (which continues as new every DefaultRecoveryRun workers): a
// large recovery is not cut off after ten minutes in all.
func TestRecoveryTimeoutBoundsEachRun(t *testing.T) {
	tc := mocks.NewClient(t)
	run := mocks.NewWorkflowRun(t)
	run.On("Get", mock.Anything, mock.Anything).Return(nil)
	tc.On("ExecuteWorkflow", mock.Anything, mock.MatchedBy(func(o client.StartWorkflowOptions) bool {
		return o.WorkflowExecutionTimeout == 0 && o.WorkflowRunTimeout == RecoveryRunTimeout
	}), mock.Anything, mock.Anything).Return(run, nil).Once()
	_, err := RunRecovery(context.Background(), tc)
	require.NoError(t, err)
}
