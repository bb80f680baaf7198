package workflows

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/stretchr/testify/mock"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// events records what an environment emits: the kinds of each Emit, and
// the error events.
type events struct {
	kinds  [][]lifecycleevents.Kind
	errors []activities.EventSpec
}

func (s *WorkerWorkflowSuite) recordingEnv(ev *events) *testsuite.TestWorkflowEnvironment {
	env := s.envWithEmit(func(in activities.EmitInput) error {
		var ks []lifecycleevents.Kind
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, e := range in.Events {
			ks = append(ks, e.Kind)
			if e.Kind == lifecycleevents.Error {
				ev.errors = append(ev.errors, e)
			}
		}
		ev.kinds = append(ev.kinds, ks)
		return nil
	})
	s.prepareAnyCode(env)
	env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	return env
}

// unpicked answers Activate on node n's queue as a node that never picks
// its task up (paused, stuck): a schedule-to-start timeout.
func unpicked(n string) func(context.Context, string) error {
	return func(ctx context.Context, _ string) error {
		if activity.GetInfo(ctx).TaskQueue == NodeTaskQueue(n) {
			return temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil)
		}
		return nil
	}
}

func runningWorker() catalog.Worker {
	w := newWorker()
	w.Status, w.CodeVersion = catalog.StatusRunning, 1
	return w
}

// Issue 33 item 5: a live member whose Activate is not picked up in time
// (SIGSTOPped, stuck) may still serve the worker: "stopped" is not
// announced, an error event (not_applied) names it, and the stop fails as
// NotApplied (the API's UNAVAILABLE).
func (s *WorkerWorkflowSuite) TestUnpickedActivateOnALiveNodeIsNotApplied() {
	var ev events
	env := s.recordingEnv(&ev)
	env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(unpicked("n2"))
	var stop updater
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 2*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}})

	s.Require().Error(stop.err)
	s.Equal(NotApplied, failure.Kind(stop.err))
	s.ErrorContains(stop.err, "node(s) n2 did not apply it")
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Error}}, ev.kinds, "no stopped")
	s.Require().Len(ev.errors, 1)
	s.Equal("not_applied", ev.errors[0].ErrorType)
	s.Contains(ev.errors[0].ErrorMessage, "node n2: did not pick the change up")
}

// Issue 33 item 5: the same for a code update ("code_updated").
func (s *WorkerWorkflowSuite) TestUnpickedActivateHoldsCodeUpdatedBack() {
	var ev events
	env := s.recordingEnv(&ev)
	env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(unpicked("n2"))
	var load updater
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(UpdateLoadCode, "l1", callback(&load), catalog.CodeRef{SHA256: sha2, SourceKind: "content"})
	}, time.Second)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 2*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}})

	s.Equal(NotApplied, failure.Kind(load.err), "got %v", load.err)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Error}}, ev.kinds, "no code_updated")
}

// Issue 33 item 5: a node that did not pick its Activate up and has left
// the membership since (it serves nothing until it fenced and reconciled:
// reconcile.MemberGate) does not hold the event back.
func (s *WorkerWorkflowSuite) TestUnpickedActivateOnAGoneNodeDoesNotHoldTheEventBack() {
	var ev events
	env := s.recordingEnv(&ev)
	lists := 0
	env.OnActivity(a.ListNodes, mock.Anything).Return(func(context.Context) ([]string, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if lists++; lists == 1 {
			return []string{"n1", "n2"}, nil
		}
		return []string{"n1"}, nil
	})
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(unpicked("n2"))
	var stop updater
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 2*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}})

	s.NoError(stop.err)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Stopped}}, ev.kinds)
}

// Issue 33 item 5: when the members cannot be listed, no other node was
// asked to apply the change: it cannot be confirmed, so "stopped" is not
// announced (NotApplied); the repeat announces it once they can be.
func (s *WorkerWorkflowSuite) TestUnlistedMembersAreNotApplied() {
	var ev events
	env := s.recordingEnv(&ev)
	down := true
	env.OnActivity(a.ListNodes, mock.Anything).Return(func(context.Context) ([]string, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if down {
			return nil, errors.New("redis: connection refused")
		}
		return []string{"n1"}, nil
	})
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(nil)
	var stop, again updater
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
	env.RegisterDelayedCallback(func() {
		s.mu.Lock()
		down = false
		s.mu.Unlock()
		env.UpdateWorkflow(UpdateStop, "s2", callback(&again))
	}, time.Minute)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 2*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}})

	s.Require().Error(stop.err)
	s.Equal(NotApplied, failure.Kind(stop.err))
	s.ErrorContains(stop.err, "could not be listed")
	s.NoError(again.err)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Error}, {lifecycleevents.Stopped}}, ev.kinds)
	s.Require().Len(ev.errors, 1)
	s.Equal("not_applied", ev.errors[0].ErrorType)
}

