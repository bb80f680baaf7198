package placement_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/state"
)

type cluster struct {
	store *placement.Store
	alive []string
	p     *placement.Placer
}

func newCluster(t *testing.T, nodes ...placement.NodeInfo) *cluster {
	t.Helper()
	c := &cluster{store: placement.NewStore(state.NewMemoryStore())}
	for _, n := range nodes {
		if err := c.store.Advertise(context.Background(), n, 0); err != nil {
			t.Fatal(err)
		}
		c.alive = append(c.alive, n.ID)
	}
	c.p = &placement.Placer{Store: c.store, Replicas: 2, Alive: func(context.Context) ([]string, error) { return c.alive, nil },
		EngineOf: func(mime string) string { return mime }}
	return c
}

func node(id string, labels map[string]string, engines ...string) placement.NodeInfo {
	if len(engines) == 0 {
		engines = []string{"python", "native"}
	}
	return placement.NodeInfo{ID: id, Labels: labels, Engines: engines}
}

func worker(id, topic, engine string) catalog.Worker {
	return catalog.Worker{ID: id, Topic: topic, MIMEType: engine, Status: catalog.StatusRunning}
}

// A create places its new topic at once on replicas nodes that can run it;
// a later worker of the topic that asks for more replicas adds nodes, never
// takes any away; a worker no node can run is recorded with why.
func TestEnsurePlacesANewTopicAndOnlyAdds(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, node("a", nil), node("b", nil), node("c", map[string]string{"pool": "gpu"}), node("d", nil, "native"))
	tp, err := c.p.Ensure(ctx, worker("w1", "t", "python"))
	if err != nil {
		t.Fatal(err)
	}
	if len(tp.Nodes) != 2 || slices.Contains(tp.Nodes, "d") {
		t.Fatalf("new topic placed on %v: want 2 nodes that run python", tp.Nodes)
	}
	three := 3
	w2 := worker("w2", "t", "python")
	w2.Placement = &catalog.Placement{Replicas: &three}
	tp2, err := c.p.Ensure(ctx, w2)
	if err != nil {
		t.Fatal(err)
	}
	if len(tp2.Nodes) != 3 || !slices.Contains(tp2.Nodes, tp.Nodes[0]) || !slices.Contains(tp2.Nodes, tp.Nodes[1]) {
		t.Fatalf("replicas 3: %v (was %v)", tp2.Nodes, tp.Nodes)
	}
	w3 := worker("w3", "u", "python")
	w3.Placement = &catalog.Placement{Require: map[string]string{"pool": "tpu"}}
	tp3, err := c.p.Ensure(ctx, w3)
	if err != nil {
		t.Fatal(err)
	}
	if tp3.Unplaceable["w3"] == "" || len(tp3.Nodes) == 0 {
		t.Fatalf("unplaceable worker: %+v (its topic must still be served, so that it dead-letters as not_runnable)", tp3)
	}
	rec, _ := c.store.Load(ctx)
	if rec.Revision != 3 {
		t.Fatalf("revision %d after three changes", rec.Revision)
	}
	// Asked again: nothing to do, nothing written.
	if _, err := c.p.Ensure(ctx, worker("w1", "t", "python")); err != nil {
		t.Fatal(err)
	}
	if rec2, _ := c.store.Load(ctx); rec2.Revision != rec.Revision {
		t.Fatalf("a placed topic was written again: revision %d → %d", rec.Revision, rec2.Revision)
	}
}

// PlanAll keeps a moved topic's old nodes serving (Leaving) until
// FinishMoves; a dead node is not kept; a drained node is emptied.
func TestPlanAllMovesMakeBeforeBreak(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, node("a", nil), node("b", nil), node("c", nil))
	var ws []catalog.Worker
	for i := range 30 {
		ws = append(ws, worker("w"+string(rune('A'+i)), "t"+string(rune('A'+i)), "python"))
	}
	r1, err := c.p.PlanAll(ctx, ws, 0)
	if err != nil || r1.Revision == 0 {
		t.Fatalf("first plan: %+v %v", r1, err)
	}
	if r, _ := c.p.PlanAll(ctx, ws, 0); r.Revision != 0 {
		t.Fatalf("a plan with nothing new wrote revision %d", r.Revision)
	}
	if err := c.p.SetDrained(ctx, "c", true); err != nil {
		t.Fatal(err)
	}
	r2, err := c.p.PlanAll(ctx, ws, 0)
	var fromC []string
	for _, l := range r2.Losing {
		if l.Node == "c" {
			fromC = l.Topics
		}
	}
	if err != nil || len(fromC) == 0 {
		t.Fatalf("drain plan: %+v %v", r2, err)
	}
	rec, _ := c.store.Load(ctx)
	for _, topic := range fromC {
		tp := rec.Topics[topic]
		if slices.Contains(tp.Nodes, "c") || !slices.Contains(tp.Leaving, "c") || !slices.Contains(tp.Serving(), "c") {
			t.Fatalf("topic %s leaving c: %+v (c must serve until the move finishes)", topic, tp)
		}
	}
	if _, err := c.p.FinishMoves(ctx, fromC); err != nil {
		t.Fatal(err)
	}
	rec, _ = c.store.Load(ctx)
	for name, tp := range rec.Topics {
		if slices.Contains(tp.Serving(), "c") || len(tp.Nodes) != 2 {
			t.Fatalf("after the drain, topic %s: %+v", name, tp)
		}
	}
	// b dies: its topics are placed again, b is not kept in Leaving.
	c.alive = []string{"a", "c"}
	if err := c.p.SetDrained(ctx, "c", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.p.PlanAll(ctx, ws, 0); err != nil {
		t.Fatal(err)
	}
	rec, _ = c.store.Load(ctx)
	for name, tp := range rec.Topics {
		if slices.Contains(tp.Serving(), "b") || len(tp.Nodes) != 2 {
			t.Fatalf("after b died, topic %s: %+v", name, tp)
		}
	}
}

