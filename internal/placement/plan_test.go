package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var allEngines = []string{"native", "python"}

func mkNodes(ids ...string) []NodeInfo {
	ns := make([]NodeInfo, len(ids))
	for i, id := range ids {
		ns[i] = NodeInfo{ID: id, Engines: allEngines}
	}
	return ns
}

// topicNeeds returns n topics of two workers each (a native worker of
// weight 1 and a Python worker of weight 3) asking for replicas.
func topicNeeds(n, replicas int) []Need {
	var needs []Need
	for i := range n {
		topic := fmt.Sprintf("orders.%03d", i)
		needs = append(needs,
			Need{WorkerID: topic + "-go", Topic: topic, Engine: "native", Replicas: replicas, Weight: 1},
			Need{WorkerID: topic + "-py", Topic: topic, Engine: "python", Replicas: replicas, Weight: 3})
	}
	return needs
}

// slots counts the topics each node serves.
func slots(r Record) map[string]int {
	c := map[string]int{}
	for _, t := range r.Topics {
		for _, n := range t.Nodes {
			c[n]++
		}
	}
	return c
}

// loads sums each node's load (topic weight per topic it serves).
func loads(r Record, needs []Need) map[string]int {
	w := map[string]int{}
	for _, n := range needs {
		w[n.Topic] += max(n.Weight, 1)
	}
	l := map[string]int{}
	for name, t := range r.Topics {
		for _, n := range t.Nodes {
			l[n] += w[name]
		}
	}
	return l
}

func assertReplicas(t *testing.T, r Record, topics, want int) {
	t.Helper()
	if len(r.Topics) != topics {
		t.Fatalf("record has %d topics, want %d", len(r.Topics), topics)
	}
	for name, tp := range r.Topics {
		c := slices.Clone(tp.Nodes)
		slices.Sort(c)
		if len(slices.Compact(c)) != want || len(tp.Nodes) != want {
			t.Fatalf("topic %s on %v, want %d distinct nodes", name, tp.Nodes, want)
		}
	}
}

// changedTopics lists the topics whose nodes differ between a and b.
func changedTopics(a, b Record) []string {
	var c []string
	for name, t := range b.Topics {
		if !slices.Equal(a.Topics[name].Nodes, t.Nodes) {
			c = append(c, name)
		}
	}
	slices.Sort(c)
	return c
}

func TestPlanThreeNodesSpreadsTopics(t *testing.T) {
	needs := topicNeeds(300, 2)
	r, moves := Plan(mkNodes("a", "b", "c"), needs, Record{}, Options{})
	assertReplicas(t, r, 300, 2)
	for n, c := range slots(r) {
		share := float64(c) / 300
		t.Logf("node %s serves %d topics (%.1f%%), load %d", n, c, 100*share, loads(r, needs)[n])
		if share < 0.55 || share > 0.78 {
			t.Errorf("node %s serves %.1f%% of topics, want 55-78%%", n, 100*share)
		}
	}
	if len(moves) != 300 {
		t.Fatalf("%d moves from an empty record, want 300", len(moves))
	}
	for _, m := range moves {
		if len(m.Add) != 2 || len(m.Remove) != 0 {
			t.Fatalf("move %+v, want two nodes added", m)
		}
	}
	// Planning again with the same inputs changes nothing.
	again, moves := Plan(mkNodes("a", "b", "c"), needs, r, Options{})
	if len(moves) != 0 || !reflect.DeepEqual(again, r) {
		t.Fatalf("second plan moved %d topics, want none", len(moves))
	}
}

