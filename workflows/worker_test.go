package workflows

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"github.com/stretchr/testify/suite"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/lifecycle"
)

type WorkerWorkflowSuite struct {
	suite.Suite
	testsuite.WorkflowTestSuite
	env *testsuite.TestWorkflowEnvironment
}

func TestWorkerWorkflow(t *testing.T) { suite.Run(t, new(WorkerWorkflowSuite)) }

func (s *WorkerWorkflowSuite) SetupTest() {
	s.env = s.NewTestWorkflowEnvironment()
	s.env.RegisterActivity(&activities.Activities{})
}

const sha1 = "1111111111111111111111111111111111111111111111111111111111111111"
const sha2 = "2222222222222222222222222222222222222222222222222222222222222222"

func newWorker() catalog.Worker {
	return catalog.Worker{ID: "w1", MIMEType: "text/x-python", Topic: "in", Group: "g", Status: catalog.StatusStopped}
}

// updater sends an update and records its result.
type updater struct {
	result any
	err    error
	reject error
}

func (s *WorkerWorkflowSuite) update(name string, u *updater, args ...any) {
	s.env.UpdateWorkflow(name, name+"-"+time.Now().String(), &testsuite.TestUpdateCallback{
		OnReject: func(err error) { u.reject = err },
		OnAccept: func() {},
		OnComplete: func(r any, err error) {
			u.result, u.err = r, err
		},
	}, args...)
}

func (s *WorkerWorkflowSuite) TestFullLifecycle() {
	var applied []activities.ApplyInput
	s.env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.PrepareCodeInput) (catalog.CodeRef, error) { return in.Ref, nil })
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.ApplyInput) error {
		applied = append(applied, in)
		return nil
	})
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(nil)

	var create, stop, stopAgain, start, load, del updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stop) }, 2*time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stopAgain) }, 3*time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStart, &start) }, 4*time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateLoadCode, &load, catalog.CodeRef{SHA256: sha2, SourceKind: "url", URL: "https://example.invalid/w.py"})
	}, 5*time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateDelete, &del) }, 6*time.Second)

	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	s.True(s.env.IsWorkflowCompleted())
	s.NoError(s.env.GetWorkflowError())
	for _, u := range []*updater{&create, &stop, &stopAgain, &start, &load, &del} {
		s.NoError(u.reject)
		s.NoError(u.err)
	}
	s.Equal(catalog.StatusRunning, create.result.(catalog.Worker).Status)
	s.Equal(catalog.StatusStopped, stop.result.(catalog.Worker).Status)
	s.Equal(catalog.StatusRunning, start.result.(catalog.Worker).Status)
	lw := load.result.(catalog.Worker)
	s.Equal(int64(2), lw.CodeVersion)
	s.Equal(sha2, lw.CodeSHA256)

	// The repeated stop applied nothing: create, stop, start, load.
	s.Len(applied, 4)
	s.Equal([]lifecycle.Kind{lifecycle.Created, lifecycle.Started}, kinds(applied[0]))
	s.Equal([]lifecycle.Kind{lifecycle.Stopped}, kinds(applied[1]))
	s.Equal([]lifecycle.Kind{lifecycle.Started}, kinds(applied[2]))
	s.Equal([]lifecycle.Kind{lifecycle.CodeUpdated}, kinds(applied[3]))
	s.Equal(int64(2), applied[3].History.Version)
	s.Equal("url", applied[3].History.SourceKind)

	var st WorkerState
	s.NoError(s.env.GetWorkflowResult(&st))
	s.True(st.Deleted)
}

func kinds(in activities.ApplyInput) []lifecycle.Kind {
	var out []lifecycle.Kind
	for _, e := range in.Events {
		out = append(out, e.Kind)
	}
	return out
}

func (s *WorkerWorkflowSuite) TestValidatorsRejectWithoutActivities() {
	s.env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.PrepareCodeInput) (catalog.CodeRef, error) { return in.Ref, nil })
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(nil)
	var early, create, again, badSHA updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStart, &early) }, time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, 2*time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &again, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, 3*time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateLoadCode, &badSHA, catalog.CodeRef{SHA256: "nope"}) }, 4*time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, 5*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	s.ErrorContains(early.reject, "not created")
	s.NoError(create.err)
	s.ErrorContains(again.reject, "already exists")
	s.ErrorContains(badSHA.reject, "sha256")
}

