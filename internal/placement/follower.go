package placement

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Follower is one node's view of the placement record: which topics this
// node serves. The record is read again when the placement workflow tells
// the node (Refresh), periodically (Run), and when a topic unknown to the
// view comes up (a create placed it a moment ago).
//
// A topic the record does not place, or places only on nodes that are not
// alive any more, is served by the top replicas nodes of a rendezvous
// ranking of the live, undrained nodes (Fallback): every node computes the
// same answer from the same membership, so nodes starting together each
// take their share instead of each loading everything, and a topic is
// never left without a node while the placement workflow catches up.
type Follower struct {
	// Self is this node's id.
	Self string
	// Store reads the record.
	Store *Store
	// Alive lists the live nodes as this node saw them last (sorted).
	Alive func() []string
	// Replicas is the cluster default (PLACEMENT_REPLICAS).
	Replicas int
	// Labels are this node's NODE_LABELS.
	Labels map[string]string
	// OnChange, when set, is called after a refresh that found a new
	// revision (the node then converges: internal/node). It must not
	// block: it may be called from inside a worker's apply.
	OnChange func()
	// Log reports refresh failures.
	Log *slog.Logger

	rec      atomic.Pointer[Record]
	mu       sync.Mutex // one refresh at a time
	lastRead atomic.Int64
}

// Record is the last record read (the zero Record before the first read).
func (f *Follower) Record() Record {
	if r := f.rec.Load(); r != nil {
		return *r
	}
	return Record{}
}

// Refresh reads the record and, when its revision moved, keeps it and calls
// OnChange. It reports whether the revision moved.
func (f *Follower) Refresh(ctx context.Context) (bool, error) {
	f.mu.Lock()
	r, err := f.Store.Load(ctx)
	if err != nil {
		f.mu.Unlock()
		return false, err
	}
	cur := f.rec.Load()
	changed := cur == nil || cur.Revision != r.Revision
	if changed {
		f.rec.Store(&r)
	}
	// After the view: a Serves that finds the read fresh and skips its own
	// then loads this view, not the one before it.
	f.lastRead.Store(time.Now().UnixNano())
	f.mu.Unlock()
	if changed && f.OnChange != nil {
		f.OnChange()
	}
	return changed, nil
}

// Observe takes r as the view when it is newer than the view (a record
// this node just read or wrote itself, Placer.Place) and then calls
// OnChange, as Refresh would after reading it. It reports whether the
// view changed.
func (f *Follower) Observe(r Record) bool {
	f.mu.Lock()
	cur := f.rec.Load()
	changed := cur == nil || r.Revision > cur.Revision
	if changed {
		f.rec.Store(&r)
		f.lastRead.Store(time.Now().UnixNano())
	}
	f.mu.Unlock()
	if changed && f.OnChange != nil {
		f.OnChange()
	}
	return changed
}

// CanRun says why this node may not run a worker that requires these
// labels ("" when it may).
func (f *Follower) CanRun(require map[string]string) string {
	return MissingLabels(f.Labels, require)
}

// Unplaceable reports whether the last record read names worker id of
// topic as one no live node can run.
func (f *Follower) Unplaceable(topic, id string) bool {
	_, bad := f.Record().Topics[topic].Unplaceable[id]
	return bad
}

// MissingLabels says which labels of require labels lacks ("" when none).
func MissingLabels(labels, require map[string]string) string {
	var miss []string
	for _, k := range slices.Sorted(maps.Keys(require)) {
		if labels[k] != require[k] {
			miss = append(miss, k+"="+require[k])
		}
	}
	if len(miss) == 0 {
		return ""
	}
	return "requires label " + strings.Join(miss, ",") + " that this node does not have"
}

// unknownRefresh bounds how often a topic unknown to the view makes
// Serves read the record again.
const unknownRefresh = 200 * time.Millisecond

// Serves reports whether this node serves topic now: it is among the
// topic's Serving nodes in the record, or, for a topic the record does not
// place on a live node, among its Fallback nodes.
func (f *Follower) Serves(ctx context.Context, topic string) bool {
	rec := f.rec.Load()
	if rec == nil || !f.placedAlive(*rec, topic) {
		if time.Since(time.Unix(0, f.lastRead.Load())) > unknownRefresh {
			if _, err := f.Refresh(ctx); err != nil && f.Log != nil {
				f.Log.Warn("placement record not read; serving by the fallback ranking", "topic", topic, "err", err)
			}
		}
	}
	// The view is loaded again either way: a concurrent Refresh may have
	// stored a newer one since the load above, and this call then skipped
	// its own read because that one was fresh (Reconcile asks for many
	// workers at once; a node that had read nothing yet served a placed
	// topic by the fallback ranking for one reconcile).
	return f.ServesByView(topic)
}

// ServesByView is Serves by the view the follower has, without reading
// the record: for a topic the view does not place, the fallback ranking
// (which the planner's placement of a new topic mostly agrees with).
// Alone, a hint for what costs nothing when wrong (Node.Check: a check's
// process kept for a Load here, or not); Serves reads the record first
// when the view does not place the topic.
func (f *Follower) ServesByView(topic string) bool {
	var r Record
	if rec := f.rec.Load(); rec != nil {
		r = *rec
	}
	if f.placedAlive(r, topic) {
		return slices.Contains(r.Topics[topic].Serving(), f.Self)
	}
	return slices.Contains(Fallback(f.Alive(), r.Drained, topic, f.Replicas), f.Self)
}

// placedAlive reports whether r places topic on at least one live node.
func (f *Follower) placedAlive(r Record, topic string) bool {
	t, ok := r.Topics[topic]
	if !ok {
		return false
	}
	alive := f.Alive()
	for _, n := range t.Serving() {
		if slices.Contains(alive, n) || n == f.Self {
			return true
		}
	}
	return false
}

// Run refreshes the view every interval until ctx ends.
func (f *Follower) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := f.Refresh(ctx); err != nil && ctx.Err() == nil && f.Log != nil {
				f.Log.Warn("placement record not read", "err", err)
			}
		}
	}
}

// Fallback is the nodes that serve a topic the record does not place on a
// live node: the first replicas (at least 1; every node when replicas is
// All) of alive less drained, ranked by Score (as Plan ranks them).
func Fallback(alive, drained []string, topic string, replicas int) []string {
	var nodes []string
	for _, n := range alive {
		if !slices.Contains(drained, n) {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) == 0 {
		nodes = slices.Clone(alive) // everything drained: serve anyway
	}
	if replicas == All || replicas >= len(nodes) {
		return nodes
	}
	replicas = max(replicas, 1)
	slices.SortFunc(nodes, func(a, b string) int {
		return cmp.Or(cmp.Compare(Score(b, topic), Score(a, topic)), cmp.Compare(a, b))
	})
	out := nodes[:replicas]
	slices.Sort(out)
	return out
}
