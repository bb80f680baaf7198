package placement

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"slices"
	"strings"
)

// defaultLoadSlack is Options.LoadSlack's default.
const defaultLoadSlack = 0.25

// maxRebalancePasses bounds the rebalance loop of one plan (each pass
// moves at least one topic, and the loop ends by itself long before in
// practice: see rebalance).
const maxRebalancePasses = 64

// reasonNodesShown bounds how many nodes an unplaceable reason lists.
const reasonNodesShown = 8

// Plan returns the next placement record (revision and time not set: the
// caller's) and the moves from prev to it.
//
// The unit is the topic: its needs are the running workers on it, and its
// replicas the largest of theirs (Need.Replicas < 0: opt.DefaultReplicas,
// 2 when 0; All: every eligible node), capped at the number of eligible
// nodes. A topic's eligible nodes are the nodes passed in (the live ones)
// that are not in prev.Drained and can run every worker of the topic;
// workers are taken in id order, and a worker that no such node can run
// (or none together with the workers taken before it) is recorded in
// TopicPlacement.Unplaceable with the reason and left out of the
// eligibility, so that the topic's other workers are still served.
//
// Nodes are chosen by rendezvous (highest random weight) hashing with
// bounded load. The score of a node for a topic is Score(node, topic); the
// load of a node is the sum, over the topics it serves, of the topic's
// weight (the sum of its workers' Weight, each at least 1). The bound is
//
//	bound = max(ceil((1+LoadSlack) * D / N), heaviest topic weight)
//
// where D is the sum over topics of weight × nodes the topic gets and N
// the number of live, undrained nodes. A node at the bound takes no more
// topics unless a topic has no other eligible node (constraints); it then
// goes to its least loaded eligible node.
//
// The plan runs in three steps, over topics in a fixed order (heaviest
// first, then by name), so the result depends only on the inputs:
//
//  1. Keep: a topic keeps its previous nodes that are live and eligible;
//     a topic with more of them than its replicas keeps the best scored.
//  2. Fill: a topic below its replicas (a node died, was drained, the
//     topic is new or asks for more) gets the missing nodes in score
//     order, skipping nodes at the bound.
//  3. Rebalance: a topic moves from one of its nodes o to a better scored
//     eligible node n that has room when that evens the load
//     (load(o) > load(n) + topic weight); this is how a joining or
//     undrained node gets its share, the topics rendezvous hashing gives
//     it, until it carries about as much as the others (about 1/(n+1) of
//     the topic-node slots). Then a node above the bound (the bound fell
//     because a node joined, or weights grew) hands topics to their best
//     scored eligible nodes with room. Every such move lowers the sum of
//     the squared loads, so the loop ends. opt.MaxMoves (> 0) bounds how
//     many topics gain a node here (topics filled in step 2 are not
//     counted); the others keep their nodes until a later plan.
//
// A placement made from scratch is plain bounded-load rendezvous hashing
// (a topic misses a better scored node only when that node was at the
// bound), so removing a node moves only its topics, and adding one moves
// only topics to it, not a reshuffle. After a rebalance cut short by the
// evening rule, the bound or MaxMoves, a later change may also finish
// some of it.
//
// The moves hold one Move per topic whose nodes changed, sorted by topic:
// Add the nodes it gains, Remove those it loses. A topic of prev that has
// no need any more is not in the result; its Move removes all its nodes.
// The result's Leaving is empty (make before break is the caller's) and
// its Drained is prev's.
func Plan(nodes []NodeInfo, needs []Need, prev Record, opt Options) (Record, []Move) {
	p := newPlanner(nodes, needs, prev, opt)
	p.keep()
	p.computeBound()
	p.fill()
	p.rebalance()
	return p.result()
}

// Score is the rendezvous score of node for topic: the node with the
// highest score serves the topic first. It is stable across versions and
// processes (FNV-1a of each id, mixed), so that every planner agrees.
func Score(node, topic string) uint64 {
	return mixScore(hashID(node), hashID(topic))
}

func hashID(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return h.Sum64()
}

// mixScore combines a node's and a topic's hash (splitmix64's finalizer,
// so that ids differing in one character give unrelated scores).
func mixScore(node, topic uint64) uint64 {
	return fmix(node ^ fmix(topic+0x9e3779b97f4a7c15))
}

func fmix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// planTopic is one topic while planning.
type planTopic struct {
	name        string
	needs       []Need // sorted by worker id
	weight      int
	replicas    int // what the topic asks for: All or a count
	target      int // nodes it gets: replicas capped at len(ranked)
	ranked      []int
	rank        []int // node index → position in ranked, -1: not eligible
	nodes       []int // node indexes serving it
	prevNodes   []string
	unplaceable map[string]string
	exempt      bool // below its replicas after keep: filled, not rate limited
	counted     bool // gained a node in rebalance (counts against MaxMoves)
}

