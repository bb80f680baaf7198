package activities

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/placement"
)

// PlacedNode is what the placement activities need of the node they run on
// (internal/node and its placement.Follower).
type PlacedNode interface {
	// Refresh reads the placement record again.
	Refresh(ctx context.Context) (bool, error)
	// Observe takes a record this node read or wrote as its view when it
	// is newer than the view.
	Observe(r placement.Record) bool
	// Converge attaches the workers of the topics the node serves now and
	// parks those of the topics it no longer serves, and waits until it
	// holds a subscription to each topic it serves; it returns those
	// topics.
	Converge(ctx context.Context) ([]string, error)
}

// Placement carries the placement activities' dependencies (nil: no
// placement, every node serves every topic).
type Placement struct {
	Placer *placement.Placer
	Node   PlacedNode
	// Publish sends a placement change on placement.EventTopic (the
	// node's infrastructure events).
	Publish func(kind string, data any)
	// MaxMoves bounds the topics that gain a node in one plan
	// (PLACEMENT_MAX_MOVES).
	MaxMoves int
}

// NotPlaceableType is the error_type of the lifecycle error event of a
// worker that no live node can run (a label it requires, an engine no node
// has healthy).
const NotPlaceableType = "not_placeable"

// PlanPlacement plans the placement record again from the running workers
// and the live nodes (placement.Placer.PlanAll) and writes it, moved
// topics keeping their old nodes in Leaving. It announces the change on
// workmanager.infra.placement and a lifecycle error event for every worker
// that became unplaceable.
func (a *Activities) PlanPlacement(ctx context.Context) (placement.Round, error) {
	p := a.Placement
	if p == nil {
		return placement.Round{}, nil
	}
	defer heartbeatWhileRunning(ctx)()
	ids, err := a.Catalog.WorkerIDs(ctx)
	if err != nil {
		return placement.Round{}, fmt.Errorf("list workers: %w", err)
	}
	ws, err := a.Catalog.GetWorkers(ctx, ids)
	if err != nil {
		return placement.Round{}, fmt.Errorf("read workers: %w", err)
	}
	round, err := p.Placer.PlanAll(ctx, ws, p.MaxMoves)
	if err != nil {
		return placement.Round{}, err
	}
	if round.Revision != 0 && p.Publish != nil {
		p.Publish("placement.planned", round)
	}
	for _, id := range slices.Sorted(maps.Keys(round.NewlyUnplaceable)) {
		i := slices.IndexFunc(ws, func(w catalog.Worker) bool { return w.ID == id })
		if i < 0 {
			continue
		}
		spec := EventSpec{ID: fmt.Sprintf("%s/not_placeable/%d", id, round.Revision), Kind: lifecycleevents.Error,
			ErrorType: NotPlaceableType, ErrorMessage: "no live node can run this worker: " + round.NewlyUnplaceable[id]}
		if err := a.emit(ctx, ws[i], []EventSpec{spec}); err != nil && activity.IsActivity(ctx) {
			activity.GetLogger(ctx).Warn("not_placeable event not published", "worker_id", id, "err", err)
		}
	}
	return round, nil
}

// FinishMoves lets the old nodes of moved topics go (make before break: the
// placement workflow calls it once the nodes that gained them attached).
func (a *Activities) FinishMoves(ctx context.Context, topics []string) (int64, error) {
	if a.Placement == nil {
		return 0, nil
	}
	rev, err := a.Placement.Placer.FinishMoves(ctx, topics)
	if err == nil && a.Placement.Publish != nil {
		a.Placement.Publish("placement.moved", map[string]any{"revision": rev, "topics": topics})
	}
	return rev, err
}

// ConvergeResult is what ConvergePlacement did on a node.
type ConvergeResult struct {
	Node   string   `json:"node"`
	Topics []string `json:"topics"`
}

// ConvergePlacement makes this node match the placement record (run on
// the node's own task queue): it reads the record, attaches the workers of
// the topics it gained and holds their subscriptions, and parks those of
// the topics it lost. It heartbeats while it works.
func (a *Activities) ConvergePlacement(ctx context.Context) (ConvergeResult, error) {
	if a.Placement == nil || a.Placement.Node == nil {
		return ConvergeResult{}, nil
	}
	defer heartbeatWhileRunning(ctx)()
	if _, err := a.Placement.Node.Refresh(ctx); err != nil {
		return ConvergeResult{}, err
	}
	topics, err := a.Placement.Node.Converge(ctx)
	res := ConvergeResult{Topics: topics}
	if self, ok := a.Members.(interface{ Self() string }); ok {
		res.Node = self.Self()
	}
	return res, err
}

// DrainInput drains or undrains a node.
type DrainInput struct {
	Node    string
	Drained bool
}

// SetDrained records a drain (its topics move away at the next plan) or
// an undrain in the placement record.
func (a *Activities) SetDrained(ctx context.Context, in DrainInput) error {
	if a.Placement == nil {
		return nil
	}
	if err := a.Placement.Placer.SetDrained(ctx, in.Node, in.Drained); err != nil {
		return err
	}
	if a.Placement.Publish != nil {
		a.Placement.Publish("placement.drained", map[string]any{"node": in.Node, "drained": in.Drained, "at": time.Now().UTC()})
	}
	return nil
}

// ensurePlaced places w's topic before w is applied (placement.Placer.Ensure),
// so that the fan-out that follows reaches nodes that know where it goes.
func (a *Activities) ensurePlaced(ctx context.Context, w catalog.Worker) error {
	if a.Placement == nil || w.Status != catalog.StatusRunning || w.Deleted {
		return nil
	}
	// What Place reads, in one bulk read rather than one key after another.
	tp, rec, err := a.Placement.Placer.Place(a.Placement.Placer.ReadAhead(ctx), w)
	if err != nil {
		return err
	}
	if why, bad := tp.Unplaceable[w.ID]; bad {
		// Reported now (GetWorker's placement_reason says it too); its
		// messages dead-letter as not_runnable, as for a worker no node
		// can load. The event's id is the change's: a retry repeats it.
		spec := EventSpec{ID: fmt.Sprintf("%s/not_placeable/r%d", w.ID, w.Revision), Kind: lifecycleevents.Error,
			ErrorType: NotPlaceableType, ErrorMessage: "no live node can run this worker: " + why}
		if err := a.emit(ctx, w, []EventSpec{spec}); err != nil && activity.IsActivity(ctx) {
			activity.GetLogger(ctx).Warn("not_placeable event not published", "worker_id", w.ID, "err", err)
		}
	}
	if a.Placement.Node != nil {
		// The record as Place read or wrote it: the view needs no read
		// of its own to know the topic (a later change is read as any).
		a.Placement.Node.Observe(rec)
	}
	return nil
}

// refreshPlacement reads the placement record again before an Activate, so
// that a topic a create placed a moment ago is seen here.
func (a *Activities) refreshPlacement(ctx context.Context) error {
	if a.Placement == nil || a.Placement.Node == nil {
		return nil
	}
	_, err := a.Placement.Node.Refresh(ctx)
	return err
}
