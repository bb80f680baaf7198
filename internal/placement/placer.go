package placement

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
)

// Placer makes the placement decisions that need the cluster's state: a
// topic placed at a create or start (Ensure), and the whole record planned
// again (PlanAll, from the placement workflow's activity). Every write is
// a revision-guarded update of the record.
type Placer struct {
	Store *Store
	// Alive lists the live nodes (the membership, read now).
	Alive func(ctx context.Context) ([]string, error)
	// Replicas is the cluster default (PLACEMENT_REPLICAS).
	Replicas int
	// EngineOf names the engine of a MIME type ("" when unknown: any node).
	EngineOf func(mime string) string
	// AliveKeys are the state keys Alive reads, and Seen lists the nodes
	// last seen alive without a read: ReadAhead reads those keys and the
	// seen nodes' advertisements ahead, with the record (both optional).
	AliveKeys []string
	Seen      func() []string
}

// ReadAhead starts reading what Place reads — the record, the keys Alive
// reads, the advertisements of the nodes last seen alive — in one bulk
// read, and returns the context whose reads of them take it
// (state.Prefetch; the store must be one state.WithPrefetch made): Place
// then reads once instead of once per key, one after another. Place's
// write stays conditional on the record's ETag; a node's advertisement or
// the membership read a moment earlier is what it would have read.
func (p *Placer) ReadAhead(ctx context.Context) context.Context {
	keys := append([]string{RecordKey}, p.AliveKeys...)
	if p.Seen != nil {
		for _, id := range p.Seen() {
			keys = append(keys, NodeInfoPrefix+id)
		}
	}
	return state.Prefetch(ctx, p.Store.s, keys)
}

// Weights of a worker on a node, by engine: a worker with processes of its
// own costs more than an in-process one (an idle Python runner is about 12
// MiB, a .NET host more).
var engineWeight = map[string]int{"python": 4, "dotnet": 8}

// NeedOf is what worker w asks of placement.
func (p *Placer) NeedOf(w catalog.Worker) Need {
	n := Need{WorkerID: w.ID, Topic: w.Topic, Replicas: -1, Weight: 1}
	if p.EngineOf != nil {
		n.Engine = p.EngineOf(w.MIMEType)
	}
	if wt, ok := engineWeight[n.Engine]; ok {
		n.Weight = wt
	}
	if w.Placement != nil {
		if w.Placement.Replicas != nil {
			n.Replicas = *w.Placement.Replicas
		}
		n.Require = w.Placement.Require
	}
	return n
}

// live returns the advertisements of the live nodes.
func (p *Placer) live(ctx context.Context) ([]NodeInfo, error) {
	alive, err := p.Alive(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the live nodes: %w", err)
	}
	return p.Store.Nodes(ctx, alive)
}

// Ensure places w's topic before w is applied (a create or a start): a
// topic the record does not place yet gets its nodes now, and a placed one
// gains nodes when w asks for more replicas or its nodes cannot run w. It
// only adds nodes (the placement workflow takes away what is no longer
// needed, make before break); it returns the topic's placement (whose
// Unplaceable names w when no live node can run it).
func (p *Placer) Ensure(ctx context.Context, w catalog.Worker) (TopicPlacement, error) {
	t, _, err := p.Place(ctx, w)
	return t, err
}

