package workflows

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
)

// Issue 48 item 2: calls issued back to back on one worker each waited
// ~330 ms more than spaced ones. Nothing of a change runs after its
// answer; each activity the change scheduled on the server cost two tasks
// of the history shard's transfer queue, which Temporal reads at most 20
// times a second (history.transferProcessorMaxPollRPS), so back-to-back
// calls waited for that budget. A stop, start or delete schedules on the
// server only what must run on another process: Apply (any node,
// heartbeated) and one Activate per live node; ListNodes and Emit run as
// local activities. The next update, sent the moment the previous answer
// arrives, runs at once: the first thing the workflow does after an
// answer is the next change's Apply, and every event of the answered
// change was published before its answer.
func (s *WorkerWorkflowSuite) TestBackToBackUpdatesWaitForNothingOfThePreviousOne() {
	env := s.NewTestWorkflowEnvironment() // without the suite's Emit mock
	env.RegisterActivity(&activities.Activities{})
	// Every activity and every answer, in the order they happen.
	var steps []string
	step := func(ctx context.Context, what string) {
		where := "server"
		if activity.GetInfo(ctx).IsLocalActivity {
			where = "local"
		}
		s.mu.Lock()
		steps = append(steps, what+"@"+where)
		s.mu.Unlock()
	}
	answer := func(what string) {
		s.mu.Lock()
		steps = append(steps, "answer "+what)
		s.mu.Unlock()
	}
	env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.ApplyInput) (activities.Applied, error) {
		step(ctx, "Apply "+string(in.Worker.Status))
		return activities.Applied{}, nil
	})
	env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(func(ctx context.Context, _ activities.DeleteInput) (activities.Applied, error) {
		step(ctx, "Delete")
		return activities.Applied{}, nil
	})
	env.OnActivity(a.ListNodes, mock.Anything).Return(func(ctx context.Context) ([]string, error) {
		step(ctx, "ListNodes")
		return []string{"n1", "n2"}, nil
	})
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(func(ctx context.Context, _ string) error {
		step(ctx, "Activate")
		return nil
	})
	env.OnActivity(a.Emit, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.EmitInput) error {
		for _, e := range in.Events {
			step(ctx, "Emit "+string(e.Kind))
		}
		return nil
	})

	// stop, then start the moment stop's answer arrives, then delete the
	// moment start's does.
	var stop, start, del updater
	send := func(name string, u *updater, next func()) {
		env.UpdateWorkflow(name, name, &testsuite.TestUpdateCallback{
			OnReject: func(err error) { u.reject = err },
			OnAccept: func() {},
			OnComplete: func(r any, err error) {
				u.result, u.err = r, err
				answer(name)
				if next != nil {
					next()
				}
			},
		})
	}
	env.RegisterDelayedCallback(func() {
		send(UpdateStop, &stop, func() {
			send(UpdateStart, &start, func() { send(UpdateDelete, &del, nil) })
		})
	}, time.Second)
	w := newWorker()
	w.Status = catalog.StatusRunning
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(env.GetWorkflowError())
	for _, u := range []*updater{&stop, &start, &del} {
		s.Require().NoError(u.reject)
		s.Require().NoError(u.err)
	}
	change := func(apply, event string) []string {
		return []string{apply + "@server", "ListNodes@local", "Activate@server", "Activate@server", "Emit " + event + "@local"}
	}
	want := slices.Concat(
		change("Apply STOPPED", "stopped"), []string{"answer " + UpdateStop},
		change("Apply RUNNING", "started"), []string{"answer " + UpdateStart},
		change("Delete", "deleted"), []string{"answer " + UpdateDelete},
	)
	s.Equal(want, steps, "each answer comes after its change's event, and the next change starts right after it")
	server := 0
	for _, st := range steps {
		if strings.HasSuffix(st, "@server") {
			server++
		}
	}
	s.Equal(3*3, server, fmt.Sprintf("each change schedules on the server only its Apply (or Delete) and one Activate per node: %v", steps))
}

// An Emit that fails on the node running the workflow task (its daprd
// down) is tried EmitLocalAttempts times there, then left to the Emit
// activity, which any node runs until it succeeds: the change is answered
// once its event is published, never without it.
func (s *WorkerWorkflowSuite) TestEmitThatFailsLocallyIsPublishedByTheActivity() {
	env := s.NewTestWorkflowEnvironment() // without the suite's Emit mock
	env.RegisterActivity(&activities.Activities{})
	env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	var local int
	var published []string
	env.OnActivity(a.Emit, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.EmitInput) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if activity.GetInfo(ctx).IsLocalActivity && in.Events[0].Kind != "deleted" {
			local++
			return errors.New("daprd unavailable")
		}
		for _, e := range in.Events {
			published = append(published, string(e.Kind))
		}
		return nil
	})
	var stop, del updater
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(UpdateStop, "s", &testsuite.TestUpdateCallback{
			OnReject: func(err error) { stop.reject = err }, OnAccept: func() {},
			OnComplete: func(r any, err error) {
				s.mu.Lock()
				defer s.mu.Unlock()
				stop.result, stop.err = r, err
				s.Equal([]string{"stopped"}, published, "answered only once its event is published")
			},
		})
	}, time.Second)
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(UpdateDelete, "d", &testsuite.TestUpdateCallback{
			OnReject: func(err error) { del.reject = err }, OnAccept: func() {},
			OnComplete: func(_ any, err error) { del.err = err },
		})
	}, time.Minute)
	w := newWorker()
	w.Status = catalog.StatusRunning
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})

	s.Require().True(env.IsWorkflowCompleted())
	s.Require().NoError(stop.reject)
	s.Require().NoError(stop.err)
	s.Require().NoError(del.err)
	s.Equal(EmitLocalAttempts, local)
	s.Equal([]string{"stopped", "deleted"}, published)
}