func TestPlanNodeJoins(t *testing.T) {
	needs := topicNeeds(300, 2)
	base, _ := Plan(mkNodes("a", "b", "c"), needs, Record{}, Options{})
	four := mkNodes("a", "b", "c", "d")

	r, moves := Plan(four, needs, base, Options{})
	assertReplicas(t, r, 300, 2)
	share := float64(slots(r)["d"]) / 600
	// The fewest topics that can change: each gives d at most one slot,
	// and d's fair share is a quarter of the 600 slots.
	ideal := 600 / 4
	t.Logf("d joins: d has %d of 600 slots (%.1f%%), %d topics changed (ideal %d), loads %v",
		slots(r)["d"], 100*share, len(moves), ideal, loads(r, needs))
	if share < 0.18 || share > 0.32 {
		t.Errorf("new node has %.1f%% of slots, want 18-32%%", 100*share)
	}
	if len(moves) > ideal*3/2 {
		t.Errorf("%d topics changed, want at most 1.5 × %d", len(moves), ideal)
	}
	for _, m := range moves {
		if !slices.Equal(m.Add, []string{"d"}) || len(m.Remove) != 1 {
			t.Fatalf("move %+v, want d replacing one node", m)
		}
	}
	if got := len(changedTopics(base, r)); got != len(moves) {
		t.Fatalf("%d topics changed, %d moves", got, len(moves))
	}

	// Rate limited: 20 topics gain a node per plan, and the plans
	// converge on the unlimited result.
	cur, rounds, total := base, 0, 0
	for {
		next, moves := Plan(four, needs, cur, Options{MaxMoves: 20})
		if len(moves) == 0 {
			break
		}
		rounds++
		total += len(moves)
		if len(moves) > 20 {
			t.Fatalf("round %d moved %d topics, want at most 20", rounds, len(moves))
		}
		if rounds == 1 && len(moves) != 20 {
			t.Fatalf("first limited round moved %d topics, want 20", len(moves))
		}
		if rounds > 20 {
			t.Fatal("rate-limited plans do not converge")
		}
		assertReplicas(t, next, 300, 2)
		cur = next
	}
	limitedShare := float64(slots(cur)["d"]) / 600
	changed := len(changedTopics(base, cur))
	t.Logf("MaxMoves=20: converged in %d rounds, %d topic moves in all, %d topics changed, d has %.1f%% of slots, %d topics differ from the unlimited plan",
		rounds, total, changed, 100*limitedShare, len(changedTopics(r, cur)))
	if limitedShare < 0.18 || limitedShare > 0.32 || total > ideal*3/2 {
		t.Fatalf("rate-limited plans: d has %.1f%% of slots after %d moves", 100*limitedShare, total)
	}
}

func TestPlanNodeDies(t *testing.T) {
	for _, ids := range [][]string{{"a", "b", "c"}, {"a", "b", "c", "d", "e"}} {
		t.Run(fmt.Sprintf("%d nodes", len(ids)), func(t *testing.T) {
			needs := topicNeeds(300, 2)
			base, _ := Plan(mkNodes(ids...), needs, Record{}, Options{})
			dead := "b"
			alive := slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return s == dead })
			r, moves := Plan(mkNodes(alive...), needs, base, Options{MaxMoves: 5})
			assertReplicas(t, r, 300, 2)
			hadDead := 0
			for name, tp := range base.Topics {
				now := r.Topics[name].Nodes
				if !slices.Contains(tp.Nodes, dead) {
					if !slices.Equal(now, tp.Nodes) {
						t.Fatalf("topic %s not on %s moved: %v → %v", name, dead, tp.Nodes, now)
					}
					continue
				}
				hadDead++
				if slices.Contains(now, dead) {
					t.Fatalf("topic %s still on dead %s", name, dead)
				}
				survivor := slices.DeleteFunc(slices.Clone(tp.Nodes), func(s string) bool { return s == dead })
				if !slices.Contains(now, survivor[0]) {
					t.Fatalf("topic %s lost its live node %s: %v → %v", name, survivor[0], tp.Nodes, now)
				}
			}
			t.Logf("%s died: %d topics were on it, %d moved (MaxMoves 5 does not limit them)", dead, hadDead, len(moves))
			if len(moves) != hadDead {
				t.Fatalf("%d moves, want %d (the dead node's topics)", len(moves), hadDead)
			}
			for _, m := range moves {
				if len(m.Add) != 1 || !slices.Equal(m.Remove, []string{dead}) {
					t.Fatalf("move %+v, want one node replacing %s", m, dead)
				}
			}
		})
	}
}

