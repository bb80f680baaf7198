package workflows

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/state"
)

// Issue 43 item 7: events and history agree with the answers.

// brokenNode answers Activate as node n failing (a detach that times out)
// while *broken, and every other node applying the change.
func (s *WorkerWorkflowSuite) brokenNode(n string, broken *bool) func(context.Context, string) error {
	return func(ctx context.Context, _ string) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if activity.GetInfo(ctx).TaskQueue == NodeTaskQueue(n) && *broken {
			return errors.New("detach: context deadline exceeded")
		}
		return nil
	}
}

func (s *WorkerWorkflowSuite) setBroken(broken *bool, v bool) {
	s.mu.Lock()
	*broken = v
	s.mu.Unlock()
}

func flat(kinds [][]lifecycleevents.Kind) []lifecycleevents.Kind {
	var out []lifecycleevents.Kind
	for _, ks := range kinds {
		out = append(out, ks...)
	}
	return out
}

func countKind(kinds []lifecycleevents.Kind, k lifecycleevents.Kind) int {
	n := 0
	for _, x := range kinds {
		if x == k {
			n++
		}
	}
	return n
}

// A stop that failed as not applied (a live node did not detach), then a
// LoadCode that every node applied (which brings every node to the
// record: stopped, new code), then the stop repeated and answered OK: the
// stop answered OK has its "stopped" event, published once it was true
// and only once.
func (s *WorkerWorkflowSuite) TestStopAnsweredOKAfterALoadHasItsEvent() {
	var ev events
	env := s.recordingEnv(&ev)
	env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	broken := true
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(s.brokenNode("n2", &broken))
	var stop, load, again updater
	var afterLoad []lifecycleevents.Kind
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
	env.RegisterDelayedCallback(func() {
		s.setBroken(&broken, false)
		env.UpdateWorkflow(UpdateLoadCode, "l1", callback(&load), catalog.CodeRef{SHA256: sha2, SourceKind: "content"})
	}, 2*time.Minute)
	env.RegisterDelayedCallback(func() {
		s.mu.Lock()
		afterLoad = flat(ev.kinds)
		s.mu.Unlock()
		env.UpdateWorkflow(UpdateStop, "s2", callback(&again))
	}, 3*time.Minute)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 4*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}})

	s.Require().Error(stop.err)
	s.Equal(NotApplied, failure.Kind(stop.err))
	s.Require().NoError(load.err)
	s.Require().NoError(again.err)
	all := flat(ev.kinds)
	s.Equal(1, countKind(all, lifecycleevents.Stopped), "the stop answered OK has its event, once: %v", ev.kinds)
	s.Equal(1, countKind(all, lifecycleevents.CodeUpdated), "%v", ev.kinds)
	s.Equal(lifecycleevents.Error, all[0], "the failed stop's not_applied comes first: %v", ev.kinds)
	s.Contains(afterLoad, lifecycleevents.Stopped, "once every node applied the record (stopped), stopped is true and announced: %v", afterLoad)
}

// A stop and then a LoadCode that both failed as not applied, then the
// stop repeated once the node is back: the repeat tries the nodes again
// and is answered OK only with "stopped" published; the load, now
// applied everywhere too, gets its "code_updated".
func (s *WorkerWorkflowSuite) TestStopRepeatedAfterAFailedLoadPublishesStopped() {
	var ev events
	env := s.recordingEnv(&ev)
	env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	broken := true
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(s.brokenNode("n2", &broken))
	var stop, load, again updater
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(UpdateLoadCode, "l1", callback(&load), catalog.CodeRef{SHA256: sha2, SourceKind: "content"})
	}, 2*time.Minute)
	env.RegisterDelayedCallback(func() {
		s.setBroken(&broken, false)
		env.UpdateWorkflow(UpdateStop, "s2", callback(&again))
	}, 3*time.Minute)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 4*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}})

	s.Equal(NotApplied, failure.Kind(stop.err), "got %v", stop.err)
	s.Equal(NotApplied, failure.Kind(load.err), "got %v", load.err)
	s.Require().NoError(again.err)
	all := flat(ev.kinds)
	s.Equal([]lifecycleevents.Kind{lifecycleevents.Error, lifecycleevents.Error}, all[:2], "%v", ev.kinds)
	s.Equal(1, countKind(all, lifecycleevents.Stopped), "the repeated stop answered OK has its event: %v", ev.kinds)
	s.Equal(1, countKind(all, lifecycleevents.CodeUpdated), "the load is applied everywhere now: %v", ev.kinds)
}

