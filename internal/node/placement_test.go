package node_test

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/state"
)

// placeTopic writes a placement record that serves topic on nodes.
func placeTopic(t *testing.T, s *placement.Store, topic string, nodes ...string) {
	t.Helper()
	if _, err := s.Update(context.Background(), func(r *placement.Record) bool {
		if r.Topics == nil {
			r.Topics = map[string]placement.TopicPlacement{}
		}
		r.Topics[topic] = placement.TopicPlacement{Nodes: nodes, Replicas: len(nodes)}
		return true
	}); err != nil {
		t.Fatal(err)
	}
}

// A node serves only the topics placed on it: the workers of a topic
// placed elsewhere are parked (never attached, never subscribed), and a
// move brings every worker of the topic in at once, or takes them all away.
func TestNodeServesOnlyItsTopics(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	ps := placement.NewStore(f.Store)
	fol := &placement.Follower{Self: "me", Store: ps, Replicas: 2, Alive: func() []string { return []string{"me", "other", "third"} }}
	f.Node.SetPlacement(fol)
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	for _, id := range []string{"w1", "w2"} {
		w := nodetest.Worker(catalog.StatusRunning, sha)
		w.ID, w.Group = id, ""
		if err := f.Catalog.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	placeTopic(t, ps, "in", "other", "third")
	// The follower has read nothing yet: Reconcile's first questions,
	// asked at once, read the record (placement's
	// TestConcurrentFirstQuestionsAnswerByTheRecord).
	if _, err := f.Node.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Dispatcher.Attached("w1") || f.Dispatcher.Attached("w2") || f.Dispatcher.Subscribed("in") || f.Broker.Subscriptions() != 0 {
		t.Fatal("a topic placed on other nodes is served here")
	}
	if !f.Dispatcher.Unrunnable("w1") || !f.Dispatcher.Unrunnable("w2") {
		t.Fatal("the workers of a topic served elsewhere must be parked here (a racing attach gives its messages back)")
	}

	placeTopic(t, ps, "in", "me", "other") // third leaves, me joins
	if _, err := fol.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := f.Node.ConvergePlacement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Dispatcher.Attached("w1") || !f.Dispatcher.Attached("w2") || res.Attached != 2 || !slices.Equal(res.Topics, []string{"in"}) {
		t.Fatalf("after the move here: %+v, attached w1 %v w2 %v", res, f.Dispatcher.Attached("w1"), f.Dispatcher.Attached("w2"))
	}
	if n, share, err := f.Node.Share(ctx); err != nil || n != 2 || share != 2 {
		t.Fatalf("share: %d of %d, %v", n, share, err)
	}

	placeTopic(t, ps, "in", "other", "third")
	if _, err := fol.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	res, err = f.Node.ConvergePlacement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f.Dispatcher.Attached("w1") || f.Dispatcher.Attached("w2") || res.Detached != 2 || len(res.Topics) != 0 {
		t.Fatalf("after the move away: %+v", res)
	}
	if n, share, _ := f.Node.Share(ctx); n != 0 || share != 0 {
		t.Fatalf("share after the move away: %d of %d", n, share)
	}
}

// A topic the record does not place (or places only on dead nodes) is
// served by the fallback ranking of the live nodes: the same answer on
// every node, so nodes that start together split the topics.
func TestUnplacedTopicsFollowTheFallbackRanking(t *testing.T) {
	alive := []string{"a", "b", "c"}
	served := map[string]int{}
	for _, self := range alive {
		f, ctx := nodetest.New(t), context.Background()
		fol := &placement.Follower{Self: self, Store: placement.NewStore(f.Store), Replicas: 2, Alive: func() []string { return alive }}
		placeTopic(t, placement.NewStore(f.Store), "dead-only", "gone-1", "gone-2")
		for i := range 60 {
			topic := "t" + string(rune('A'+i%26)) + string(rune('a'+i/26))
			if fol.Serves(ctx, topic) {
				served[topic]++
			}
		}
		if !fol.Serves(ctx, "dead-only") == slices.Contains(placement.Fallback(alive, nil, "dead-only", 2), self) {
			t.Fatalf("%s: a topic placed only on dead nodes must follow the fallback", self)
		}
	}
	for topic, n := range served {
		if n != 2 {
			t.Fatalf("topic %s served by %d nodes, want 2", topic, n)
		}
	}
	if len(served) != 60 {
		t.Fatalf("%d of 60 topics served", len(served))
	}
}

// A worker whose topic is served here but who requires a label this node
// lacks is parked (its messages wait or dead-letter as not_runnable), not
// loaded.
func TestWorkerRequiringALabelTheNodeLacksIsParked(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	fol := &placement.Follower{Self: "me", Store: placement.NewStore(f.Store), Replicas: 2, Labels: map[string]string{"pool": "cpu"},
		Alive: func() []string { return []string{"me"} }}
	f.Node.SetPlacement(fol)
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := nodetest.Worker(catalog.StatusRunning, sha)
	w.Placement = &catalog.Placement{Require: map[string]string{"pool": "gpu"}}
	if err := f.Node.Apply(ctx, w, nil); err != nil {
		t.Fatal(err)
	}
	if f.Dispatcher.Attached(w.ID) || !f.Dispatcher.Unrunnable(w.ID) || f.Engine.Loads() != 0 {
		t.Fatalf("attached %v unrunnable %v loads %d", f.Dispatcher.Attached(w.ID), f.Dispatcher.Unrunnable(w.ID), f.Engine.Loads())
	}
}

// A worker that no live node can run (the record says so) is held: its
// topic is subscribed here although nothing of it is loaded, so that its
// messages dead-letter as not_runnable instead of waiting unseen; once
// the record no longer says so it is parked and the subscription ends.
func TestUnplaceableWorkerKeepsItsTopicSubscribed(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	ps := placement.NewStore(f.Store)
	fol := &placement.Follower{Self: "me", Store: ps, Replicas: 2, Labels: map[string]string{"pool": "cpu"},
		Alive: func() []string { return []string{"me"} }}
	f.Node.SetPlacement(fol)
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := nodetest.Worker(catalog.StatusRunning, sha)
	w.Group = ""
	w.Placement = &catalog.Placement{Require: map[string]string{"pool": "tpu"}}
	setTopic := func(unplaceable bool) {
		t.Helper()
		if _, err := ps.Update(ctx, func(r *placement.Record) bool {
			tp := placement.TopicPlacement{Nodes: []string{"me"}, Replicas: 2}
			if unplaceable {
				tp.Unplaceable = map[string]string{w.ID: "no live node has label pool=tpu"}
			}
			r.Topics = map[string]placement.TopicPlacement{w.Topic: tp}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := fol.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	setTopic(true)
	if err := f.Node.Apply(ctx, w, nil); err != nil {
		t.Fatal(err)
	}
	if !f.Dispatcher.Held(w.ID) || f.Dispatcher.Attached(w.ID) || f.Engine.Loads() != 0 {
		t.Fatalf("held %v attached %v loads %d: want held, nothing loaded", f.Dispatcher.Held(w.ID), f.Dispatcher.Attached(w.ID), f.Engine.Loads())
	}
	waitServed(t, f, w.Topic, true)

	setTopic(false) // the placement is catching up: another node can run it
	if err := f.Node.Apply(ctx, w, nil); err != nil {
		t.Fatal(err)
	}
	if f.Dispatcher.Held(w.ID) || !f.Dispatcher.Unrunnable(w.ID) {
		t.Fatalf("held %v unrunnable %v: want parked", f.Dispatcher.Held(w.ID), f.Dispatcher.Unrunnable(w.ID))
	}
	waitServed(t, f, w.Topic, false)

	// Held again, then its topic moves to other nodes: this node lets the
	// topic go, by an apply and by ConvergePlacement, so that it never
	// gives back or dead-letters messages another node may run.
	fol.Alive = func() []string { return []string{"me", "other"} }
	moveAway := func() {
		t.Helper()
		if _, err := ps.Update(ctx, func(r *placement.Record) bool {
			r.Topics = map[string]placement.TopicPlacement{w.Topic: {Nodes: []string{"other"}, Replicas: 1,
				Unplaceable: map[string]string{w.ID: "no live node has label pool=tpu"}}}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := fol.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, how := range []string{"apply", "converge"} {
		setTopic(true)
		if err := f.Node.Apply(ctx, w, nil); err != nil {
			t.Fatal(err)
		}
		waitServed(t, f, w.Topic, true)
		moveAway()
		var err error
		if how == "apply" {
			err = f.Node.Apply(ctx, w, nil)
		} else {
			_, err = f.Node.ConvergePlacement(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		if f.Dispatcher.Held(w.ID) {
			t.Fatalf("%s: still held after its topic moved to another node", how)
		}
		waitServed(t, f, w.Topic, false)
	}
}

// waitServed waits until the node's subscription to topic is (want) or
// is not confirmed.
func waitServed(t *testing.T, f *nodetest.Fixture, topic string, want bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); f.Dispatcher.Subscribed(topic) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("subscribed to %s: %v, want %v", topic, !want, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// readCounter is a store that counts the reads of each key.
type readCounter struct {
	state.Store
	mu    sync.Mutex
	reads map[string]int
}

func (r *readCounter) Get(ctx context.Context, key string) (state.Item, error) {
	r.mu.Lock()
	r.reads[key]++
	r.mu.Unlock()
	return r.Store.Get(ctx, key)
}

func (r *readCounter) workerReads() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, n := range r.reads {
		if id, ok := strings.CutPrefix(k, "workmanager/workers/"); ok && !strings.Contains(id, "/") {
			out[id] = n
		}
	}
	clear(r.reads)
	return out
}

// A convergence reads the records of the workers not attached here only:
// those attached stay as they are (their topics are served), so a node
// that runs its whole share reads no record, and a running worker of a
// served topic that is not attached yet (w3) is found and attached.
func TestConvergenceReadsOnlyWorkersNotAttached(t *testing.T) {
	rc := &readCounter{reads: map[string]int{}}
	f := nodetest.NewOnStore(t, func(s state.Store) state.Store { rc.Store = s; return rc })
	ctx := context.Background()
	ps := placement.NewStore(f.Store)
	fol := &placement.Follower{Self: "me", Store: ps, Replicas: 2, Alive: func() []string { return []string{"me", "other"} }}
	f.Node.SetPlacement(fol)
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	save := func(id string, status catalog.Status) {
		w := nodetest.Worker(status, sha)
		w.ID, w.Group = id, ""
		if err := f.Catalog.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	save("w1", catalog.StatusRunning)
	save("w2", catalog.StatusRunning)
	save("stopped", catalog.StatusStopped)
	placeTopic(t, ps, "in", "me", "other")
	if _, err := fol.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Node.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if !f.Dispatcher.Attached("w1") || !f.Dispatcher.Attached("w2") {
		t.Fatal("the reconcile did not attach the running workers")
	}
	rc.workerReads()

	res, err := f.Node.ConvergePlacement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if reads := rc.workerReads(); reads["w1"] != 0 || reads["w2"] != 0 || reads["stopped"] != 1 {
		t.Fatalf("records read by a convergence with w1 and w2 attached: %v, want only the stopped worker's", reads)
	}
	if res.Attached != 0 || !slices.Equal(res.Topics, []string{"in"}) {
		t.Fatalf("convergence with nothing to do: %+v", res)
	}

	save("w3", catalog.StatusRunning) // running, not attached here yet
	res, err = f.Node.ConvergePlacement(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Dispatcher.Attached("w3") || res.Attached != 1 || !slices.Equal(res.Topics, []string{"in"}) {
		t.Fatalf("a running worker not attached: %+v, attached %v", res, f.Dispatcher.Attached("w3"))
	}
	if reads := rc.workerReads(); reads["w1"] != 0 || reads["w2"] != 0 || reads["w3"] == 0 {
		t.Fatalf("records read: %v, want w3's and not w1's or w2's", reads)
	}
}

// A node checks code for any worker (the check runs on whichever node
// takes the activity) but loads only the workers of topics it serves: a
// check for a topic placed elsewhere tells the engine so
// (Spec.LoadsElsewhere), which then keeps nothing of it for a Load here;
// a topic not placed yet (a create's) goes by the fallback ranking. The
// node reads nothing for it: the view it has decides.
func TestCheckOfATopicServedElsewhereKeepsNothing(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	ps := placement.NewStore(f.Store)
	alive := []string{"me", "other", "third"}
	fol := &placement.Follower{Self: "me", Store: ps, Replicas: 2, Alive: func() []string { return alive }}
	f.Node.SetPlacement(fol)
	// Two new topics, one the fallback ranking gives this node and one it
	// does not.
	var mine, notMine string
	for i := 0; mine == "" || notMine == ""; i++ {
		topic := "new-" + strconv.Itoa(i)
		if slices.Contains(placement.Fallback(alive, nil, topic, 2), "me") {
			mine = cmp.Or(mine, topic)
		} else {
			notMine = cmp.Or(notMine, topic)
		}
	}
	placeTopic(t, ps, mine, "other", "third") // placed elsewhere, the view has not read it yet
	placeTopic(t, ps, "here", "me", "other")
	check := func(topic string) bool {
		t.Helper()
		w := nodetest.Worker(catalog.StatusRunning, "")
		w.Topic = topic
		if err := f.Node.Check(ctx, w, []byte("good")); err != nil {
			t.Fatal(err)
		}
		checks := f.Engine.Checks()
		return checks[len(checks)-1].LoadsElsewhere
	}
	if check(mine) || !check(notMine) {
		t.Fatal("before the view has read the record: want the fallback ranking's answer")
	}
	if _, err := fol.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if !check(mine) || check("here") || !check(notMine) {
		t.Fatal("want LoadsElsewhere for the topics placed, or ranked, on other nodes only")
	}
}
