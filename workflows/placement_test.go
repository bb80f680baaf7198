package workflows

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/placement"
)

// A move is make before break: the node that gains a topic converges
// (attaches and subscribes) before the old node's FinishMoves, and the node
// that loses it converges only after; a drain signalled meanwhile is
// recorded before the next plan.
func TestPlacementMovesMakeBeforeBreak(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterActivity(&activities.Activities{})
	var (
		mu    sync.Mutex
		calls []string
		plans int
	)
	record := func(c string) {
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
	}
	env.OnActivity(a.PlanPlacement, mock.Anything).Return(func(context.Context) (placement.Round, error) {
		mu.Lock()
		plans++
		first := plans == 1
		mu.Unlock()
		record("plan")
		if !first {
			return placement.Round{}, nil
		}
		return placement.Round{Revision: 7, Moves: []placement.Move{{Topic: "t", Add: []string{"n2"}, Remove: []string{"n1"}}},
			Gaining: []placement.NodeTopics{{Node: "n2", Topics: []string{"t"}}}, Losing: []placement.NodeTopics{{Node: "n1", Topics: []string{"t"}}}, Live: []string{"n1", "n2"}}, nil
	})
	env.OnActivity(a.ConvergePlacement, mock.Anything).Return(func(ctx context.Context) (activities.ConvergeResult, error) {
		record("converge " + strings.TrimPrefix(activity.GetInfo(ctx).TaskQueue, "workmanager-node-"))
		return activities.ConvergeResult{}, nil
	})
	env.OnActivity(a.FinishMoves, mock.Anything, mock.Anything).Return(func(_ context.Context, topics []string) (int64, error) {
		record("finish " + strings.Join(topics, ","))
		return 8, nil
	})
	env.OnActivity(a.SetDrained, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.DrainInput) error {
		record("drain " + in.Node)
		return nil
	})
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(PlacementSignal, PlacementRequest{Reason: "test", Drain: &activities.DrainInput{Node: "n3", Drained: true}})
	}, time.Second)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 3*time.Second)
	env.ExecuteWorkflow(PlacementWorkflow, PlacementInput{Interval: 10 * time.Second})
	mu.Lock()
	defer mu.Unlock()
	want := []string{"plan", "converge n2", "finish t", "converge n1", "drain n3", "plan"}
	if strings.Join(calls, "|") != strings.Join(want, "|") {
		t.Fatalf("calls %q, want %q", calls, want)
	}
}

// The workflow continues as new after a bounded number of rounds, so that
// its history stays small however long the cluster runs.
func TestPlacementContinuesAsNew(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterActivity(&activities.Activities{})
	env.OnActivity(a.PlanPlacement, mock.Anything).Return(placement.Round{}, nil)
	env.ExecuteWorkflow(PlacementWorkflow, PlacementInput{Interval: time.Second})
	var can *workflow.ContinueAsNewError
	if err := env.GetWorkflowError(); err == nil || !errors.As(err, &can) {
		t.Fatalf("workflow ended with %v, want continue-as-new", err)
	}
}

// A node that gains a topic and does not converge (it died, its load
// failed) keeps the move open: the old node is not let go (FinishMoves is
// not called for that topic), a dead node is not asked at all.
func TestPlacementKeepsTheOldNodeWhenTheNewOneFails(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterActivity(&activities.Activities{})
	var (
		mu       sync.Mutex
		finished []string
		asked    []string
		plans    int
	)
	env.OnActivity(a.PlanPlacement, mock.Anything).Return(func(context.Context) (placement.Round, error) {
		mu.Lock()
		defer mu.Unlock()
		plans++
		if plans > 1 {
			return placement.Round{}, nil
		}
		return placement.Round{Revision: 3, Live: []string{"old", "new-ok", "new-bad"},
			Moves: []placement.Move{
				{Topic: "t-ok", Add: []string{"new-ok"}, Remove: []string{"old"}},
				{Topic: "t-bad", Add: []string{"new-bad"}, Remove: []string{"old"}},
				{Topic: "t-dead", Add: []string{"new-ok"}, Remove: []string{"dead"}},
			},
			Gaining: []placement.NodeTopics{{Node: "new-bad", Topics: []string{"t-bad"}}, {Node: "new-ok", Topics: []string{"t-ok", "t-dead"}}},
			Losing:  []placement.NodeTopics{{Node: "dead", Topics: []string{"t-dead"}}, {Node: "old", Topics: []string{"t-ok", "t-bad"}}}}, nil
	})
	env.OnActivity(a.ConvergePlacement, mock.Anything).Return(func(ctx context.Context) (activities.ConvergeResult, error) {
		q := strings.TrimPrefix(activity.GetInfo(ctx).TaskQueue, "workmanager-node-")
		mu.Lock()
		asked = append(asked, q)
		mu.Unlock()
		if q == "new-bad" {
			return activities.ConvergeResult{}, errors.New("load failed")
		}
		return activities.ConvergeResult{}, nil
	})
	env.OnActivity(a.FinishMoves, mock.Anything, mock.Anything).Return(func(_ context.Context, topics []string) (int64, error) {
		mu.Lock()
		finished = append(finished, topics...)
		mu.Unlock()
		return 4, nil
	})
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 2*time.Second)
	env.ExecuteWorkflow(PlacementWorkflow, PlacementInput{Interval: 10 * time.Second})
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(finished, ",") != "t-ok,t-dead" {
		t.Fatalf("finished %v: want t-ok and t-dead only (t-bad's new node failed)", finished)
	}
	if slices.Contains(asked, "dead") {
		t.Fatalf("a node that is not live was asked to converge: %v", asked)
	}
}

// The plan update is answered by a round that began after it, with the
// record's revision: a starting node waits for the plan that counts it.
func TestPlacementPlanUpdateWaitsForAFreshRound(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.RegisterActivity(&activities.Activities{})
	var (
		mu    sync.Mutex
		plans int
	)
	env.OnActivity(a.PlanPlacement, mock.Anything).Return(func(context.Context) (placement.Round, error) {
		mu.Lock()
		defer mu.Unlock()
		plans++
		if plans == 2 {
			return placement.Round{Revision: 42}, nil // the round the update asked for
		}
		return placement.Round{}, nil
	})
	var (
		got    int64
		gotErr error
	)
	env.RegisterDelayedCallback(func() {
		env.UpdateWorkflow(PlacementUpdatePlan, "node-b", &testsuite.TestUpdateCallback{
			OnAccept: func() {},
			OnReject: func(err error) { gotErr = err },
			OnComplete: func(v any, err error) {
				gotErr = err
				if err == nil {
					got = v.(int64)
				}
			},
		})
	}, 2*time.Second)
	env.RegisterDelayedCallback(func() { env.CancelWorkflow() }, 30*time.Second)
	env.ExecuteWorkflow(PlacementWorkflow, PlacementInput{Interval: time.Hour})
	mu.Lock()
	defer mu.Unlock()
	if gotErr != nil || got != 42 || plans < 2 {
		t.Fatalf("update answered %d, %v after %d plans (want revision 42 from the round it asked for)", got, gotErr, plans)
	}
}