func TestPlanDrain(t *testing.T) {
	needs := topicNeeds(300, 2)
	ids := []string{"a", "b", "c", "d"}
	base, _ := Plan(mkNodes(ids...), needs, Record{}, Options{})
	drain := base.Clone()
	drain.Drained = []string{"c"}
	drained, moves := Plan(mkNodes(ids...), needs, drain, Options{MaxMoves: 20})
	assertReplicas(t, drained, 300, 2)
	if n := slots(drained)["c"]; n != 0 {
		t.Fatalf("drained node serves %d topics", n)
	}
	if !slices.Equal(drained.Drained, []string{"c"}) {
		t.Fatalf("Drained = %v", drained.Drained)
	}
	if len(moves) != slots(base)["c"] {
		t.Fatalf("%d moves, want %d (c's topics)", len(moves), slots(base)["c"])
	}
	t.Logf("drain c: %d topics moved off it", len(moves))

	cur := drained.Clone()
	cur.Drained = nil
	var perRound []int
	for range 30 {
		next, moves := Plan(mkNodes(ids...), needs, cur, Options{MaxMoves: 20})
		if len(moves) == 0 {
			break
		}
		if len(moves) > 20 {
			t.Fatalf("undrain round moved %d topics, want at most 20", len(moves))
		}
		perRound = append(perRound, slots(next)["c"])
		cur = next
	}
	t.Logf("undrain c: c serves %v topics after each round (had %d before the drain)", perRound, slots(base)["c"])
	if len(perRound) < 2 || perRound[0] != 20 {
		t.Fatalf("undrain not gradual: %v", perRound)
	}
	back := slots(cur)["c"]
	if back < slots(base)["c"]*9/10 || back > slots(base)["c"]*11/10 {
		t.Fatalf("undrained c serves %d topics, had %d", back, slots(base)["c"])
	}
	t.Logf("after undrain %d topics differ from before the drain", len(changedTopics(base, cur)))
}

func TestPlanLabels(t *testing.T) {
	nodes := []NodeInfo{
		{ID: "a", Engines: allEngines, Labels: map[string]string{"pool": "cpu", "zone": "a"}},
		{ID: "b", Engines: allEngines, Labels: map[string]string{"pool": "gpu", "zone": "a"}},
		{ID: "c", Engines: allEngines, Labels: map[string]string{"pool": "gpu", "zone": "b"}},
		{ID: "d", Engines: allEngines, Labels: map[string]string{"pool": "cpu", "zone": "b"}},
	}
	var needs []Need
	for i := range 40 {
		topic := fmt.Sprintf("infer.%02d", i)
		needs = append(needs,
			Need{WorkerID: topic + "-gpu", Topic: topic, Engine: "python", Replicas: -1, Weight: 3, Require: map[string]string{"pool": "gpu"}},
			Need{WorkerID: topic + "-any", Topic: topic, Engine: "native", Replicas: -1, Weight: 1})
	}
	needs = append(needs,
		Need{WorkerID: "w-tpu", Topic: "mixed", Engine: "native", Replicas: -1, Require: map[string]string{"pool": "tpu"}},
		Need{WorkerID: "w-plain", Topic: "mixed", Engine: "native", Replicas: -1})
	r, _ := Plan(nodes, needs, Record{}, Options{})
	for i := range 40 {
		got := r.Topics[fmt.Sprintf("infer.%02d", i)].Nodes
		if !slices.Equal(got, []string{"b", "c"}) {
			t.Fatalf("gpu topic on %v, want [b c]", got)
		}
	}
	mixed := r.Topics["mixed"]
	if len(mixed.Nodes) != 2 {
		t.Fatalf("mixed topic on %v, want two nodes for w-plain", mixed.Nodes)
	}
	reason := mixed.Unplaceable["w-tpu"]
	t.Logf("w-tpu unplaceable: %s", reason)
	if !strings.Contains(reason, "label pool=tpu") || !strings.Contains(reason, "a{pool=cpu,zone=a}") {
		t.Fatalf("reason %q does not name the label and the nodes", reason)
	}
	if _, ok := mixed.Unplaceable["w-plain"]; ok || len(mixed.Unplaceable) != 1 {
		t.Fatalf("Unplaceable = %v, want only w-tpu", mixed.Unplaceable)
	}
	// Two workers each placeable but not on one node together.
	r, _ = Plan(nodes, []Need{
		{WorkerID: "x-cpu", Topic: "split", Require: map[string]string{"pool": "cpu"}},
		{WorkerID: "y-gpu", Topic: "split", Require: map[string]string{"pool": "gpu"}},
	}, Record{}, Options{})
	split := r.Topics["split"]
	if !slices.Equal(split.Nodes, []string{"a", "d"}) || !strings.Contains(split.Unplaceable["y-gpu"], "together") {
		t.Fatalf("split topic = %+v, want on a, d with y-gpu unplaceable", split)
	}
	// No live node at all.
	r, _ = Plan(nil, needs[:1], Record{}, Options{})
	if tp := r.Topics["infer.00"]; len(tp.Nodes) != 0 || tp.Unplaceable["infer.00-gpu"] == "" {
		t.Fatalf("without nodes: %+v", tp)
	}
}