// Place is Ensure that also returns the record as it is after it (as
// written, or as read when the topic was placed already): the caller's
// view of the record (Follower.Observe) needs no read of its own. The
// record is read once: whether the topic is placed already is decided on
// the read that the write is conditional on.
func (p *Placer) Place(ctx context.Context, w catalog.Worker) (TopicPlacement, Record, error) {
	nodes, err := p.live(ctx)
	if err != nil {
		return TopicPlacement{}, Record{}, err
	}
	need := p.NeedOf(w)
	var out TopicPlacement
	rec, err := p.Store.Update(ctx, func(r *Record) bool {
		if t, ok := r.Topics[w.Topic]; ok && satisfied(t, need, nodes, r.Drained, p.Replicas) {
			out = t
			return false
		}
		prev, had := r.Topics[w.Topic]
		// Plan this topic alone, with its placement so far as what it
		// keeps: the needs of its other workers are in their own
		// Ensure calls and in the workflow's next plan.
		needs := []Need{need}
		if had {
			needs = append(needs, Need{WorkerID: "", Topic: w.Topic, Replicas: prev.Replicas, Weight: 1})
		}
		one := Record{Topics: map[string]TopicPlacement{}, Drained: r.Drained}
		if had {
			one.Topics[w.Topic] = prev
		}
		next, _ := Plan(nodes, needs, one, Options{DefaultReplicas: p.Replicas})
		t := next.Topics[w.Topic]
		if len(t.Nodes) == 0 {
			// No node can run it: served where the others would be, so
			// that its messages dead-letter as not_runnable there (as
			// before placement) instead of waiting unseen.
			t.Nodes = Fallback(infoIDs(nodes), r.Drained, w.Topic, replicasOf(need.Replicas, p.Replicas))
		}
		merged := prev
		merged.Replicas = max(prev.Replicas, t.Replicas)
		if !had {
			merged.Replicas = t.Replicas
		}
		for _, n := range t.Nodes {
			if !slices.Contains(merged.Nodes, n) {
				merged.Nodes = append(merged.Nodes, n)
			}
		}
		slices.Sort(merged.Nodes)
		if reason, bad := t.Unplaceable[w.ID]; bad {
			if merged.Unplaceable == nil {
				merged.Unplaceable = map[string]string{}
			}
			merged.Unplaceable[w.ID] = reason
		} else {
			delete(merged.Unplaceable, w.ID)
		}
		if r.Topics == nil {
			r.Topics = map[string]TopicPlacement{}
		}
		merged.EnsuredAt = time.Now().UTC()
		r.Topics[w.Topic] = merged
		out = merged
		return true
	})
	if err != nil {
		return TopicPlacement{}, Record{}, err
	}
	return out, rec, nil
}

// replicasOf is a need's replicas with the default applied.
func replicasOf(r, def int) int {
	if r < 0 {
		return def
	}
	return r
}

// satisfied reports whether t already serves need: enough live nodes
// that can run it, none of them drained.
func satisfied(t TopicPlacement, need Need, nodes []NodeInfo, drained []string, def int) bool {
	if _, bad := t.Unplaceable[need.WorkerID]; bad {
		return false
	}
	want := replicasOf(need.Replicas, def)
	var eligible, serving int
	for _, n := range nodes {
		if slices.Contains(drained, n.ID) || !n.CanRun(need.Engine, need.Require) {
			continue
		}
		eligible++
		if slices.Contains(t.Nodes, n.ID) {
			serving++
		}
	}
	for _, id := range t.Nodes {
		if i := slices.IndexFunc(nodes, func(n NodeInfo) bool { return n.ID == id }); i >= 0 && !nodes[i].CanRun(need.Engine, need.Require) {
			return false // a node of the topic would park it
		}
	}
	if want == All || want > eligible {
		want = eligible
	}
	return serving >= want && serving > 0
}

func infoIDs(nodes []NodeInfo) []string {
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	return ids
}

// Round is one plan of the placement workflow: the record it wrote (its
// revision) and what moves.
type Round struct {
	// Revision is the record's revision after the plan (0: nothing
	// changed, nothing written).
	Revision int64  `json:"revision"`
	Moves    []Move `json:"moves,omitempty"`
	// Gaining and Losing list, per node (sorted by node), the topics it
	// gains and loses (slices, not maps: the workflow iterates them).
	Gaining []NodeTopics `json:"gaining,omitempty"`
	Losing  []NodeTopics `json:"losing,omitempty"`
	// NewlyUnplaceable maps the workers that no live node can run, and
	// could before, to why.
	NewlyUnplaceable map[string]string `json:"newly_unplaceable,omitempty"`
	// Nodes counts the live nodes the plan placed on; Live lists them.
	Nodes int      `json:"nodes"`
	Live  []string `json:"live,omitempty"`
}

// NodeTopics is one node's topics in a Round.
type NodeTopics struct {
	Node   string   `json:"node"`
	Topics []string `json:"topics"`
}

// byNode turns a node → topics map into NodeTopics sorted by node.
func byNode(m map[string][]string) []NodeTopics {
	out := make([]NodeTopics, 0, len(m))
	for _, n := range slices.Sorted(maps.Keys(m)) {
		out = append(out, NodeTopics{Node: n, Topics: m[n]})
	}
	return out
}

