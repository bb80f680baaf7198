package workflows

import (
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
)

// Issue 45: what a worker asks of placement is kept in its create's
// history entry (and its record); later entries do not repeat it.
func (s *WorkerWorkflowSuite) TestCreateHistoryKeepsPlacement() {
	applied := s.recordApplies()
	var create, load updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateLoadCode, &load, catalog.CodeRef{SHA256: sha2, SourceKind: "content"})
	}, 2*time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, 3*time.Second)
	w := newWorker()
	three := 3
	w.Placement = &catalog.Placement{Replicas: &three, Require: map[string]string{"pool": "gpu"}}
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w}})
	for _, u := range []*updater{&create, &load} {
		s.NoError(u.reject)
		s.NoError(u.err)
	}
	s.Len(*applied, 2)
	first, second := (*applied)[0], (*applied)[1]
	s.Equal(catalog.HistoryCreate, first.History.Action)
	s.Equal(w.Placement, first.History.Placement)
	s.Equal(w.Placement, first.Worker.Placement)
	s.Nil(second.History.Placement)
	s.Equal(w.Placement, second.Worker.Placement, "a reload keeps the worker's placement")
}