// Issue 33 item 5: a delete completes (the record is gone) even when a
// live node did not detach the worker, but that node is named in a
// not_applied error event before "deleted".
func (s *WorkerWorkflowSuite) TestDeleteReportsNodesThatDidNotDetach() {
	var ev events
	env := s.recordingEnv(&ev)
	env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(unpicked("n2"))
	var del updater
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateDelete, "d1", callback(&del)) }, time.Second)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}})

	s.NoError(del.err)
	s.True(env.IsWorkflowCompleted())
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Error}, {lifecycleevents.Deleted}}, ev.kinds)
	s.Require().Len(ev.errors, 1)
	s.Equal("not_applied", ev.errors[0].ErrorType)
	s.Contains(ev.errors[0].ErrorMessage, "n2")
	s.Contains(ev.errors[0].ErrorMessage, "is deleted")
}

// A run of epoch 2 (CurrentEpoch) leaves the node whose Apply or Delete
// made the change out of the fan-out that follows (it already matches the
// record: activities.Applied); every other live node is asked. A run of
// an older epoch asks every node, as its history has it.
func (s *WorkerWorkflowSuite) TestFanOutSkipsTheNodeThatMadeTheChange() {
	for _, tc := range []struct {
		epoch int
		want  []string
	}{
		{CurrentEpoch, []string{"n2", "n2"}},
		{1, []string{"n1", "n2", "n1", "n2"}},
	} {
		var ev events
		env := s.envWithEmit(func(in activities.EmitInput) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			var ks []lifecycleevents.Kind
			for _, e := range in.Events {
				ks = append(ks, e.Kind)
			}
			ev.kinds = append(ev.kinds, ks)
			return nil
		})
		s.prepareAnyCode(env)
		env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{Node: "n1"}, nil)
		env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{Node: "n1"}, nil)
		env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
		var asked []string
		env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(func(ctx context.Context, _ string) error {
			s.mu.Lock()
			asked = append(asked, strings.TrimPrefix(activity.GetInfo(ctx).TaskQueue, NodeTaskQueue("")))
			s.mu.Unlock()
			return nil
		})
		var stop, del updater
		env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
		env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateDelete, "d1", callback(&del)) }, 2*time.Second)
		env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}, Epoch: tc.epoch})

		s.Require().NoError(stop.err, "epoch %d", tc.epoch)
		s.Require().NoError(del.err, "epoch %d", tc.epoch)
		slices.Sort(asked[:len(asked)/2])
		slices.Sort(asked[len(asked)/2:])
		s.Equal(tc.want, asked, "epoch %d: the nodes asked to Activate (stop, then delete)", tc.epoch)
		s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Stopped}, {lifecycleevents.Deleted}}, ev.kinds, "epoch %d", tc.epoch)
	}
}

// A run of epoch 2 runs PrepareCode as a local activity first: its
// success or the code's refusal is the answer; any other failure (this
// node cannot check the code, the store does not answer) goes to the
// PrepareCode activity, which any node may run.
func (s *WorkerWorkflowSuite) TestLocalPrepareCodeHandsOtherFailuresToTheActivity() {
	for _, tc := range []struct {
		name  string
		local error
		want  []bool // IsLocalActivity of each PrepareCode attempt
		kind  string // the LoadCode's failure kind, "" for success
	}{
		{"prepared", nil, []bool{true}, ""},
		{"refused", temporal.NewApplicationError("not a Python module", failure.InvalidArgument), []bool{true}, failure.InvalidArgument},
		{"not here", errors.New("engine text/x-python not available on this node"), []bool{true, false}, ""},
	} {
		env := s.envWithEmit(func(activities.EmitInput) error { return nil })
		env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{Node: "n1"}, nil)
		env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1"}, nil)
		var attempts []bool
		env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.PrepareCodeInput) (catalog.CodeRef, error) {
			local := activity.GetInfo(ctx).IsLocalActivity
			s.mu.Lock()
			attempts = append(attempts, local)
			s.mu.Unlock()
			if local && tc.local != nil {
				return catalog.CodeRef{}, tc.local
			}
			return in.Ref, nil
		})
		var load updater
		ref := catalog.CodeRef{SHA256: strings.Repeat("b", 64), SourceKind: "content"}
		env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateLoadCode, "l1", callback(&load), ref) }, time.Second)
		env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}, Epoch: CurrentEpoch})

		s.Equal(tc.want, attempts, "%s: PrepareCode attempts (local?)", tc.name)
		if tc.kind == "" {
			s.NoError(load.err, tc.name)
		} else {
			s.Equal(tc.kind, failure.Kind(load.err), "%s: %v", tc.name, load.err)
		}
	}
}

