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
	"go.temporal.io/sdk/testsuite"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/internal/state"
)

// realActivities is a test environment whose activities are the real ones,
// on a real node over the memory store (wrapped by wrap when not nil).
func realActivities(t *testing.T, wrap func(state.Store) state.Store) (*testsuite.TestWorkflowEnvironment, *nodetest.Fixture, *activities.Activities) {
	t.Helper()
	f := nodetest.NewOnStore(t, wrap)
	acts := &activities.Activities{Catalog: f.Catalog, Node: f.Node, Events: f.Events}
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestWorkflowEnvironment()
	env.RegisterActivity(acts)
	return env, f, acts
}

// stageCode stages body as an upload and returns its reference.
func stageCode(t *testing.T, f *nodetest.Fixture, body string) catalog.CodeRef {
	t.Helper()
	sha, err := f.Catalog.StageCode(context.Background(), []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return catalog.CodeRef{SHA256: sha, SourceKind: "content"}
}

func testWorker() catalog.Worker {
	return catalog.Worker{ID: "w1", MIMEType: nodetest.MIMEType, Topic: "in", Status: catalog.StatusStopped}
}

// Issue 43 item 1: an Apply attempt that was given up (its node paused
// past the heartbeat timeout) and retried elsewhere may still write when
// its node resumes. Its write is refused: it neither turns a later stop
// back into running nor brings the deleted worker back (record, index or
// the node serving it).
func TestStaleApplyDoesNotResurrectADeletedWorker(t *testing.T) {
	env, f, acts := realActivities(t, nil)
	ctx := context.Background()
	var mu sync.Mutex
	var applies []activities.ApplyInput
	env.OnActivity(a.Apply, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.ApplyInput) (activities.Applied, error) {
		mu.Lock()
		applies = append(applies, in)
		mu.Unlock()
		return acts.Apply(ctx, in)
	})
	ref := stageCode(t, f, "good")
	var create, stop, del updater
	var lateOverStop error
	var afterLate catalog.Worker
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(UpdateCreate, "c", callback(&create), CreateRequest{Ref: ref})
	}, time.Second)
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateStop, "s", callback(&stop)) }, 2*time.Second)
	env.RegisterDelayedCallback(func() {
		// The create's first attempt resumes after the stop.
		_, lateOverStop = acts.Apply(ctx, applies[0])
		afterLate, _ = catalog.New(f.Store).GetWorker(ctx, "w1")
	}, 3*time.Second)
	env.RegisterDelayedCallback(func() { env.UpdateWorkflow(UpdateDelete, "d", callback(&del)) }, 4*time.Second)
	env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: testWorker()}})

	for _, u := range []*updater{&create, &stop, &del} {
		if u.reject != nil || u.err != nil {
			t.Fatalf("update: %v %v", u.reject, u.err)
		}
	}
	if !env.IsWorkflowCompleted() || env.GetWorkflowError() != nil {
		t.Fatalf("workflow: %v", env.GetWorkflowError())
	}
	if lateOverStop == nil || afterLate.Status != catalog.StatusStopped {
		t.Fatalf("a late create over the stop: %v, record %+v; want it refused and the worker stopped", lateOverStop, afterLate)
	}
	// Every Apply the workflow made resumes after the delete.
	for _, in := range applies {
		if _, err := acts.Apply(ctx, in); err == nil {
			t.Errorf("late Apply of revision %d (%s) after the delete succeeded", in.Worker.Revision, in.Worker.Status)
		}
	}
	cat := catalog.New(f.Store)
	if w, err := cat.GetWorker(ctx, "w1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("deleted worker is back in the catalog: %+v %v", w, err)
	}
	if ids, _ := cat.WorkerIDs(ctx); slices.Contains(ids, "w1") {
		t.Fatalf("deleted worker is back in the index: %v", ids)
	}
	if f.Dispatcher.Attached("w1") {
		t.Fatal("the node serves the deleted worker")
	}
}