func (s *WorkerWorkflowSuite) TestFailedCreateEndsWorkflow() {
	s.env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).Return(catalog.CodeRef{},
		temporal.NewNonRetryableApplicationError("SyntaxError: invalid syntax", activities.ErrTypeInvalidArgument, nil))
	var create updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	var appErr *temporal.ApplicationError
	s.True(errors.As(create.err, &appErr))
	s.Equal(activities.ErrTypeInvalidArgument, appErr.Type())
	s.True(s.env.IsWorkflowCompleted())
	s.ErrorContains(s.env.GetWorkflowError(), "create failed")
}

func (s *WorkerWorkflowSuite) TestNeverCreatedTimesOut() {
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}, CreateTimeout: time.Minute})
	s.True(s.env.IsWorkflowCompleted())
	s.ErrorContains(s.env.GetWorkflowError(), "never created")
}

func (s *WorkerWorkflowSuite) TestContinueAsNewCarriesState() {
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(nil)
	w := newWorker()
	w.Status, w.CodeVersion, w.CodeSHA256 = catalog.StatusRunning, 3, sha1
	var stop, start updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stop) }, time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStart, &start) }, 2*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}, ContinueAsNewAfter: 2})
	s.NoError(stop.err)
	s.NoError(start.err)
	err := s.env.GetWorkflowError()
	var can *workflow.ContinueAsNewError
	s.Require().True(errors.As(err, &can), "got %v", err)
	var next WorkerInput
	s.NoError(converterDecode(can, &next))
	s.True(next.State.Created)
	s.Equal(int64(3), next.State.Worker.CodeVersion)
	s.Equal(catalog.StatusRunning, next.State.Worker.Status)
	s.Equal(int64(2), next.State.Seq)
}

// Every change is applied on every live node, on that node's own task
// queue; a node that fails does not fail the update.
func (s *WorkerWorkflowSuite) TestChangesReachEveryNode() {
	s.env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.PrepareCodeInput) (catalog.CodeRef, error) { return in.Ref, nil })
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(nil)
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(nil)
	s.env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	var synced []string
	s.env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(func(ctx context.Context, id string) error {
		tq := activity.GetInfo(ctx).TaskQueue
		synced = append(synced, tq+":"+id)
		if tq == NodeTaskQueue("n2") {
			return errors.New("node n2 is gone")
		}
		return nil
	})
	var create, stop, load, del updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stop) }, 2*time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateLoadCode, &load, catalog.CodeRef{SHA256: sha2, SourceKind: "content"}) }, 3*time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateDelete, &del) }, 4*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	for _, u := range []*updater{&create, &stop, &load, &del} {
		s.NoError(u.reject)
		s.NoError(u.err)
	}
	n1, n2 := NodeTaskQueue("n1")+":w1", NodeTaskQueue("n2")+":w1"
	// Four changes, each to both nodes; n2 is tried twice each time.
	count := map[string]int{}
	for _, x := range synced {
		count[x]++
	}
	s.Equal(map[string]int{n1: 4, n2: 8}, count)
}

// Before the sync-all-nodes change, a change reached only the node that ran
// Apply: histories recorded then must not schedule node activities.
func (s *WorkerWorkflowSuite) TestChangesBeforeSyncAllNodesStayLocal() {
	s.env.OnGetVersion(syncAllNodes, workflow.DefaultVersion, 1).Return(workflow.DefaultVersion)
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(nil)
	listed := 0
	s.env.OnActivity(a.ListNodes, mock.Anything).Return(func(context.Context) ([]string, error) { listed++; return nil, nil })
	w := newWorker()
	w.Status = catalog.StatusRunning
	var stop updater
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stop) }, time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, 2*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})
	s.NoError(stop.err)
	s.Zero(listed)
}

func TestWorkflowIDIsStable(t *testing.T) {
	require.Equal(t, "workmanager-worker-abc", WorkflowID("abc"))
}

func (s *WorkerWorkflowSuite) TestUpdateQueuedBehindDeleteIsNotFound() {
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).After(time.Second).Return(nil)
	w := newWorker()
	w.Status = catalog.StatusRunning
	var del, start updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateDelete, &del)
		s.update(UpdateStop, &start) // accepted while the delete runs, then waits for the lock
	}, time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w, Created: true}})
	s.NoError(del.err)
	var appErr *temporal.ApplicationError
	s.Require().True(errors.As(start.err, &appErr), "got %v / %v", start.err, start.reject)
	s.Equal(ErrTypeNotFound, appErr.Type())
	s.True(s.env.IsWorkflowCompleted())
}
