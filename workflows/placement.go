package workflows

import (
	"context"
	"fmt"
	"slices"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/placement"
)

// PlacementWorkflowID is the one placement workflow of the cluster.
const PlacementWorkflowID = "workmanager-placement"

// PlacementSignal wakes the placement workflow (PlacementRequest): a node
// started, a node is drained or undrained.
const PlacementSignal = "placement"

// PlacementUpdatePlan is the placement workflow's update that asks for a
// round and answers once a round that began after it finished (the
// revision the record has then): a starting node waits for it, so that it
// recovers the share the plan that counts it gives it (PlanNow).
const PlacementUpdatePlan = "plan"

// PlacementRequest is the placement workflow's signal.
type PlacementRequest struct {
	// Reason says who asks (logged).
	Reason string
	// Drain, when set, drains or undrains a node before the plan.
	Drain *activities.DrainInput `json:",omitempty"`
}

// PlacementInput configures the placement workflow.
type PlacementInput struct {
	// Interval is how often it plans when nothing wakes it (0:
	// DefaultPlacementInterval).
	Interval time.Duration
}

// DefaultPlacementInterval is how often the placement workflow plans again
// (PLACEMENT_INTERVAL): a node that died is noticed within its membership
// TTL (3 heartbeats) plus this.
const DefaultPlacementInterval = 5 * time.Second

// placementRoundsPerRun bounds one run's history (about 6 events a quiet
// round) before it continues as new.
const placementRoundsPerRun = 300

// PlacementWorkflow decides which nodes serve which topics (issue 45). In
// rounds, woken by a signal or every Interval, it plans the placement
// record again from the running workers and the live nodes
// (activities.PlanPlacement: rendezvous hashing with bounded load and
// constraints, moves rate-limited) and carries the moves out make before
// break: the nodes that gain a topic attach its workers and subscribe
// (ConvergePlacement on each node's own task queue) while the old nodes
// still serve it; only then FinishMoves lets the old nodes go, and they
// converge in turn. A node that does not pick its task up (dead, paused)
// is skipped: it follows the record when it comes back, and a dead one is
// planned away at the next round. Creates and starts do not wait for it:
// their Apply places a new topic at once (placement.Placer.Ensure).
func PlacementWorkflow(ctx workflow.Context, in PlacementInput) error {
	log := workflow.GetLogger(ctx)
	interval := in.Interval
	if interval <= 0 {
		interval = DefaultPlacementInterval
	}
	sig := workflow.GetSignalChannel(ctx, PlacementSignal)
	// Rounds asked for by the plan update: done counts finished rounds,
	// running tells one is under way (a round that began before the ask
	// does not answer it), revision is the record's after the last plan.
	var (
		done, revision int64
		running, asked bool
	)
	wake := workflow.NewBufferedChannel(ctx, 1)
	if err := workflow.SetUpdateHandler(ctx, PlacementUpdatePlan, func(ctx workflow.Context) (int64, error) {
		want := done + 1
		if running {
			want++
		}
		if !asked {
			asked = true
			wake.SendAsync(true)
		}
		if err := workflow.Await(ctx, func() bool { return done >= want }); err != nil {
			return 0, err
		}
		return revision, nil
	}); err != nil {
		return err
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: 2 * time.Minute,
		HeartbeatTimeout:    30 * time.Second,
		RetryPolicy:         &temporal.RetryPolicy{InitialInterval: time.Second, BackoffCoefficient: 2, MaximumInterval: 30 * time.Second},
	})
	for round := 0; round < placementRoundsPerRun || asked; round++ {
		var reqs []PlacementRequest
		if round > 0 && !asked {
			timer := workflow.NewTimer(ctx, interval)
			sel := workflow.NewSelector(ctx)
			sel.AddFuture(timer, func(workflow.Future) {})
			sel.AddReceive(sig, func(c workflow.ReceiveChannel, _ bool) {
				var r PlacementRequest
				c.Receive(ctx, &r)
				reqs = append(reqs, r)
			})
			sel.AddReceive(wake, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
			sel.Select(ctx)
		}
		wake.ReceiveAsync(nil)
		running, asked = true, false
		roundDone := func() { running = false; done++ }
		for {
			var r PlacementRequest
			if !sig.ReceiveAsync(&r) {
				break
			}
			reqs = append(reqs, r)
		}
		for _, r := range reqs {
			if r.Drain == nil {
				continue
			}
			if err := workflow.ExecuteActivity(actx, a.SetDrained, *r.Drain).Get(ctx, nil); err != nil {
				log.Error("drain not recorded", "node", r.Drain.Node, "err", err)
			}
		}
		var plan placement.Round
		if err := workflow.ExecuteActivity(actx, a.PlanPlacement).Get(ctx, &plan); err != nil {
			log.Warn("placement not planned; trying again next round", "err", err)
			roundDone()
			continue
		}
		if plan.Revision == 0 {
			roundDone()
			continue
		}
		revision = plan.Revision
		log.Info("placement planned", "revision", plan.Revision, "moves", len(plan.Moves), "nodes", plan.Nodes)
		failed := converge(ctx, plan.Gaining, plan.Live)
		// Make before break: a topic's old nodes let go only once every
		// node that gained it attached it; the others keep serving it
		// (Leaving) until a later round.
		var moved []string
		for _, m := range plan.Moves {
			if len(m.Remove) > 0 && !slices.ContainsFunc(m.Add, func(n string) bool { return failed[n] }) {
				moved = append(moved, m.Topic)
			}
		}
		if len(moved) > 0 {
			if err := workflow.ExecuteActivity(actx, a.FinishMoves, moved).Get(ctx, &revision); err != nil {
				log.Warn("moves not finished; the old nodes serve on until the next round", "err", err)
				roundDone()
				continue
			}
		}
		converge(ctx, plan.Losing, plan.Live)
		roundDone()
	}
	// Every plan update asked before now was answered by a round; let the
	// handlers return before the run ends.
	if err := workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) }); err != nil {
		return err
	}
	// A drain signalled since the last round is recorded before the run
	// continues as new (an unreceived signal would be lost with the run).
	for {
		var r PlacementRequest
		if !sig.ReceiveAsync(&r) {
			break
		}
		if r.Drain != nil {
			if err := workflow.ExecuteActivity(actx, a.SetDrained, *r.Drain).Get(ctx, nil); err != nil {
				log.Error("drain not recorded", "node", r.Drain.Node, "err", err)
			}
		}
	}
	return workflow.NewContinueAsNewError(ctx, PlacementWorkflow, in)
}

