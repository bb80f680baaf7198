package workflows

import (
	"context"
	"strings"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// Recovery read worker w1's record, w1's delete then completed, and
// recovery started a fresh run from the stale record: that run finds the
// record gone, ends as deleted, applies nothing, and an update that
// arrived meanwhile is answered NotFound (it never writes w1 back).
func (s *WorkerWorkflowSuite) TestRecoveredRunOfADeletedWorkerEndsAtOnce() {
	applied := s.recordApplies()
	s.env.OnActivity(a.GetWorkers, mock.Anything, []string{"w1"}).Return([]catalog.Worker{}, nil)
	var stop updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stop) }, 0)
	w := newWorker()
	w.Status = catalog.StatusRunning
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}, Recovered: true})

	s.Require().True(s.env.IsWorkflowCompleted(), "the run must end, not serve the deleted worker")
	s.NoError(s.env.GetWorkflowError())
	var st WorkerState
	s.NoError(s.env.GetWorkflowResult(&st))
	s.True(st.Deleted)
	s.Empty(*applied)
	s.Empty(s.emitted)
	if stop.reject == nil {
		s.Require().Error(stop.err)
		s.Equal(failure.NotFound, failure.Kind(stop.err), "stop answered %v", stop.err)
	}
}

// A run recovery starts serves the catalog's record as it is now, not the
// one recovery read earlier (a stop may have completed in between).
func (s *WorkerWorkflowSuite) TestRecoveredRunServesTheCurrentRecord() {
	applied := s.recordApplies()
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	now := newWorker()
	now.Status = catalog.StatusStopped
	s.env.OnActivity(a.GetWorkers, mock.Anything, []string{"w1"}).Return([]catalog.Worker{now}, nil)
	var stop, del updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stop) }, time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateDelete, &del) }, 2*time.Second)
	stale := newWorker()
	stale.Status = catalog.StatusRunning
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: stale, Created: true}, Recovered: true})

	s.True(s.env.IsWorkflowCompleted())
	s.NoError(stop.err)
	s.NoError(del.err)
	s.Equal(catalog.StatusStopped, stop.result.(catalog.Worker).Status)
	s.Empty(*applied, "stopping a worker the catalog already has stopped changes nothing")
}

// Lifecycle event ids hold the run id: a run that recovery starts after the
// workflow was lost numbers its events from 1 again, and its ids still
// differ from every earlier one. Within a run they are distinct.
func (s *WorkerWorkflowSuite) TestEventIDsAreUniqueAcrossRuns() {
	s.recordApplies()
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	var create, del updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateDelete, &del) }, 2*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	s.NoError(create.err)
	s.NoError(del.err)

	ids := s.emittedIDs
	s.Require().Len(ids, 3)
	seen := map[string]bool{}
	for i, id := range ids {
		parts := strings.Split(id, "/")
		s.Require().Len(parts, 4, id)
		s.Equal("default-test-workflow-id", parts[0])
		s.Equal("default-test-run-id", parts[1], "run id in %s", id)
		s.False(seen[id], "event id %s repeats", id)
		seen[id] = true
		s.Equal([]lifecycleevents.Kind{lifecycleevents.Created, lifecycleevents.Started, lifecycleevents.Deleted}[i], lifecycleevents.Kind(parts[3]))
	}
	// The same sequence number in another run is another id.
	s.NotEqual(eventID(WorkflowID("w1"), "run-a", 1, lifecycleevents.Created), eventID(WorkflowID("w1"), "run-b", 1, lifecycleevents.Created))
}

