package workflows

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"github.com/stretchr/testify/suite"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

type WorkerWorkflowSuite struct {
	suite.Suite
	testsuite.WorkflowTestSuite
	env *testsuite.TestWorkflowEnvironment
	// mu guards what fake activities record: the test environment runs
	// activities on goroutines of their own, concurrently.
	mu         sync.Mutex
	emitted    [][]lifecycleevents.Kind // events published by Emit, per call
	emittedIDs []string                 // their ids, in order
}

func TestWorkerWorkflow(t *testing.T) { suite.Run(t, new(WorkerWorkflowSuite)) }

func (s *WorkerWorkflowSuite) SetupTest() {
	s.env = s.NewTestWorkflowEnvironment()
	s.env.RegisterActivity(&activities.Activities{})
	s.emitted, s.emittedIDs = nil, nil
	s.env.OnActivity(a.Emit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.EmitInput) error {
		var ks []lifecycleevents.Kind
		s.mu.Lock()
		for _, e := range in.Events {
			ks = append(ks, e.Kind)
			s.emittedIDs = append(s.emittedIDs, e.ID)
		}
		s.emitted = append(s.emitted, ks)
		s.mu.Unlock()
		return nil
	})
}

// prepareAnyCode answers PrepareCode with the reference it is given.
func (s *WorkerWorkflowSuite) prepareAnyCode(env *testsuite.TestWorkflowEnvironment) {
	env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).Return(
		func(_ context.Context, in activities.PrepareCodeInput) (catalog.CodeRef, error) { return in.Ref, nil })
}

// recordApplies prepares any code and records every Apply, in order.
func (s *WorkerWorkflowSuite) recordApplies() *[]activities.ApplyInput {
	var applied []activities.ApplyInput
	s.prepareAnyCode(s.env)
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.ApplyInput) (activities.Applied, error) {
		s.mu.Lock()
		applied = append(applied, in)
		s.mu.Unlock()
		return activities.Applied{}, nil
	})
	return &applied
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
	applied := s.recordApplies()
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	var statuses []string // WorkerStatus of each upsert of the search attributes
	s.env.OnUpsertTypedSearchAttributes(mock.Anything).Run(func(args mock.Arguments) {
		if v, ok := args.Get(0).(temporal.SearchAttributes).GetKeyword(SAWorkerStatus); ok {
			statuses = append(statuses, v)
		}
	}).Return(nil)

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

	// The repeated stop applied nothing: create, stop, start, load. Events
	// are published after the change reached every node, not by Apply.
	s.Len(*applied, 4)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Created, lifecycleevents.Started}, {lifecycleevents.Stopped}, {lifecycleevents.Started},
		{lifecycleevents.CodeUpdated}, {lifecycleevents.Deleted}}, s.emitted)
	s.Equal(catalog.StatusStopped, (*applied)[1].Worker.Status)
	s.Equal(int64(2), (*applied)[3].History.Version)
	s.Equal("url", (*applied)[3].History.SourceKind)

	var st WorkerState
	s.NoError(s.env.GetWorkflowResult(&st))
	s.True(st.Deleted)
	// Issue 44 item 6: the closed workflow of a deleted worker is not
	// found by a query for RUNNING workers.
	s.Equal([]string{"RUNNING", "STOPPED", "RUNNING", StatusDeleted}, statuses) // create, stop, start; delete
}