func TestPlanEngines(t *testing.T) {
	nodes := []NodeInfo{
		{ID: "a", Engines: []string{"native", "python"}},
		{ID: "b", Engines: []string{"native", "dotnet"}},
		{ID: "c", Engines: []string{"dotnet", "native", "python"}},
		{ID: "d", Engines: []string{"native"}},
	}
	var needs []Need
	for i := range 30 {
		needs = append(needs, Need{WorkerID: fmt.Sprintf("cs%02d", i), Topic: fmt.Sprintf("cs.%02d", i), Engine: "dotnet", Replicas: -1, Weight: 2})
	}
	needs = append(needs,
		Need{WorkerID: "both-cs", Topic: "both", Engine: "dotnet", Replicas: 2},
		Need{WorkerID: "both-py", Topic: "both", Engine: "python", Replicas: 2},
		Need{WorkerID: "j", Topic: "java", Engine: "java", Replicas: 2})
	r, _ := Plan(nodes, needs, Record{}, Options{})
	for i := range 30 {
		if got := r.Topics[fmt.Sprintf("cs.%02d", i)].Nodes; !slices.Equal(got, []string{"b", "c"}) {
			t.Fatalf("dotnet topic on %v, want [b c]", got)
		}
	}
	if got := r.Topics["both"].Nodes; !slices.Equal(got, []string{"c"}) {
		t.Fatalf("dotnet+python topic on %v, want [c] (the only node running both)", got)
	}
	java := r.Topics["java"]
	t.Logf("java unplaceable: %s", java.Unplaceable["j"])
	if len(java.Nodes) != 0 || !strings.Contains(java.Unplaceable["j"], "engine java") {
		t.Fatalf("java topic = %+v, want no node and a reason naming the engine", java)
	}
}

func TestPlanReplicas(t *testing.T) {
	nodes := mkNodes("a", "b", "c", "d", "e")
	needs := []Need{
		{WorkerID: "all", Topic: "everywhere", Replicas: All},
		{WorkerID: "one", Topic: "single", Replicas: 1},
		{WorkerID: "ten", Topic: "many", Replicas: 10},
		{WorkerID: "def", Topic: "default", Replicas: -1},
		{WorkerID: "m1", Topic: "mixed", Replicas: 1},
		{WorkerID: "m3", Topic: "mixed", Replicas: 3},
		{WorkerID: "n1", Topic: "mixedall", Replicas: 1},
		{WorkerID: "nall", Topic: "mixedall", Replicas: All},
	}
	r, _ := Plan(nodes, needs, Record{Drained: []string{"e"}}, Options{})
	want := map[string]struct{ nodes, replicas int }{
		"everywhere": {4, All}, "single": {1, 1}, "many": {4, 10}, "default": {2, 2},
		"mixed": {3, 3}, "mixedall": {4, All},
	}
	for topic, w := range want {
		tp := r.Topics[topic]
		if len(tp.Nodes) != w.nodes || tp.Replicas != w.replicas || slices.Contains(tp.Nodes, "e") {
			t.Errorf("topic %s = %+v, want %d nodes (not drained e), replicas %d", topic, tp, w.nodes, w.replicas)
		}
	}
	r, _ = Plan(nodes, needs[3:4], Record{}, Options{DefaultReplicas: 3})
	if tp := r.Topics["default"]; len(tp.Nodes) != 3 || tp.Replicas != 3 {
		t.Fatalf("DefaultReplicas 3: %+v", tp)
	}
	// A topic on more nodes than it asks for keeps its best scored ones.
	prev := Record{Topics: map[string]TopicPlacement{"single": {Nodes: []string{"a", "b", "c"}}}}
	r, moves := Plan(nodes, needs[1:2], prev, Options{})
	if got := r.Topics["single"].Nodes; len(got) != 1 || len(moves) != 1 || len(moves[0].Remove) != 2 {
		t.Fatalf("shrink to 1: %v, moves %+v", got, moves)
	}
}