// A LoadCode whose Apply failed may have written its history entry, which
// History does not show (the record never reached it): the next LoadCode
// takes its number, with a higher revision, so that its entry replaces the
// failed one's and a late write of the failed one never replaces it
// (issue 43 item 7; before, the number was never used again).
func (s *WorkerWorkflowSuite) TestFailedLoadCodeGivesItsNumberToTheNext() {
	s.prepareAnyCode(s.env)
	var applied []activities.ApplyInput
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.ApplyInput) (activities.Applied, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		applied = append(applied, in)
		if in.History != nil && in.History.SHA256 == sha1 {
			return activities.Applied{}, temporal.NewNonRetryableApplicationError("redis: connection reset", "Unavailable", nil)
		}
		return activities.Applied{}, nil
	})
	s.env.OnActivity(a.GetWorkers, mock.Anything, []string{"w1"}).Return(func(context.Context, []string) ([]catalog.Worker, error) {
		w := newWorker() // the record as it was: version 1
		w.CodeVersion, w.Status = 1, catalog.StatusRunning
		return []catalog.Worker{w}, nil
	})
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	var failed, ok, del updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateLoadCode, &failed, catalog.CodeRef{SHA256: sha1, SourceKind: "content"}) }, time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateLoadCode, &ok, catalog.CodeRef{SHA256: sha2, SourceKind: "content"}) }, 2*time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateDelete, &del) }, 3*time.Second)
	w := newWorker()
	w.CodeVersion, w.Status = 1, catalog.StatusRunning
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})

	s.Error(failed.err)
	s.Require().NoError(ok.err)
	s.Equal(int64(2), ok.result.(catalog.Worker).CodeVersion)
	s.Require().Len(applied, 2)
	s.Equal(int64(2), applied[0].History.Version)
	s.Equal(int64(2), applied[1].History.Version)
	s.Less(applied[0].History.Revision, applied[1].History.Revision)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.CodeUpdated}, {lifecycleevents.Deleted}}, s.emitted, "the failed load published nothing")
}

// An Apply that saved the record but whose answer was lost (the activity
// failed) is a change made: LoadCode succeeds, every node gets it and its
// event is published, instead of an error while the cluster runs the code.
func (s *WorkerWorkflowSuite) TestApplyFailureAfterTheRecordWasSavedIsSuccess() {
	s.prepareAnyCode(s.env)
	var saved catalog.Worker
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.ApplyInput) (activities.Applied, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if in.History == nil {
			return activities.Applied{}, nil
		}
		saved = in.Worker
		return activities.Applied{}, temporal.NewNonRetryableApplicationError("context deadline exceeded", "Timeout", nil)
	})
	s.env.OnActivity(a.GetWorkers, mock.Anything, []string{"w1"}).Return(func(context.Context, []string) ([]catalog.Worker, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return []catalog.Worker{saved}, nil
	})
	s.env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1"}, nil)
	activated := s.countActivations()
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	var load, del updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateLoadCode, &load, catalog.CodeRef{SHA256: sha2, SourceKind: "content"}) }, time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateDelete, &del) }, 2*time.Second)
	w := newWorker()
	w.CodeVersion, w.Status = 1, catalog.StatusRunning
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})

	s.Require().NoError(load.err)
	s.Equal(int64(2), load.result.(catalog.Worker).CodeVersion)
	s.Equal(sha2, load.result.(catalog.Worker).CodeSHA256)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.CodeUpdated}, {lifecycleevents.Deleted}}, s.emitted)
	s.Equal(2, activated(), "the load and the delete reached the node")
}

// An Apply that failed before the record was saved (e.g. its history write
// failed after the node attached the new code) is no change: LoadCode fails,
// and every node is brought back to the record, so no node keeps running
// the code the API reported as not loaded.
func (s *WorkerWorkflowSuite) TestApplyFailureBeforeTheRecordResyncsNodes() {
	s.prepareAnyCode(s.env)
	current := newWorker()
	current.CodeVersion, current.Status = 1, catalog.StatusRunning
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.ApplyInput) (activities.Applied, error) {
		if in.History != nil {
			return activities.Applied{}, temporal.NewNonRetryableApplicationError("state put history: connection refused", "Unavailable", nil)
		}
		return activities.Applied{}, nil
	})
	s.env.OnActivity(a.GetWorkers, mock.Anything, []string{"w1"}).Return([]catalog.Worker{current}, nil)
	s.env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	activated := s.countActivations()
	var load updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateLoadCode, &load, catalog.CodeRef{SHA256: sha2, SourceKind: "content"}) }, time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, 2*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: current, Created: true}})

	s.Error(load.err)
	s.Equal(2, activated(), "both nodes were brought back to the record")
	s.Empty(s.emitted, "the failed load published nothing")
}

// countActivations mocks Activate and returns how many times it ran so far.
func (s *WorkerWorkflowSuite) countActivations() func() int {
	var n int
	s.env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(func(context.Context, string) error {
		s.mu.Lock()
		n++
		s.mu.Unlock()
		return nil
	})
	return func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return n
	}
}