func (t *planTopic) has(n int) bool { return slices.Contains(t.nodes, n) }

// worst returns the position in t.nodes of the node with the lowest score
// among those for which ok holds, or -1.
func (t *planTopic) worst(ok func(n int) bool) int {
	w := -1
	for i, n := range t.nodes {
		if ok(n) && (w < 0 || t.rank[n] > t.rank[t.nodes[w]]) {
			w = i
		}
	}
	return w
}

type planner struct {
	opt     Options
	prev    Record
	nodes   []NodeInfo // live, sorted by id, deduplicated
	drained []bool     // by node index
	cands   []int      // live and not drained
	topics  []*planTopic
	load    []int
	bound   int
	used    int // topics counted against MaxMoves
}

func newPlanner(nodes []NodeInfo, needs []Need, prev Record, opt Options) *planner {
	if opt.DefaultReplicas <= 0 {
		opt.DefaultReplicas = DefaultReplicas
	}
	if opt.LoadSlack <= 0 {
		opt.LoadSlack = defaultLoadSlack
	}
	p := &planner{opt: opt, prev: prev}
	p.nodes = slices.Clone(nodes)
	slices.SortStableFunc(p.nodes, func(a, b NodeInfo) int { return cmp.Compare(a.ID, b.ID) })
	p.nodes = slices.CompactFunc(p.nodes, func(a, b NodeInfo) bool { return a.ID == b.ID })
	p.drained = make([]bool, len(p.nodes))
	for i, n := range p.nodes {
		p.drained[i] = slices.Contains(prev.Drained, n.ID)
		if !p.drained[i] {
			p.cands = append(p.cands, i)
		}
	}
	p.load = make([]int, len(p.nodes))

	sorted := slices.Clone(needs)
	slices.SortStableFunc(sorted, func(a, b Need) int {
		return cmp.Or(cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.WorkerID, b.WorkerID))
	})
	nodeHash := make([]uint64, len(p.nodes))
	for i, n := range p.nodes {
		nodeHash[i] = hashID(n.ID)
	}
	for i := 0; i < len(sorted); {
		j := i
		for j < len(sorted) && sorted[j].Topic == sorted[i].Topic {
			j++
		}
		p.topics = append(p.topics, p.newTopic(sorted[i].Topic, sorted[i:j], nodeHash))
		i = j
	}
	slices.SortFunc(p.topics, func(a, b *planTopic) int {
		return cmp.Or(cmp.Compare(b.weight, a.weight), cmp.Compare(a.name, b.name))
	})
	return p
}

// newTopic computes a topic's weight, replicas, eligible nodes (ranked by
// score) and unplaceable workers.
func (p *planner) newTopic(name string, needs []Need, nodeHash []uint64) *planTopic {
	t := &planTopic{name: name, needs: needs, replicas: -1}
	for _, w := range needs {
		t.weight += max(w.Weight, 1)
		r := w.Replicas
		if r < 0 {
			r = p.opt.DefaultReplicas
		}
		if r == All || t.replicas == All {
			t.replicas = All
		} else {
			t.replicas = max(t.replicas, r)
		}
	}
	eligible := make([]bool, len(p.nodes))
	for _, i := range p.cands {
		eligible[i] = true
	}
	var taken []string
	can := make([]bool, len(p.nodes))
	for _, w := range needs {
		runs, together := false, false
		for _, i := range p.cands {
			can[i] = p.nodes[i].CanRun(w.Engine, w.Require)
			if can[i] {
				runs = true
				together = together || eligible[i]
			}
		}
		switch {
		case !runs:
			t.setUnplaceable(w.WorkerID, p.reason(w))
		case !together:
			t.setUnplaceable(w.WorkerID, fmt.Sprintf(
				"no live node can run it together with the other workers of topic %s (%s)",
				name, strings.Join(taken, ", ")))
		default:
			for _, i := range p.cands {
				eligible[i] = eligible[i] && can[i]
			}
			taken = append(taken, w.WorkerID)
		}
	}
	if len(taken) == 0 {
		// No worker can run anywhere: the topic has no eligible node.
		clear(eligible)
	}
	th := hashID(name)
	scores := make([]uint64, len(p.nodes))
	for _, i := range p.cands {
		if eligible[i] {
			t.ranked = append(t.ranked, i)
			scores[i] = mixScore(nodeHash[i], th)
		}
	}
	slices.SortFunc(t.ranked, func(a, b int) int {
		return cmp.Or(cmp.Compare(scores[b], scores[a]), cmp.Compare(a, b))
	})
	t.rank = make([]int, len(p.nodes))
	for i := range t.rank {
		t.rank[i] = -1
	}
	for pos, i := range t.ranked {
		t.rank[i] = pos
	}
	t.target = len(t.ranked)
	if t.replicas != All {
		t.target = min(t.replicas, t.target)
	}
	t.prevNodes = slices.Clone(p.prev.Topics[name].Nodes)
	slices.Sort(t.prevNodes)
	t.prevNodes = slices.Compact(t.prevNodes)
	return t
}

