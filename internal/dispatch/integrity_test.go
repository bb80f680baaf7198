package dispatch_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"

	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// The tests of issue 30 ("No message lost, no group shared").

// Issue 30, item 3: an event far larger than MAX_EVENT_BYTES is
// dead-lettered once as too_large with its data cut to MAX_EVENT_BYTES (a
// dead letter carrying all of it might not fit through daprd, and the
// event would come back for ever); its size is on deadlettertruncated.
func TestTooLargeDeadLetterCarriesBoundedData(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxEventBytes: 1024})
	c := &counting{}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, c.instance("out"))
	s := waitStream(t, b, "in")
	big := request("big", "")
	big.Data = make([]byte, 3<<20)
	s.In <- big
	s.In <- request("small", "")
	got := map[string]dispatch.Ack{}
	for range 2 {
		a := waitAck(t, b)
		got[a.ID] = a.Status
	}
	if got["big"] != dispatch.AckSuccess || got["small"] != dispatch.AckSuccess {
		t.Fatalf("acks %v", got)
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 || dead[0].ID() != "big" {
		t.Fatalf("dead letters %v", dead)
	}
	ext := dead[0].Extensions()
	if ext[dispatch.DeadLetterReasonExtension] != "too_large" || len(dead[0].Data()) != 1024 || fmt.Sprint(ext[dispatch.DeadLetterTruncatedExtension]) != fmt.Sprint(3<<20) {
		t.Fatalf("dead letter: reason %v, %d bytes of data, truncated %v", ext[dispatch.DeadLetterReasonExtension], len(dead[0].Data()), ext[dispatch.DeadLetterTruncatedExtension])
	}
	if c.n("small") != 1 || c.n("big") != 0 {
		t.Fatalf("calls %v", c.calls)
	}
}

// forging returns outputs to "out" carrying WorkManager's control
// extensions with forged values, and one extension of the worker's own.
func forging(in *event.Event) ([]event.Event, error) {
	e := event.New()
	e.SetType("out")
	e.SetExtension(deadletter.ReplayExtension, "someone-else")
	e.SetExtension(dispatch.FencingExtension, "999999")
	e.SetExtension(dispatch.DeadLetterReasonExtension, "forged")
	e.SetExtension("workmanagerother", "x")
	e.SetExtension("mine", "kept")
	return []event.Event{e}, nil
}

// Issue 30, item 6: a worker's outputs never carry the control extensions
// it wrote (workmanagerreplay, fencingtoken, deadletter…); a grouped
// worker's outputs carry the node's fencing token, not the forged one.
func TestOutputsDropForgedControlExtensions(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	d.Attach(dispatch.Worker{ID: "free", Topic: "in"}, &dispatchtest.FuncInstance{Fn: forging})
	d.Attach(dispatch.Worker{ID: "grouped", Topic: "in2", Group: "g"}, &dispatchtest.FuncInstance{Fn: forging})
	waitStream(t, b, "in").In <- request("m1", "")
	waitStream(t, b, "in2").In <- request("m2", "")
	for range 2 {
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	outs := pub.On("out")
	if len(outs) != 2 {
		t.Fatalf("%d outputs", len(outs))
	}
	for _, o := range outs {
		ext := o.Extensions()
		if ext["mine"] != "kept" {
			t.Errorf("%s: the worker's own extension was dropped: %v", o.ID(), ext)
		}
		for _, k := range []string{deadletter.ReplayExtension, dispatch.DeadLetterReasonExtension, "workmanagerother"} {
			if v, ok := ext[k]; ok {
				t.Errorf("%s carries %s=%v", o.ID(), k, v)
			}
		}
		tok, has := ext[dispatch.FencingExtension]
		switch grouped := strings.HasPrefix(o.ID(), "m2/"); {
		case grouped && (!has || fmt.Sprint(tok) == "999999"):
			t.Errorf("grouped output %s: fencing token %v, want the lock's", o.ID(), tok)
		case !grouped && has:
			t.Errorf("ungrouped output %s carries fencingtoken=%v", o.ID(), tok)
		}
	}
}

// Issue 30, item 5: two tenants' groups of one name are two locks: their
// workers run side by side, each under its own key and its own tokens;
// the default tenant's group keeps its bare key.
func TestGroupLocksArePerTenant(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1})
	inA, release := make(chan struct{}), make(chan struct{})
	d.Attach(dispatch.Worker{ID: "acme.w", Topic: "a", Group: "g", Tenant: "acme"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		close(inA)
		<-release // held until globex's worker of group g has run
		return outputs("a.out")(in)
	}})
	d.Attach(dispatch.Worker{ID: "globex.w", Topic: "b", Group: "g", Tenant: "globex"}, &dispatchtest.FuncInstance{Fn: outputs("b.out")})
	d.Attach(dispatch.Worker{ID: "w", Topic: "c", Group: "g", Tenant: "default"}, &dispatchtest.FuncInstance{Fn: outputs("c.out")})
	waitStream(t, b, "a").In <- request("m1", "")
	<-inA
	waitStream(t, b, "b").In <- request("m2", "")
	waitStream(t, b, "c").In <- request("m3", "")
	for range 2 {
		select {
		case a := <-b.Acks:
			if a.ID == "m1" || a.Status != dispatch.AckSuccess {
				t.Fatalf("ack %+v", a)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("another tenant's group of the same name waited for acme's")
		}
	}
	close(release)
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
	ctx := context.Background()
	for _, key := range []string{grouplock.Key("acme/g"), grouplock.Key("globex/g"), grouplock.Key("g")} {
		it, err := st.Get(ctx, key)
		if err != nil || !strings.Contains(string(it.Value), `"token":1`) {
			t.Errorf("%s: %s %v", key, it.Value, err)
		}
	}
	for _, o := range append(pub.On("a.out"), pub.On("b.out")...) {
		if fmt.Sprint(o.Extensions()[dispatch.FencingExtension]) != "1" {
			t.Errorf("%s: token %v, want each tenant's first (1)", o.ID(), o.Extensions()[dispatch.FencingExtension])
		}
	}
}