// A stop that failed as not applied, then a start that every node applied:
// "stopped" is no longer true and is never published; a later stop that
// every node applies is announced as usual.
func (s *WorkerWorkflowSuite) TestAStartSupersedesAnUnannouncedStop() {
	var ev events
	env := s.recordingEnv(&ev)
	env.OnActivity(a.ListNodes, mock.Anything).Return([]string{"n1", "n2"}, nil)
	broken := true
	env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(s.brokenNode("n2", &broken))
	var stop, start, again updater
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s1", callback(&stop)) }, time.Second)
	env.RegisterDelayedCallback(func() {
		s.setBroken(&broken, false)
		env.UpdateWorkflow(UpdateStart, "st", callback(&start))
	}, 2*time.Minute)
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s2", callback(&again)) }, 3*time.Minute)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 4*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: runningWorker(), Created: true}})

	s.Equal(NotApplied, failure.Kind(stop.err), "got %v", stop.err)
	s.Require().NoError(start.err)
	s.Require().NoError(again.err)
	s.Equal([][]lifecycleevents.Kind{{lifecycleevents.Error}, {lifecycleevents.Started}, {lifecycleevents.Stopped}}, ev.kinds)
}

// recordFails is a store whose Put of worker w1's record fails while the
// record has code sha: a LoadCode of that code fails after its history
// entry was written, before its record (the commit point).
type recordFails struct {
	state.Store
	mu  sync.Mutex
	sha string
}

func (r *recordFails) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	r.mu.Lock()
	sha := r.sha
	r.mu.Unlock()
	if key == state.KeyPrefix+"workers/w1" && sha != "" && strings.Contains(string(value), `"code_sha256":"`+sha+`"`) {
		return fmt.Errorf("state put %q: redis: connection refused", key)
	}
	return r.Store.Put(ctx, key, value, opts)
}

// A LoadCode that failed before its record was saved (its history entry
// was written) leaves no version in the history that GetWorkerHistory
// and RollbackWorker read, and the next LoadCode takes its number: the
// history shows only what was applied, numbered without gaps. A late
// write of the failed load's entry never replaces the one applied.
func TestFailedLoadCodeLeavesNoVersionInTheHistory(t *testing.T) {
	var rf *recordFails
	env, f, acts := realActivities(t, func(st state.Store) state.Store {
		rf = &recordFails{Store: st}
		return rf
	})
	ctx := context.Background()
	var mu sync.Mutex
	var applies []activities.ApplyInput
	env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.ApplyInput) (activities.Applied, error) {
		mu.Lock()
		applies = append(applies, in)
		mu.Unlock()
		return acts.Apply(ctx, in)
	})
	good := stageCode(t, f, "good")
	bad := stageCode(t, f, "failing")
	later := stageCode(t, f, "later")
	rf.mu.Lock()
	rf.sha = bad.SHA256
	rf.mu.Unlock()
	cat := catalog.New(f.Store)
	var create, failed, ok updater
	var afterFailed []catalog.HistoryEntry
	var afterFailedErr error
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateCreate, "c", callback(&create), CreateRequest{Ref: good}) }, time.Second)
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateLoadCode, "l1", callback(&failed), bad) }, 2*time.Second)
	env.RegisterDelayedCallback(func() {
		afterFailed, afterFailedErr = cat.History(ctx, "w1")
		env.UpdateWorkflow(UpdateLoadCode, "l2", callback(&ok), later)
	}, 10*time.Minute)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 20*time.Minute)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: testWorker()}})

	if create.err != nil || ok.err != nil {
		t.Fatalf("create %v, load %v", create.err, ok.err)
	}
	if failed.err == nil {
		t.Fatal("the load whose record could not be saved answered OK")
	}
	if afterFailedErr != nil || len(afterFailed) != 1 || afterFailed[0].Version != 1 {
		t.Fatalf("history after the failed load: %+v %v; want version 1 only", afterFailed, afterFailedErr)
	}
	w, err := cat.GetWorker(ctx, "w1")
	if err != nil || w.CodeVersion != 2 || w.CodeSHA256 != later.SHA256 {
		t.Fatalf("record %+v %v; want version 2 = the later code", w, err)
	}
	if got := ok.result.(catalog.Worker).CodeVersion; got != 2 {
		t.Fatalf("the next load answered version %d, want 2 (the failed load's number)", got)
	}
	h, err := cat.History(ctx, "w1")
	var got []string
	for _, e := range h {
		got = append(got, fmt.Sprintf("%d=%s", e.Version, e.SHA256[:8]))
	}
	want := []string{"1=" + good.SHA256[:8], "2=" + later.SHA256[:8]}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("history %v %v; want %v", got, err, want)
	}

	// The failed load's entry written again late (an attempt past its
	// checks when its node paused) does not replace the applied one.
	var late *catalog.HistoryEntry
	mu.Lock()
	for _, in := range applies {
		if in.History != nil && in.History.SHA256 == bad.SHA256 {
			late = in.History
		}
	}
	mu.Unlock()
	if late == nil {
		t.Fatal("no Apply of the failed load")
	}
	if err := f.Catalog.AppendHistory(ctx, "w1", *late); !errors.Is(err, catalog.ErrStale) {
		t.Errorf("late history write of the failed load: %v, want ErrStale", err)
	}
	if h, _ := cat.History(ctx, "w1"); len(h) != 2 || h[1].SHA256 != later.SHA256 {
		t.Fatalf("history after the late write: %+v", h)
	}
}
