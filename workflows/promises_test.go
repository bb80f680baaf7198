package workflows

import (
	"strings"
	"time"

	"github.com/stretchr/testify/mock"

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
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(nil)
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
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(nil)
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
