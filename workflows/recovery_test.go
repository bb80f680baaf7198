package workflows

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
)

// recoveryEnv is a test environment whose catalog holds workers w0..w(n-1),
// minus the deleted ones; Activate fails for the broken ones.
type recoveryEnv struct {
	env       *testsuite.TestWorkflowEnvironment
	mu        sync.Mutex // the activities' fakes run on goroutines of their own
	ids       []string
	batches   [][]string
	activated []string
	children  int
	fromStale int   // children not told to re-read the record (WorkerInput.Recovered unset)
	pages     []int // index pages listed, in order
	onPage    func(id string) int
	getErr    error // GetWorkers fails with it when set
	// slowIDs' Activate takes slowFor (workflow time) every attempt, then
	// fails when slowFails is set (a worker that cannot load in time).
	slowIDs   map[string]bool
	slowFor   time.Duration
	slowFails bool
	infos     []activity.Info        // Activate attempts' activity info
	emitted   []activities.EmitInput // events recovery published
}

func newRecoveryEnv(n int, deleted, broken map[string]bool) *recoveryEnv {
	var s testsuite.WorkflowTestSuite
	r := &recoveryEnv{env: s.NewTestWorkflowEnvironment()}
	r.env.RegisterActivity(&activities.Activities{})
	r.env.RegisterWorkflow(WorkerWorkflow)
	for i := range n {
		r.ids = append(r.ids, fmt.Sprintf("w%d", i))
	}
	r.onPage = func(string) int { return 0 } // every id on page 0 unless a test spreads them
	r.env.OnActivity(a.ListWorkerIDsPage, mock.Anything, mock.Anything).Return(func(_ context.Context, page int) ([]string, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.pages = append(r.pages, page)
		var ids []string
		for _, id := range r.ids {
			if r.onPage(id) == page {
				ids = append(ids, id)
			}
		}
		return ids, nil
	})
	r.env.OnActivity(a.ListWorkerIDsChunk, mock.Anything, mock.Anything).Return(func(_ context.Context, cur catalog.IndexCursor) (catalog.IndexChunk, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.pages = append(r.pages, cur.Page)
		ch := catalog.IndexChunk{Next: catalog.IndexCursor{Page: cur.Page + 1}}
		for _, id := range r.ids { // a page's ids in one chunk
			if r.onPage(id) == cur.Page {
				ch.IDs = append(ch.IDs, id)
			}
		}
		return ch, nil
	})
	r.env.OnActivity(a.GetWorkers, mock.Anything, mock.Anything).Return(
		func(_ context.Context, ids []string) ([]catalog.Worker, error) {
			if r.getErr != nil {
				return nil, r.getErr
			}
			r.mu.Lock()
			r.batches = append(r.batches, ids)
			r.mu.Unlock()
			var ws []catalog.Worker
			for _, id := range ids {
				if !deleted[id] {
					ws = append(ws, catalog.Worker{ID: id, Topic: "in", Status: catalog.StatusRunning})
				}
			}
			return ws, nil
		})
	r.env.OnWorkflow(WorkerWorkflow, mock.Anything, mock.Anything).Return(
		func(_ workflow.Context, in WorkerInput) (WorkerState, error) {
			r.children++
			if !in.Recovered {
				r.fromStale++
			}
			return WorkerState{}, nil
		})
	r.env.OnActivity(a.Emit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.EmitInput) error {
		r.mu.Lock()
		r.emitted = append(r.emitted, in)
		r.mu.Unlock()
		return nil
	})
	r.env.OnActivity(a.Activate, mock.Anything, mock.MatchedBy(func(id string) bool { return r.slowIDs[id] })).AfterFn(func() time.Duration { return r.slowFor }).Return(
		func(ctx context.Context, id string) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.infos = append(r.infos, activity.GetInfo(ctx))
			if r.slowFails {
				return errors.New("engine load timed out")
			}
			r.activated = append(r.activated, id)
			return nil
		})
	r.env.OnActivity(a.Activate, mock.Anything, mock.Anything).Return(func(ctx context.Context, id string) error {
		r.mu.Lock()
		r.infos = append(r.infos, activity.GetInfo(ctx))
		r.mu.Unlock()
		if broken[id] {
			return failure.New(failure.InvalidArgument, "engine refused the code")
		}
		r.mu.Lock()
		r.activated = append(r.activated, id)
		r.mu.Unlock()
		return nil
	})
	return r
}