func (s *WorkerWorkflowSuite) TestValidatorsRejectWithoutActivities() {
	s.prepareAnyCode(s.env)
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
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

// PrepareCode and Apply go to any node of the shared task queue: they must
// heartbeat, so that a node paused or cut off from Temporal with a poll
// open loses them within ApplyHeartbeat (PrepareCode had none, and a lost
// attempt held a LoadCode for its 3-minute StartToClose: finding 12 of
// docs/reliability.md).
func (s *WorkerWorkflowSuite) TestApplyAndPrepareCodeHaveAHeartbeatTimeout() {
	s.prepareAnyCode(s.env)
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	heartbeat := map[string]time.Duration{}
	s.env.SetOnActivityStartedListener(func(info *activity.Info, _ context.Context, _ converter.EncodedValues) {
		heartbeat[info.ActivityType.Name] = info.HeartbeatTimeout
	})
	var create updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, 2*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	s.NoError(create.err)
	s.Equal(ApplyHeartbeat, heartbeat["Apply"])
	s.Equal(ApplyHeartbeat, heartbeat["PrepareCode"])
}

func (s *WorkerWorkflowSuite) TestFailedCreateEndsWorkflow() {
	s.env.OnActivity(a.PrepareCode, mock.Anything, mock.Anything).Return(catalog.CodeRef{},
		failure.New(failure.InvalidArgument, "SyntaxError: invalid syntax"))
	var create updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	var appErr *temporal.ApplicationError
	s.True(errors.As(create.err, &appErr))
	s.Equal(failure.InvalidArgument, appErr.Type())
	s.True(s.env.IsWorkflowCompleted())
	s.ErrorContains(s.env.GetWorkflowError(), "create failed")
}

func (s *WorkerWorkflowSuite) TestNeverCreatedTimesOut() {
	for _, epoch := range []int{0, CurrentEpoch} {
		env := s.NewTestWorkflowEnvironment()
		env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}, CreateTimeout: time.Minute, Epoch: epoch})
		s.True(env.IsWorkflowCompleted(), "epoch %d", epoch)
		s.ErrorContains(env.GetWorkflowError(), "never created", "epoch %d", epoch)
	}
}

func (s *WorkerWorkflowSuite) TestContinueAsNewCarriesState() {
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
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
// queue; a node whose Activate fails is tried again.
func (s *WorkerWorkflowSuite) TestChangesReachEveryNode() {
	s.prepareAnyCode(s.env)
	s.env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	s.env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	var synced []string
	var emittedBefore []int // how many changes had published their events when a node applied one
	s.env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(func(ctx context.Context, id string) error {
		tq := activity.GetInfo(ctx).TaskQueue
		s.mu.Lock()
		synced = append(synced, tq+":"+id)
		emittedBefore = append(emittedBefore, len(s.emitted))
		s.mu.Unlock()
		if tq == NodeTaskQueue("n2") && activity.GetInfo(ctx).Attempt == 1 {
			return errors.New("node n2 could not read the catalog")
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
	// Four changes, each to both nodes; n2 is tried again each time.
	count := map[string]int{}
	for _, x := range synced {
		count[x]++
	}
	s.Equal(map[string]int{n1: 4, n2: 8}, count)
	// Each change reached the nodes before its events were published.
	s.Equal([]int{0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3}, emittedBefore)
	s.Len(s.emitted, 4)
}

// A create whose events cannot be published after Apply persisted the
// worker is undone: nothing stays in the catalog or on a node.
func (s *WorkerWorkflowSuite) TestCreateUndoneWhenItsEventsCannotBePublished() {
	env := s.NewTestWorkflowEnvironment() // without the suite's Emit mock
	env.RegisterActivity(&activities.Activities{})
	s.prepareAnyCode(env)
	env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(activities.Applied{}, nil)
	var emits []activities.EmitInput
	env.OnActivity(a.Emit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.EmitInput) error {
		emits = append(emits, in)
		return temporal.NewNonRetryableApplicationError("pubsub refused the event", "Refused", nil)
	})
	var deleted []activities.DeleteInput
	env.OnActivity(a.Delete, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.DeleteInput) (activities.Applied, error) {
		deleted = append(deleted, in)
		return activities.Applied{}, nil
	})
	var create updater
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(UpdateCreate, "c", &testsuite.TestUpdateCallback{
			OnReject: func(err error) { create.reject = err }, OnAccept: func() {},
			OnComplete: func(r any, err error) { create.result, create.err = r, err },
		}, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	s.ErrorContains(create.err, "pubsub refused the event")
	s.Require().Len(deleted, 1)
	s.Equal("w1", deleted[0].Worker.ID)
	// Only the refused created/started: nothing was announced, so no "deleted" either.
	s.Require().Len(emits, 1)
	s.Equal(lifecycleevents.Created, emits[0].Events[0].Kind)
	s.True(env.IsWorkflowCompleted())
	s.ErrorContains(env.GetWorkflowError(), "create failed")
}

func TestWorkflowIDIsStable(t *testing.T) {
	require.Equal(t, "workmanager-worker-abc", WorkflowID("abc"))
}

func (s *WorkerWorkflowSuite) TestUpdateQueuedBehindDeleteIsNotFound() {
	s.env.OnActivity(a.Delete, mock.Anything, mock.Anything).After(time.Second).Return(activities.Applied{}, nil)
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
	s.Equal(failure.NotFound, appErr.Type())
	s.True(s.env.IsWorkflowCompleted())
}

// The retry policy given at create (it arrives in the workflow's start
// input, as topic and group do) reaches the stored record, and stays
// through later changes and continue-as-new.
func (s *WorkerWorkflowSuite) TestRetryPolicyReachesTheRecord() {
	applied := s.recordApplies()
	w := newWorker()
	w.MaxAttempts, w.RetryBackoff = 5, 2*time.Second
	var create, stop, load updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateStop, &stop) }, 2*time.Second)
	s.env.RegisterDelayedCallback(func() { s.update(UpdateLoadCode, &load, catalog.CodeRef{SHA256: sha2, SourceKind: "content"}) }, 3*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: w}, ContinueAsNewAfter: 3})
	for _, u := range []*updater{&create, &stop, &load} {
		s.NoError(u.reject)
		s.NoError(u.err)
	}
	s.Require().Len(*applied, 3)
	for _, in := range *applied {
		s.Equal(5, in.Worker.MaxAttempts)
		s.Equal(2*time.Second, in.Worker.RetryBackoff)
	}
	s.Equal(5, create.result.(catalog.Worker).MaxAttempts)
	var can *workflow.ContinueAsNewError
	s.Require().True(errors.As(s.env.GetWorkflowError(), &can), "got %v", s.env.GetWorkflowError())
	var next WorkerInput
	s.NoError(converterDecode(can, &next))
	s.Equal(5, next.State.Worker.MaxAttempts)
	s.Equal(2*time.Second, next.State.Worker.RetryBackoff)
}