// outageStore fails the calls of the catalog's worker, index and tenant
// index keys for a while: the outage begins at the first Put that trigger
// picks (that Put fails, or is made when after is set) and lasts for calls
// failed calls.
type outageStore struct {
	state.Store
	trigger func(key string) bool
	after   bool
	mu      sync.Mutex
	begun   bool
	calls   int
}

func (o *outageStore) fails(key string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.begun || o.calls == 0 {
		return false
	}
	for _, p := range []string{"workers/", "index/", "tenant-index/"} {
		if strings.HasPrefix(key, state.KeyPrefix+p) {
			o.calls--
			return true
		}
	}
	return false
}

func (o *outageStore) Get(ctx context.Context, key string) (state.Item, error) {
	if o.fails(key) {
		return state.Item{}, fmt.Errorf("state get %q: redis: connection refused", key)
	}
	return o.Store.Get(ctx, key)
}

func (o *outageStore) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	o.mu.Lock()
	start := !o.begun && o.trigger(key)
	o.begun = o.begun || start
	o.mu.Unlock()
	if start && o.after {
		return o.Store.Put(ctx, key, value, opts)
	}
	if o.fails(key) {
		return fmt.Errorf("state put %q: redis: connection refused", key)
	}
	return o.Store.Put(ctx, key, value, opts)
}

func (o *outageStore) Delete(ctx context.Context, key, etag string) error {
	if o.fails(key) {
		return fmt.Errorf("state delete %q: redis: connection refused", key)
	}
	return o.Store.Delete(ctx, key, etag)
}

// Issue 43 item 3: a state-store outage that begins at the create's index
// write (that write failing, or made) and outlasts Apply's retries and
// the usual retries of the read-back leaves no zombie: the create fails
// and leaves nothing behind (no record, no index entry, not served), or
// it succeeds and the worker is whole. A create of the id in a new run is
// not refused as "already exists".
func TestFailedCreateLeavesNoZombie(t *testing.T) {
	for _, indexWritten := range []bool{false, true} {
		t.Run(fmt.Sprintf("index written %v", indexWritten), func(t *testing.T) {
			wrap := func(st state.Store) state.Store {
				return &outageStore{Store: st, after: indexWritten, calls: 16,
					trigger: func(key string) bool { return strings.HasPrefix(key, state.KeyPrefix+"index/") }}
			}
			env, f, acts := realActivities(t, wrap)
			ctx := context.Background()
			ref := stageCode(t, f, "good")
			var create updater
			env.RegisterDelayedCallback(func() {
				env.UpdateWorkflow(UpdateCreate, "c", callback(&create), CreateRequest{Ref: ref})
			}, time.Second)
			env.ExecuteWorkflow(WorkerWorkflow, WorkerInput{State: WorkerState{Worker: testWorker()}})

			cat := catalog.New(f.Store)
			w, err := cat.GetWorker(ctx, "w1")
			ids, _ := cat.WorkerIDs(ctx)
			if create.err == nil {
				if err != nil || w.Status != catalog.StatusRunning || !slices.Contains(ids, "w1") || !f.Dispatcher.Attached("w1") {
					t.Fatalf("create answered OK, but record %+v %v, index %v, served %v", w, err, ids, f.Dispatcher.Attached("w1"))
				}
				return
			}
			if !errors.Is(err, catalog.ErrNotFound) || slices.Contains(ids, "w1") || f.Dispatcher.Attached("w1") {
				t.Fatalf("create failed (%v), but left record %+v (%v), index %v, served %v", create.err, w, err, ids, f.Dispatcher.Attached("w1"))
			}
			in := activities.PrepareCodeInput{Worker: testWorker(), Ref: ref, Create: true}
			if _, err := acts.PrepareCode(ctx, in); failure.Kind(err) == failure.AlreadyExists {
				t.Fatalf("a new create is refused: %v", err)
			}
		})
	}
}