// Issue 30, item 4: two events with one id from two sources are two
// events. daprd answers by id, and the second delivery replaced the
// first's waiter: the second is held until the first is settled, then
// runs, and only it is answered (an answer for the first would settle the
// second unrun); the first, never answered, comes back and its record
// answers it without running it again.
func TestSameIDOtherSourceIsAnotherEvent(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 2)
	entered, release := make(chan string, 4), make(chan struct{})
	var mu sync.Mutex
	calls := map[string]int{}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		mu.Lock()
		calls[in.Source()]++
		mu.Unlock()
		entered <- in.Source()
		<-release
		return outputs("out")(in)
	}})
	s := waitStream(t, b, "in")
	a, other := request("x", ""), request("x", "")
	other.Source = "elsewhere"
	s.In <- a
	if src := <-entered; src != "test" {
		t.Fatalf("first call for %s", src)
	}
	s.In <- other
	select {
	case src := <-entered:
		t.Fatalf("%s ran beside the event with its id", src)
	case a := <-b.Acks:
		t.Fatalf("answered %+v while both were in flight", a)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case src := <-entered:
		if src != "elsewhere" {
			t.Fatalf("second call for %s", src)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the event from the other source never ran")
	}
	if ack := waitAck(t, b); ack.ID != "x" || ack.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", ack)
	}
	select {
	case ack := <-b.Acks:
		t.Fatalf("a second answer for x (%+v) would be the first event's, which daprd no longer awaits", ack)
	case <-time.After(100 * time.Millisecond):
	}
	s.In <- request("x", "") // the first, redelivered after the processing timeout
	if ack := waitAck(t, b); ack.ID != "x" || ack.Status != dispatch.AckSuccess {
		t.Fatalf("redelivery ack %+v", ack)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls["test"] != 1 || calls["elsewhere"] != 1 {
		t.Fatalf("calls %v, want one per source", calls)
	}
	outs := pub.On("out")
	if n := len(outs); n != 2 {
		t.Fatalf("%d outputs, want 2", n)
	}
	// Downstream, source+id is the identity: the two outputs must differ
	// in it, or a worker on "out" would run only one of them.
	if a, b := outs[0].Source()+" "+outs[0].ID(), outs[1].Source()+" "+outs[1].ID(); a == b {
		t.Fatalf("both outputs are %q: a downstream worker would take the second for the first", a)
	}
}

// gatedPub holds every publish to a topic until open is closed.
type gatedPub struct {
	*publishtest.Recorder
	topic string
	open  chan struct{}
}

func (g *gatedPub) Publish(ctx context.Context, topic string, e *event.Event) error {
	if topic == g.topic {
		<-g.open
	}
	return g.Recorder.Publish(ctx, topic, e)
}

// Issue 30, item 4: events without an id are never taken for one another:
// each is dead-lettered (undecodable) on its own.
func TestEventsWithoutIDAreNotCollapsed(t *testing.T) {
	b, rec := dispatchtest.NewBroker(), &publishtest.Recorder{}
	pub := &gatedPub{Recorder: rec, topic: "in-dead", open: make(chan struct{})}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: outputs("out")})
	s := waitStream(t, b, "in")
	for _, data := range []string{"one", "two"} {
		s.In <- &runtimev1.TopicEventRequest{Source: "test", Type: "t", SpecVersion: "1.0", Data: []byte(data)}
	}
	time.Sleep(100 * time.Millisecond) // both in flight
	close(pub.open)
	for range 2 {
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	dead := rec.On("in-dead")
	if len(dead) != 2 || string(dead[0].Data()) == string(dead[1].Data()) {
		t.Fatalf("%d dead letters, want one per event", len(dead))
	}
}