func TestPlanDropsTopicsWithoutNeeds(t *testing.T) {
	prev := Record{Topics: map[string]TopicPlacement{
		"gone": {Nodes: []string{"b", "a"}, Replicas: 2},
		"kept": {Nodes: []string{"a", "b"}, Replicas: 2},
	}}
	r, moves := Plan(mkNodes("a", "b", "c"), []Need{{WorkerID: "k", Topic: "kept", Replicas: 2}}, prev, Options{})
	if _, ok := r.Topics["gone"]; ok {
		t.Fatal("topic without needs still placed")
	}
	if !slices.Equal(r.Topics["kept"].Nodes, []string{"a", "b"}) {
		t.Fatalf("kept topic moved to %v", r.Topics["kept"].Nodes)
	}
	if !reflect.DeepEqual(moves, []Move{{Topic: "gone", Remove: []string{"a", "b"}}}) {
		t.Fatalf("moves = %+v", moves)
	}
}

func TestPlanDeterministic(t *testing.T) {
	nodes, needs := benchInputs()
	prev, _ := Plan(nodes[:15], needs, Record{}, Options{})
	want, wantMoves := Plan(nodes, needs, prev, Options{MaxMoves: 30})
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10 {
		n, w := slices.Clone(nodes), slices.Clone(needs)
		rng.Shuffle(len(n), func(i, j int) { n[i], n[j] = n[j], n[i] })
		rng.Shuffle(len(w), func(i, j int) { w[i], w[j] = w[j], w[i] })
		p := prev.Clone()
		for k, tp := range p.Topics {
			rng.Shuffle(len(tp.Nodes), func(i, j int) { tp.Nodes[i], tp.Nodes[j] = tp.Nodes[j], tp.Nodes[i] })
			p.Topics[k] = tp
		}
		got, gotMoves := Plan(n, w, p, Options{MaxMoves: 30})
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotMoves, wantMoves) {
			t.Fatal("shuffled inputs give another plan")
		}
	}
}

// TestPlanBoundedLoad checks the documented bound on a mixed cluster and
// that Plan is fast.
func TestPlanBoundedLoad(t *testing.T) {
	nodes, needs := benchInputs()
	start := time.Now()
	r, _ := Plan(nodes, needs, Record{}, Options{})
	elapsed := time.Since(start)
	demand := 0
	w := map[string]int{}
	for _, n := range needs {
		w[n.Topic] += max(n.Weight, 1)
	}
	for name, tp := range r.Topics {
		demand += w[name] * len(tp.Nodes)
	}
	bound := int(math.Ceil(1.25 * float64(demand) / float64(len(nodes))))
	l := loads(r, needs)
	lo, hi := math.MaxInt, 0
	for _, v := range l {
		lo, hi = min(lo, v), max(hi, v)
	}
	t.Logf("500 topics / 1000 workers / 20 nodes: loads %d..%d, mean %d, bound %d, planned in %v",
		lo, hi, demand/len(nodes), bound, elapsed)
	if hi > bound {
		t.Fatalf("a node carries %d, above the bound %d", hi, bound)
	}
	if elapsed > time.Second {
		t.Fatalf("Plan took %v", elapsed)
	}
}

// benchInputs: 1,000 workers on 500 topics on 20 nodes, mixed engines,
// weights and replicas.
func benchInputs() ([]NodeInfo, []Need) {
	var nodes []NodeInfo
	for i := range 20 {
		nodes = append(nodes, NodeInfo{
			ID:      fmt.Sprintf("node-%02d", i),
			Engines: []string{"native", "python", "dotnet"},
			Labels:  map[string]string{"zone": fmt.Sprint("z", i%3)},
		})
	}
	var needs []Need
	for i := range 1000 {
		topic := fmt.Sprintf("topic.%03d", i%500)
		n := Need{WorkerID: fmt.Sprintf("w%04d", i), Topic: topic, Engine: "native", Replicas: -1, Weight: 1}
		switch i % 5 {
		case 1:
			n.Engine, n.Weight = "python", 3
		case 2:
			n.Engine, n.Weight, n.Replicas = "dotnet", 4, 3
		}
		needs = append(needs, n)
	}
	return nodes, needs
}

func BenchmarkPlan(b *testing.B) {
	nodes, needs := benchInputs()
	prev, _ := Plan(nodes[:19], needs, Record{}, Options{})
	b.ResetTimer()
	for b.Loop() {
		Plan(nodes, needs, prev, Options{MaxMoves: 50})
	}
}