// localAttempts is a fake Apply or Delete that records whether each
// attempt is a local activity and fails the local ones with local (nil:
// none fails); the others answer that node n1 made the change.
func localAttempts[In any](s *WorkerWorkflowSuite, attempts *[]bool, local error) func(context.Context, In) (activities.Applied, error) {
	return func(ctx context.Context, _ In) (activities.Applied, error) {
		isLocal := activity.GetInfo(ctx).IsLocalActivity
		s.mu.Lock()
		*attempts = append(*attempts, isLocal)
		s.mu.Unlock()
		if isLocal && local != nil {
			return activities.Applied{}, local
		}
		return activities.Applied{Node: "n1"}, nil
	}
}

// In runs of epoch 6 a delete's Delete runs first as a local activity:
// its success, or a failure no attempt changes, is the answer; any other
// failure goes to the Delete activity, which any node runs and retries;
// older runs run the activity only. Either way the worker is deleted and
// "deleted" published once.
func (s *WorkerWorkflowSuite) TestLocalDeleteHandsOtherFailuresToTheActivity() {
	for _, tc := range []struct {
		name  string
		epoch int
		local error
		want  []bool // IsLocalActivity of each Delete attempt
		fails bool
	}{
		{"deleted", CurrentEpoch, nil, []bool{true}, false},
		{"stale", CurrentEpoch, temporal.NewNonRetryableApplicationError("moved past", activities.StaleWrite, nil), []bool{true}, true},
		{"store not answering", CurrentEpoch, errors.New("state delete: connection refused"), []bool{true, false}, false},
		{"epoch 5", 5, nil, []bool{false}, false},
	} {
		var ev events
		env := s.envWithEmit(func(in activities.EmitInput) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, e := range in.Events {
				ev.kinds = append(ev.kinds, []lifecycleevents.Kind{e.Kind})
			}
			return nil
		})
		env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1"}, nil)
		var attempts []bool
		env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(localAttempts[activities.DeleteInput](s, &attempts, tc.local))
		var del updater
		env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateDelete, "d1", callback(&del)) }, time.Second)
		env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}, Epoch: tc.epoch})

		s.Equal(tc.want, attempts, "%s: Delete attempts (local?)", tc.name)
		if tc.fails {
			s.Error(del.err, tc.name)
			s.Empty(ev.kinds, "%s: no deleted event for a delete that failed", tc.name)
			continue
		}
		s.NoError(del.err, tc.name)
		s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Deleted}}, ev.kinds, tc.name)
	}
}

// In runs of epoch 5 Apply runs first as a local activity: its answer, or
// its refusal (InvalidArgument), is final; any other failure goes to the
// Apply activity, which any node runs and retries; older runs run the
// activity only.
func (s *WorkerWorkflowSuite) TestLocalApplyHandsOtherFailuresToTheActivity() {
	for _, tc := range []struct {
		name  string
		epoch int
		local error
		want  []bool // IsLocalActivity of each Apply attempt
		kind  string // the stop's failure kind, "" for success
	}{
		{"applied", CurrentEpoch, nil, []bool{true}, ""},
		{"refused", CurrentEpoch, temporal.NewApplicationError("bad record", failure.InvalidArgument), []bool{true}, failure.InvalidArgument},
		{"store not answering", CurrentEpoch, errors.New("state put: connection refused"), []bool{true, false}, ""},
		{"epoch 4", 4, nil, []bool{false}, ""},
	} {
		env := s.envWithEmit(func(activities.EmitInput) error { return nil })
		env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1"}, nil)
		env.OnActivity(a.GetWorkers, mock.Anything, mock.Anything).Return([]catalog.Worker{}, nil)
		env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(nil) // a refused change resyncs every node
		var attempts []bool
		env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(localAttempts[activities.ApplyInput](s, &attempts, tc.local))
		var stop updater
		env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
		env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}, Epoch: tc.epoch})

		s.Equal(tc.want, attempts, "%s: Apply attempts (local?)", tc.name)
		if tc.kind == "" {
			s.NoError(stop.err, tc.name)
		} else {
			s.Equal(tc.kind, failure.Kind(stop.err), "%s: %v", tc.name, stop.err)
		}
	}
}