func (t *planTopic) setUnplaceable(worker, reason string) {
	if t.unplaceable == nil {
		t.unplaceable = map[string]string{}
	}
	t.unplaceable[worker] = reason
}

// reason says why no live, undrained node can run w.
func (p *planner) reason(w Need) string {
	var drained []string
	for i, n := range p.nodes {
		if p.drained[i] {
			drained = append(drained, n.ID)
		}
	}
	suffix := ""
	if len(drained) > 0 {
		suffix = "; drained: " + strings.Join(drained, ", ")
	}
	if len(p.cands) == 0 {
		return "no live node that is not drained" + suffix
	}
	anyNode := func(ok func(NodeInfo) bool) bool {
		for _, i := range p.cands {
			if ok(p.nodes[i]) {
				return true
			}
		}
		return false
	}
	if w.Engine != "" && !anyNode(func(n NodeInfo) bool { return slices.Contains(n.Engines, w.Engine) }) {
		return fmt.Sprintf("no live node runs engine %s (nodes: %s)%s",
			w.Engine, p.describe(false, true), suffix)
	}
	keys := slices.Sorted(maps.Keys(w.Require))
	var missing []string
	for _, k := range keys {
		if !anyNode(func(n NodeInfo) bool { l, ok := n.Labels[k]; return ok && l == w.Require[k] }) {
			missing = append(missing, k+"="+w.Require[k])
		}
	}
	switch len(missing) {
	case 0:
	case 1:
		return fmt.Sprintf("no live node has label %s (nodes: %s)%s", missing[0], p.describe(true, false), suffix)
	default:
		return fmt.Sprintf("no live node has labels %s (nodes: %s)%s",
			strings.Join(missing, ", "), p.describe(true, false), suffix)
	}
	req := make([]string, len(keys))
	for i, k := range keys {
		req[i] = k + "=" + w.Require[k]
	}
	return fmt.Sprintf("no live node runs engine %s and has labels %s (nodes: %s)%s",
		w.Engine, strings.Join(req, ","), p.describe(true, true), suffix)
}

// describe lists the live, undrained nodes with their labels
// (a{pool=cpu,zone=a}) and/or engines (a[native,python]).
func (p *planner) describe(labels, engines bool) string {
	var b strings.Builder
	for k, i := range p.cands {
		if k == reasonNodesShown {
			fmt.Fprintf(&b, ", … and %d more", len(p.cands)-k)
			break
		}
		if k > 0 {
			b.WriteString(", ")
		}
		n := p.nodes[i]
		b.WriteString(n.ID)
		if labels {
			kv := make([]string, 0, len(n.Labels))
			for _, l := range slices.Sorted(maps.Keys(n.Labels)) {
				kv = append(kv, l+"="+n.Labels[l])
			}
			b.WriteString("{" + strings.Join(kv, ",") + "}")
		}
		if engines {
			e := slices.Clone(n.Engines)
			slices.Sort(e)
			b.WriteString("[" + strings.Join(e, ",") + "]")
		}
	}
	return b.String()
}

// keep gives each topic its previous nodes that are live and eligible, the
// best scored ones when there are more than its replicas.
func (p *planner) keep() {
	byID := make(map[string]int, len(p.nodes))
	for i, n := range p.nodes {
		byID[n.ID] = i
	}
	for _, t := range p.topics {
		for _, id := range t.prevNodes {
			if i, ok := byID[id]; ok && t.rank[i] >= 0 {
				t.nodes = append(t.nodes, i)
			}
		}
		if len(t.nodes) > t.target {
			slices.SortFunc(t.nodes, func(a, b int) int { return cmp.Compare(t.rank[a], t.rank[b]) })
			t.nodes = t.nodes[:t.target]
		}
		t.exempt = len(t.nodes) < t.target
		for _, n := range t.nodes {
			p.load[n] += t.weight
		}
	}
}

// computeBound sets the most load a node takes (see Plan).
func (p *planner) computeBound() {
	if len(p.cands) == 0 {
		return
	}
	demand, heaviest := 0, 0
	for _, t := range p.topics {
		demand += t.weight * t.target
		if t.target > 0 {
			heaviest = max(heaviest, t.weight)
		}
	}
	p.bound = max(int(math.Ceil((1+p.opt.LoadSlack)*float64(demand)/float64(len(p.cands)))), heaviest)
}