// Recovery reads the workers in batches, recovers up to Batch at once,
// continues as new every Run workers started carrying what is left (the
// records read but not started are read again) and the counts, and a
// deleted or broken worker neither stops it nor is counted as recovered.
func TestRecoveryPagesAndContinuesAsNew(t *testing.T) {
	deleted, broken := map[string]bool{"w1": true}, map[string]bool{"w5": true}
	r := newRecoveryEnv(7, deleted, broken)
	r.env.ExecuteWorkflow(RecoveryWorkflow, RecoveryInput{Batch: 2, Run: 4})
	require.True(t, r.env.IsWorkflowCompleted())
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(r.env.GetWorkflowError(), &can), "want continue-as-new, got %v", r.env.GetWorkflowError())
	var next RecoveryInput
	require.NoError(t, converterDecode(can, &next))
	require.Equal(t, RecoveryInput{Chunked: true, Cursor: catalog.IndexCursor{Page: 1}, Pending: []string{"w5", "w6"}, Done: RecoveryResult{Recovered: 4}, Batch: 2, Run: 4}, next)
	require.Equal(t, [][]string{{"w0", "w1"}, {"w2", "w3"}, {"w4", "w5"}}, r.batches)
	require.Equal(t, 4, r.children)
	require.Zero(t, r.fromStale, "every run recovery starts re-reads the catalog first")

	// The next run finishes the list without listing again.
	r2 := newRecoveryEnv(7, deleted, broken)
	r2.env.ExecuteWorkflow(RecoveryWorkflow, next)
	require.True(t, r2.env.IsWorkflowCompleted())
	require.NoError(t, r2.env.GetWorkflowError())
	var res RecoveryResult
	require.NoError(t, r2.env.GetWorkflowResult(&res))
	require.Equal(t, RecoveryResult{Recovered: 5, Failed: 1, FailedIDs: []string{"w5"}}, res)
	require.Equal(t, [][]string{{"w5", "w6"}}, r2.batches)
	require.Equal(t, []string{"w6"}, r2.activated)
	require.Len(t, r2.emitted, 1, "an error event for the broken worker")
	require.Equal(t, "w5", r2.emitted[0].Worker.ID)
	require.Equal(t, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, r2.pages, "the next run goes on with the next page")
}

// Recovery takes the index a page at a time: what it carries through
// continue-as-new is at most one page of ids and the next page number,
// whatever the number of workers, and every worker on every page is
// recovered once.
func TestRecoveryTakesTheIndexAPageAtATime(t *testing.T) {
	const n = 40
	r := newRecoveryEnv(n, nil, nil)
	r.onPage = func(id string) int { // w0..w39 over pages 0, 5 and 15
		var i int
		fmt.Sscanf(id, "w%d", &i)
		return []int{0, 5, 15}[i%3]
	}
	in := RecoveryInput{Batch: 4, Run: 8}
	var activated []string
	for runs := 0; ; runs++ {
		require.Less(t, runs, 20, "recovery never finished")
		r.mu.Lock()
		r.activated = nil
		r.mu.Unlock()
		r.env.ExecuteWorkflow(RecoveryWorkflow, in)
		require.True(t, r.env.IsWorkflowCompleted())
		r.mu.Lock()
		activated = append(activated, r.activated...)
		r.mu.Unlock()
		var can *workflow.ContinueAsNewError
		if !errors.As(r.env.GetWorkflowError(), &can) {
			require.NoError(t, r.env.GetWorkflowError())
			break
		}
		require.NoError(t, converterDecode(can, &in))
		require.LessOrEqual(t, len(in.Pending), 14, "carried more than one page: %v", in.Pending)
		next := newRecoveryEnv(n, nil, nil)
		next.onPage = r.onPage
		r = next
	}
	require.ElementsMatch(t, r.ids, activated)
}

func TestRecoveryOfNoWorkers(t *testing.T) {
	r := newRecoveryEnv(0, nil, nil)
	r.env.ExecuteWorkflow(RecoveryWorkflow, RecoveryInput{})
	require.NoError(t, r.env.GetWorkflowError())
	var res RecoveryResult
	require.NoError(t, r.env.GetWorkflowResult(&res))
	require.Equal(t, RecoveryResult{}, res)
	require.Empty(t, r.batches)
}

// The state store failing is not a broken worker: recovery fails (and the
// node reports Unhealthy) instead of counting everyone as failed.
func TestRecoveryFailsWhenTheCatalogCannotBeRead(t *testing.T) {
	r := newRecoveryEnv(3, nil, nil)
	r.getErr = errors.New("state store unavailable")
	r.env.ExecuteWorkflow(RecoveryWorkflow, RecoveryInput{})
	err := r.env.GetWorkflowError()
	require.Error(t, err)
	require.Contains(t, err.Error(), "state store unavailable")
}

// Only the first MaxFailedIDs failed ids are listed; all are counted.
func TestRecoveryCapsFailedIDs(t *testing.T) {
	n := MaxFailedIDs + 20
	broken := map[string]bool{}
	for i := range n {
		broken[fmt.Sprintf("w%d", i)] = true
	}
	r := newRecoveryEnv(n, nil, broken)
	r.env.ExecuteWorkflow(RecoveryWorkflow, RecoveryInput{Batch: 40, Run: 1000})
	require.NoError(t, r.env.GetWorkflowError())
	var res RecoveryResult
	require.NoError(t, r.env.GetWorkflowResult(&res))
	require.Equal(t, n, res.Failed)
	require.Len(t, res.FailedIDs, MaxFailedIDs)
}