// A rollback is a load of an earlier version's code: a new version whose
// history entry says which version it rolls back to and who asked.
func (s *WorkerWorkflowSuite) TestRollbackRecordsWhatAndWho() {
	applied := s.recordApplies()
	var create, load, rollback updater
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateCreate, &create, CreateRequest{Ref: catalog.CodeRef{SHA256: sha1, SourceKind: "content", Actor: "alice"}})
	}, time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateLoadCode, &load, catalog.CodeRef{SHA256: sha2, SourceKind: "content", Actor: "bob"})
	}, 2*time.Second)
	s.env.RegisterDelayedCallback(func() {
		s.update(UpdateLoadCode, &rollback, catalog.CodeRef{SHA256: sha1, SourceKind: "content", RollbackTo: 1, Actor: "carol"})
	}, 3*time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, 4*time.Second)
	s.env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: newWorker()}})
	for _, u := range []*updater{&create, &load, &rollback} {
		s.NoError(u.reject)
		s.NoError(u.err)
	}
	w := rollback.result.(catalog.Worker)
	s.Equal(int64(3), w.CodeVersion)
	s.Equal(sha1, w.CodeSHA256)
	s.Len(*applied, 3)
	var got []catalog.HistoryEntry
	for _, in := range *applied {
		h := *in.History
		s.Equal(in.Worker.Revision, h.Revision, "an entry carries its change's record revision")
		h.CreatedAt, h.Revision = time.Time{}, 0
		got = append(got, h)
	}
	s.Equal([]catalog.HistoryEntry{
		{Version: 1, SHA256: sha1, SourceKind: "content", Actor: "alice", Action: catalog.HistoryCreate},
		{Version: 2, SHA256: sha2, SourceKind: "content", Actor: "bob", Action: catalog.HistoryLoadCode},
		{Version: 3, SHA256: sha1, SourceKind: "content", Actor: "carol", Action: catalog.HistoryRollback, RollbackTo: 1},
	}, got)
}