// PlanAll plans the whole record from the running workers and the live
// nodes (Plan, at most maxMoves topics gaining a node except those below
// their replicas) and writes it with every moved topic's old nodes in
// Leaving: they serve until FinishMoves. Topics no live node can run at
// all go to the Fallback nodes (their workers dead-letter as not_runnable
// there, as before placement).
func (p *Placer) PlanAll(ctx context.Context, workers []catalog.Worker, maxMoves int) (Round, error) {
	nodes, err := p.live(ctx)
	if err != nil {
		return Round{}, err
	}
	var needs []Need
	for _, w := range workers {
		if w.Status == catalog.StatusRunning {
			needs = append(needs, p.NeedOf(w))
		}
	}
	var (
		round   Round
		changed bool
	)
	stored, err := p.Store.Update(ctx, func(r *Record) bool {
		changed = false
		round = Round{Nodes: len(nodes), Live: infoIDs(nodes)}
		next, moves := Plan(nodes, needs, *r, Options{DefaultReplicas: p.Replicas, MaxMoves: maxMoves})
		ids := infoIDs(nodes)
		changed = len(next.Topics) != len(r.Topics)
		for name, t := range next.Topics {
			if len(t.Nodes) == 0 {
				t.Nodes = Fallback(ids, r.Drained, name, t.Replicas)
			}
			prev, had := r.Topics[name]
			// Make before break: the nodes it leaves serve it until the
			// new ones attached (FinishMoves); a dead one is let go at once.
			var leaving []string
			for _, n := range prev.Serving() {
				if !slices.Contains(t.Nodes, n) && slices.Contains(ids, n) {
					leaving = append(leaving, n)
				}
			}
			t.Leaving = leaving
			for w, why := range t.Unplaceable {
				if _, was := prev.Unplaceable[w]; !was {
					if round.NewlyUnplaceable == nil {
						round.NewlyUnplaceable = map[string]string{}
					}
					round.NewlyUnplaceable[w] = why
				}
			}
			if !had || !slices.Equal(prev.Nodes, t.Nodes) || !slices.Equal(prev.Leaving, t.Leaving) || !equalReasons(prev.Unplaceable, t.Unplaceable) || prev.Replicas != t.Replicas {
				changed = true
			}
			next.Topics[name] = t
		}
		for name, prev := range r.Topics {
			if _, ok := next.Topics[name]; ok {
				continue
			}
			if time.Since(prev.EnsuredAt) < KeepEnsured {
				// Placed by a create or start whose record is not written
				// yet: kept as it is.
				next.Topics[name] = prev
				moves = slices.DeleteFunc(moves, func(m Move) bool { return m.Topic == name })
				continue
			}
			changed = true
		}
		if !changed {
			return false
		}
		round.Moves = moves
		gaining, losing := map[string][]string{}, map[string][]string{}
		for _, m := range moves {
			for _, n := range m.Add {
				gaining[n] = append(gaining[n], m.Topic)
			}
			for _, n := range m.Remove {
				losing[n] = append(losing[n], m.Topic)
			}
		}
		round.Gaining, round.Losing = byNode(gaining), byNode(losing)
		next.Drained = r.Drained
		*r = next
		return true
	})
	if err != nil {
		return Round{}, err
	}
	if changed {
		round.Revision = stored.Revision
	}
	return round, nil
}

func equalReasons(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// FinishMoves ends the moves of topics: their Leaving nodes stop serving
// them (make before break: called once the nodes that gained them
// attached).
func (p *Placer) FinishMoves(ctx context.Context, topics []string) (int64, error) {
	rec, err := p.Store.Update(ctx, func(r *Record) bool {
		changed := false
		for _, name := range topics {
			if t, ok := r.Topics[name]; ok && len(t.Leaving) > 0 {
				t.Leaving = nil
				r.Topics[name] = t
				changed = true
			}
		}
		return changed
	})
	return rec.Revision, err
}

// SetDrained drains node (its topics move away at the next plan, and it is
// given none) or undrains it.
func (p *Placer) SetDrained(ctx context.Context, node string, drained bool) error {
	_, err := p.Store.Update(ctx, func(r *Record) bool {
		has := slices.Contains(r.Drained, node)
		switch {
		case drained && !has:
			r.Drained = append(r.Drained, node)
			slices.Sort(r.Drained)
		case !drained && has:
			r.Drained = slices.DeleteFunc(r.Drained, func(n string) bool { return n == node })
		default:
			return false
		}
		return true
	})
	return err
}