func (p *planner) fits(t *planTopic, n int) bool { return p.load[n]+t.weight <= p.bound }

// fill gives each topic below its replicas the missing nodes.
func (p *planner) fill() {
	for _, t := range p.topics {
		for len(t.nodes) < t.target {
			best := -1
			for _, n := range t.ranked {
				if !t.has(n) && p.fits(t, n) {
					best = n
					break
				}
			}
			if best < 0 { // every eligible node is at the bound: the least loaded
				for _, n := range t.ranked {
					if !t.has(n) && (best < 0 || p.load[n] < p.load[best]) {
						best = n
					}
				}
			}
			t.nodes = append(t.nodes, best)
			p.load[best] += t.weight
		}
	}
}

// rebalance moves topics off nodes above the bound and toward better
// scored nodes with room (see Plan), within opt.MaxMoves.
func (p *planner) rebalance() {
	for range maxRebalancePasses {
		moved := false
		for _, t := range p.topics {
			for p.improve(t) {
				moved = true
			}
		}
		for _, t := range p.topics {
			for p.shed(t) {
				moved = true
			}
		}
		if !moved {
			return
		}
	}
}

// allowed reports whether t may gain a node in rebalance, counting it
// against MaxMoves.
func (p *planner) allowed(t *planTopic) bool {
	if t.exempt || t.counted {
		return true
	}
	if p.opt.MaxMoves > 0 && p.used >= p.opt.MaxMoves {
		return false
	}
	p.used++
	t.counted = true
	return true
}

// shed moves t from its worst scored node above the bound to its best
// scored node with room; it reports whether it did.
func (p *planner) shed(t *planTopic) bool {
	o := t.worst(func(n int) bool { return p.load[n] > p.bound })
	if o < 0 {
		return false
	}
	for _, n := range t.ranked {
		if !t.has(n) && p.fits(t, n) {
			return p.swap(t, o, n)
		}
	}
	return false
}

// improve moves t from a node to a better scored one that has room and
// less load, so that the swap evens the load (load[o] > load[n] + weight):
// it tries the best scored candidates first and, for each, t's worst scored
// node below it that the swap evens. It reports whether it moved t.
func (p *planner) improve(t *planTopic) bool {
	if len(t.nodes) == 0 || len(t.nodes) == len(t.ranked) {
		return false
	}
	for _, n := range t.ranked {
		if t.has(n) || !p.fits(t, n) {
			continue
		}
		o := t.worst(func(o int) bool { return t.rank[o] > t.rank[n] && p.load[o] > p.load[n]+t.weight })
		if o >= 0 {
			return p.swap(t, o, n)
		}
	}
	return false
}

func (p *planner) swap(t *planTopic, o, n int) bool {
	if !p.allowed(t) {
		return false
	}
	p.load[t.nodes[o]] -= t.weight
	p.load[n] += t.weight
	t.nodes[o] = n
	return true
}

// result builds the record and the moves.
func (p *planner) result() (Record, []Move) {
	r := Record{Topics: make(map[string]TopicPlacement, len(p.topics)), Drained: slices.Clone(p.prev.Drained)}
	var moves []Move
	for _, t := range p.topics {
		ids := make([]string, len(t.nodes))
		for i, n := range t.nodes {
			ids[i] = p.nodes[n].ID
		}
		slices.Sort(ids)
		r.Topics[t.name] = TopicPlacement{Nodes: ids, Replicas: t.replicas, Unplaceable: t.unplaceable}
		add, remove := diff(t.prevNodes, ids)
		if len(add) > 0 || len(remove) > 0 {
			moves = append(moves, Move{Topic: t.name, Add: add, Remove: remove})
		}
	}
	for name, t := range p.prev.Topics {
		if _, ok := r.Topics[name]; !ok && len(t.Nodes) > 0 {
			gone := slices.Clone(t.Nodes)
			slices.Sort(gone)
			moves = append(moves, Move{Topic: name, Remove: slices.Compact(gone)})
		}
	}
	slices.SortFunc(moves, func(a, b Move) int { return cmp.Compare(a.Topic, b.Topic) })
	return r, moves
}

// diff returns what is in b and not in a (add) and in a and not in b
// (remove); a and b are sorted.
func diff(a, b []string) (add, remove []string) {
	for _, x := range b {
		if _, ok := slices.BinarySearch(a, x); !ok {
			add = append(add, x)
		}
	}
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			remove = append(remove, x)
		}
	}
	return add, remove
}