func TestParseLabels(t *testing.T) {
	got, err := placement.ParseLabels("zone=a, pool=cpu")
	if err != nil || got["zone"] != "a" || got["pool"] != "cpu" {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"zone", "zone=a,zone=b", "zo ne=a", "=a"} {
		if _, err := placement.ParseLabels(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// A topic a create placed a moment ago is kept by a plan that does not see
// its worker yet (the create's Apply writes the record after placing it):
// the nodes it told to attach the worker keep it.
func TestPlanKeepsATopicACreateJustPlaced(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, node("a", nil), node("b", nil), node("c", nil))
	tp, err := c.p.Ensure(ctx, worker("w1", "new", "python"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.p.PlanAll(ctx, nil, 0) // the record of w1 not written yet
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := c.store.Load(ctx)
	if got := rec.Topics["new"]; !slices.Equal(got.Nodes, tp.Nodes) || len(r.Moves) != 0 {
		t.Fatalf("after a plan without its worker: %+v (moves %+v), want %v kept", got, r.Moves, tp.Nodes)
	}
}

// recordReads counts the reads of the placement record's key.
type recordReads struct {
	state.Store
	n int
}

func (r *recordReads) Get(ctx context.Context, key string) (state.Item, error) {
	if key == placement.RecordKey {
		r.n++
	}
	return r.Store.Get(ctx, key)
}

// Place reads the record once, placed topic or new, and returns it as it
// left it; a follower that observes it knows the topic without a read, and
// never goes back to an older record.
func TestPlaceReadsTheRecordOnceAndTheFollowerObservesIt(t *testing.T) {
	ctx := context.Background()
	rr := &recordReads{Store: state.NewMemoryStore()}
	store := placement.NewStore(rr)
	for _, id := range []string{"a", "b"} {
		if err := store.Advertise(ctx, node(id, nil), 0); err != nil {
			t.Fatal(err)
		}
	}
	p := &placement.Placer{Store: store, Replicas: 2, Alive: func(context.Context) ([]string, error) { return []string{"a", "b"}, nil },
		EngineOf: func(mime string) string { return mime }}
	tp, rec, err := p.Place(ctx, worker("w1", "new", "python"))
	if err != nil || len(tp.Nodes) != 2 || rec.Revision != 1 || !slices.Equal(rec.Topics["new"].Nodes, tp.Nodes) {
		t.Fatalf("a new topic: %+v, record %+v, %v", tp, rec, err)
	}
	if rr.n != 1 {
		t.Fatalf("placing a new topic read the record %d times, want 1", rr.n)
	}
	rr.n = 0
	if _, again, err := p.Place(ctx, worker("w2", "new", "python")); err != nil || again.Revision != 1 || rr.n != 1 {
		t.Fatalf("a placed topic: revision %d, %d reads, %v; want no write and one read", again.Revision, rr.n, err)
	}

	changes := 0
	f := &placement.Follower{Self: "a", Store: store, Replicas: 2, Alive: func() []string { return []string{"a", "b"} }, OnChange: func() { changes++ }}
	rr.n = 0
	if !f.Observe(rec) || !f.Serves(ctx, "new") || rr.n != 0 || changes != 1 {
		t.Fatalf("after observing the record: serves %v, %d reads, %d changes; want served, no read, one change", f.Serves(ctx, "new"), rr.n, changes)
	}
	if f.Observe(placement.Record{Revision: 0}) || f.Record().Revision != 1 || changes != 1 {
		t.Fatal("the follower took an older record")
	}
}

// allReads counts every single Get that reaches the memory store.
type allReads struct {
	*state.MemoryStore
	n atomic.Int32
}

func (r *allReads) Get(ctx context.Context, key string) (state.Item, error) {
	r.n.Add(1)
	return r.MemoryStore.Get(ctx, key)
}

// Read ahead (ReadAhead), a Place reads the record, the membership and
// every live node's advertisement in one bulk read and no single read,
// and places as it does without.
func TestPlaceReadAheadReadsOnce(t *testing.T) {
	ctx := context.Background()
	reads := &allReads{MemoryStore: state.NewMemoryStore()}
	s := state.WithPrefetch(reads)
	store := placement.NewStore(s)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		if err := store.Advertise(ctx, node(id, nil), 0); err != nil {
			t.Fatal(err)
		}
	}
	const membersKey = "members"
	if err := s.Put(ctx, membersKey, []byte(`["a","b","c"]`), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &placement.Placer{Store: store, Replicas: 2, AliveKeys: []string{membersKey}, Seen: func() []string { return ids },
		Alive: func(ctx context.Context) ([]string, error) {
			it, err := s.Get(ctx, membersKey)
			var alive []string
			if err == nil {
				err = json.Unmarshal(it.Value, &alive)
			}
			return alive, err
		},
		EngineOf: func(mime string) string { return mime }}
	tp, rec, err := p.Place(p.ReadAhead(ctx), worker("w1", "new", "python"))
	if err != nil || len(tp.Nodes) != 2 || rec.Revision != 1 {
		t.Fatalf("a new topic: %+v, record %+v, %v", tp, rec, err)
	}
	if n := reads.n.Load(); n != 0 {
		t.Fatalf("%d single reads; want none (one bulk read)", n)
	}
	reads.n.Store(0)
	if _, again, err := p.Place(ctx, worker("w2", "new", "python")); err != nil || again.Revision != 1 || reads.n.Load() != 5 {
		t.Fatalf("without the read-ahead: revision %d, %d single reads, %v; want the same record and 5 reads", again.Revision, reads.n.Load(), err)
	}
}