// converge runs ConvergePlacement on each live node of nodes (its own task
// queue) and waits for them all; a node that fails or does not pick the
// task up is logged, returned and left to follow the record by itself (a
// node no longer live is not asked: it is dead, or follows the record when
// it comes back).
func converge(ctx workflow.Context, nodes []placement.NodeTopics, live []string) map[string]bool {
	failed := map[string]bool{}
	var ids []string
	for _, n := range nodes {
		if slices.Contains(live, n.Node) {
			ids = append(ids, n.Node)
		} else {
			failed[n.Node] = true
		}
	}
	futures := make([]workflow.Future, len(ids))
	for i, id := range ids {
		// A node that dies in the middle is noticed after
		// ConvergeHeartbeat, not after the whole timeout: the round goes
		// on without it.
		nctx := onNode(ctx, id, ConvergeHeartbeat, &temporal.RetryPolicy{InitialInterval: 500 * time.Millisecond, BackoffCoefficient: 2, MaximumAttempts: 2})
		futures[i] = workflow.ExecuteActivity(nctx, a.ConvergePlacement)
	}
	for i, f := range futures {
		if err := f.Get(ctx, nil); err != nil {
			failed[ids[i]] = true
			workflow.GetLogger(ctx).Warn("node did not converge to the placement; it follows the record by itself", "node_id", ids[i], "err", err)
		}
	}
	return failed
}

// ConvergeHeartbeat is how long a node's ConvergePlacement may go without
// a heartbeat (it sends one every 2 s): a node killed in the middle of a
// move holds the placement workflow up for this long at most.
const ConvergeHeartbeat = 8 * time.Second

// placementStart are the options of the placement workflow's start.
func placementStart() client.StartWorkflowOptions {
	return client.StartWorkflowOptions{
		ID:                    PlacementWorkflowID,
		TaskQueue:             TaskQueue,
		WorkflowIDReusePolicy: enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE,
	}
}

// WakePlacement starts the placement workflow if it is not running and
// wakes it (a node started: it plans at once).
func WakePlacement(ctx context.Context, c client.Client, reason string, in PlacementInput) error {
	_, err := c.SignalWithStartWorkflow(ctx, PlacementWorkflowID, PlacementSignal, PlacementRequest{Reason: reason}, placementStart(), PlacementWorkflow, in)
	if err != nil {
		return fmt.Errorf("wake the placement workflow: %w", err)
	}
	return nil
}

// PlanNow makes sure the placement workflow runs and waits for a round of
// it that began after the call (its answer: the record's revision then):
// a starting node calls it before it recovers its share, so that the plan
// that counts it (and moves the topics of a node it replaces) is in
// place; without it, a node restarted under a new id found its topics on
// its former self, still a member until its heartbeats expired, and
// recovered nothing.
func PlanNow(ctx context.Context, c client.Client, reason string, in PlacementInput) (int64, error) {
	if err := WakePlacement(ctx, c, reason, in); err != nil {
		return 0, err
	}
	h, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: PlacementWorkflowID, UpdateName: PlacementUpdatePlan,
		WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		return 0, fmt.Errorf("ask the placement workflow for a round: %w", err)
	}
	var rev int64
	if err := h.Get(ctx, &rev); err != nil {
		return 0, fmt.Errorf("placement round: %w", err)
	}
	return rev, nil
}

// SetDrained drains node (drained true: its topics move to other nodes,
// make before break, and it is given none until undrained) or undrains it,
// through the placement workflow. It returns once the placement workflow
// has the request (not once every topic moved).
func SetDrained(ctx context.Context, c client.Client, node string, drained bool) error {
	reason := "drain " + node
	if !drained {
		reason = "undrain " + node
	}
	_, err := c.SignalWithStartWorkflow(ctx, PlacementWorkflowID, PlacementSignal,
		PlacementRequest{Reason: reason, Drain: &activities.DrainInput{Node: node, Drained: drained}}, placementStart(), PlacementWorkflow, PlacementInput{})
	if err != nil {
		return fmt.Errorf("%s: %w", reason, err)
	}
	return nil
}