// blocking is an instance that records the ids it ran and blocks on the
// ids in hold until release is closed.
type blocking struct {
	mu      sync.Mutex
	ran     []string
	hold    map[string]bool
	entered chan string
	release chan struct{}
}

func newBlocking(hold ...string) *blocking {
	b := &blocking{hold: map[string]bool{}, entered: make(chan string, 16), release: make(chan struct{})}
	for _, id := range hold {
		b.hold[id] = true
	}
	return b
}

func (b *blocking) instance() *dispatchtest.FuncInstance {
	return &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		b.entered <- in.ID()
		if b.hold[in.ID()] {
			<-b.release
		}
		b.mu.Lock()
		b.ran = append(b.ran, in.ID())
		b.mu.Unlock()
		return outputs("out")(in)
	}}
}

func (b *blocking) did(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Contains(b.ran, id)
}

// Issue 30, item 1: re-attaching a worker after a policy change replaces it
// in one step: a message that arrives while the old one still finishes its
// call is not acked SUCCESS unless the worker (the new one) processed it.
func TestReattachNeverAcksWithoutTheWorker(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	w1, w1b, w2 := newBlocking("m1"), newBlocking(), newBlocking()
	d.Attach(dispatch.Worker{ID: "w1", Topic: "in"}, w1.instance())
	d.Attach(dispatch.Worker{ID: "w2", Topic: "in"}, w2.instance())
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	<-w1.entered // w1 holds m1
	attached := make(chan struct{})
	go func() {
		defer close(attached)
		d.Attach(dispatch.Worker{ID: "w1", Topic: "in", MaxAttempts: 5}, w1b.instance()) // a policy change
	}()
	time.Sleep(50 * time.Millisecond) // the old w1 is being stopped: it waits for m1
	s.In <- request("m2", "")
	ack := waitAck(t, b)
	if ack.ID != "m2" {
		t.Fatalf("ack %+v", ack)
	}
	if ack.Status == dispatch.AckSuccess && !w1b.did("m2") && !w1.did("m2") {
		t.Fatal("m2 acked SUCCESS although worker w1, running in the catalog, never had it")
	}
	close(w1.release)
	<-attached
	if a := waitAck(t, b); a.ID != "m1" {
		t.Fatalf("ack %+v", a)
	}
}

// Issue 30, item 1: a worker parked on this node (fenced, or its new code
// cannot load here) while the catalog still runs it: messages of its topic
// are given back here, not acked because the other workers are done.
func TestParkedWorkerKeepsItsMessagesUnacked(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	w1, w2 := newBlocking("m1"), newBlocking()
	d.Attach(dispatch.Worker{ID: "w1", Topic: "in"}, w1.instance())
	d.Attach(dispatch.Worker{ID: "w2", Topic: "in"}, w2.instance())
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	<-w1.entered
	s.In <- request("m2", "") // queued behind m1 for w1
	waitCond(t, func() bool { return w2.did("m2") }, func() string { return "w2 never ran m2" })
	parked := make(chan struct{})
	go func() {
		defer close(parked)
		d.Park(context.Background(), dispatch.Worker{ID: "w1", Topic: "in"})
	}()
	time.Sleep(50 * time.Millisecond)
	s.In <- request("m3", "") // arrives while w1 is parked
	close(w1.release)
	<-parked
	got := map[string]dispatch.Ack{}
	for range 3 {
		a := waitAck(t, b)
		got[a.ID] = a.Status
	}
	if got["m1"] != dispatch.AckSuccess || got["m2"] != dispatch.AckRetry || got["m3"] != dispatch.AckRetry {
		t.Fatalf("acks %v: m1 SUCCESS (w1 finished it), m2 and m3 RETRY (w1 never had them)", got)
	}
}

// Issue 30, item 8: stopping a grouped worker returns within about one
// message's time: its messages waiting for the group's slot give up and are
// given back (RETRY), none starts after the stop.
func TestStopOfGroupedWorkerDoesNotRunTheWaiters(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 4)
	var mu sync.Mutex
	var ran []string
	entered := make(chan struct{}, 8)
	d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		entered <- struct{}{}
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		ran = append(ran, in.ID())
		mu.Unlock()
		return outputs("out")(in)
	}})
	s := waitStream(t, b, "in")
	for i := range 4 {
		s.In <- request(fmt.Sprintf("m%d", i), "")
	}
	<-entered
	time.Sleep(50 * time.Millisecond)   // the other three wait for the group
	d.Detach(context.Background(), "w") // waits for the one running, not the waiters: ran stays at one
	got := map[dispatch.Ack]int{}
	for range 4 {
		got[waitAck(t, b).Status]++
	}
	mu.Lock()
	defer mu.Unlock()
	// The topic's last worker left: every message is given back (RETRY)
	// for another node; the one that ran is recorded done there.
	if len(ran) != 1 || got[dispatch.AckRetry] != 4 {
		t.Fatalf("ran %v, acks %v: want one run, four RETRY", ran, got)
	}
}
