package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// counting counts calls per event id and fails the ids in fail.
type counting struct {
	mu    sync.Mutex
	calls map[string]int
	fail  map[string]bool
}

func (c *counting) instance(out string) *dispatchtest.FuncInstance {
	return &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		c.mu.Lock()
		if c.calls == nil {
			c.calls = map[string]int{}
		}
		c.calls[in.ID()]++
		bad := c.fail[in.ID()]
		c.mu.Unlock()
		if bad {
			return nil, fmt.Errorf("%w: ValueError: poison %s", engines.ErrWorkerFailed, in.ID())
		}
		return outputs(out)(in)
	}}
}

func (c *counting) n(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[id]
}

// A message one worker always fails is attempted exactly MaxAttempts times
// by it, then lands on <topic>-dead intact with the dead-letter extensions
// and is acked; the other worker on the topic ran it exactly once.
func TestPoisonMessageDeadLettersAfterMaxAttempts(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 2, MaxAttempts: 3})
	poison, good := &counting{fail: map[string]bool{"bad": true}}, &counting{}
	d.Attach(dispatch.Worker{ID: "poison", Topic: "in"}, poison.instance("p.out"))
	d.Attach(dispatch.Worker{ID: "good", Topic: "in"}, good.instance("g.out"))
	s := waitStream(t, b, "in")
	for i := 1; i <= 3; i++ {
		s.In <- request("bad", "corr")
		want := dispatch.AckRetry
		if i == 3 {
			want = dispatch.AckSuccess
		}
		if a := waitAck(t, b); a.ID != "bad" || a.Status != want {
			t.Fatalf("delivery %d: ack %+v, want %v", i, a, want)
		}
	}
	s.In <- request("bad", "corr") // a stray redelivery changes nothing
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack after dead letter %+v", a)
	}
	if poison.n("bad") != 3 || good.n("bad") != 1 {
		t.Fatalf("calls: poison %d (want 3), good %d (want 1)", poison.n("bad"), good.n("bad"))
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 {
		t.Fatalf("%d dead letters", len(dead))
	}
	ext := dead[0].Extensions()
	if dead[0].ID() != "bad" || dead[0].Source() != "test" || dead[0].Type() != "in" || string(dead[0].Data()) != `{"n":1}` ||
		ext["correlationid"] != "corr" || ext["traceparent"] != "00-abc-def-01" || ext[dispatch.DeadLetterReasonExtension] != "worker_failed" ||
		ext[dispatch.DeadLetterWorkerExtension] != "poison" || fmt.Sprint(ext[dispatch.DeadLetterAttemptsExtension]) != "3" {
		t.Fatalf("dead letter %v", dead[0])
	}
	if e, _ := ext[dispatch.DeadLetterErrorExtension].(string); e == "" {
		t.Fatal("no error text on the dead letter")
	}
	entries, err := d.DeadLetters.List(context.Background(), "poison", deadletter.Filter{}, 10)
	if err != nil || len(entries) != 1 || entries[0].EventID != "bad" || entries[0].Attempts != 3 {
		t.Fatalf("stored dead letters %+v %v", entries, err)
	}
	if n := len(pub.On("workmanager.lifecycle")); n != 3+1 { // one error per attempt, one dead_lettered
		t.Fatalf("%d lifecycle events, want 4", n)
	}
}

// A replayed dead letter runs only for the worker it names.
func TestReplayedEventRunsOnlyForItsWorker(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1})
	a, c := &counting{}, &counting{}
	d.Attach(dispatch.Worker{ID: "a", Topic: "in"}, a.instance("a.out"))
	d.Attach(dispatch.Worker{ID: "c", Topic: "in"}, c.instance("c.out"))
	s := waitStream(t, b, "in")
	req := request("r1", "")
	req.Extensions = nil
	req.Extensions, _ = structpb.NewStruct(map[string]any{deadletter.ReplayExtension: "a",
		deadletter.ReplaySignatureExtension: signReplay(t, d, "r1", "a", "in")})
	s.In <- req
	if ack := waitAck(t, b); ack.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", ack)
	}
	if a.n("r1") != 1 || c.n("r1") != 0 {
		t.Fatalf("calls a=%d c=%d", a.n("r1"), c.n("r1"))
	}
}

// A replay for a worker that is not running (stopped or deleted since the
// replay) goes back to the dead letters instead of bouncing forever.
func TestReplayForStoppedWorkerDeadLettersAgain(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	c := &counting{}
	d.Attach(dispatch.Worker{ID: "a", Topic: "in"}, c.instance("a.out"))
	s := waitStream(t, b, "in")
	req := request("r1", "")
	req.Extensions, _ = structpb.NewStruct(map[string]any{deadletter.ReplayExtension: "gone",
		deadletter.ReplaySignatureExtension: signReplay(t, d, "r1", "gone", "in")})
	s.In <- req
	if ack := waitAck(t, b); ack.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", ack)
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 || dead[0].Extensions()[dispatch.DeadLetterReasonExtension] != "not_running" || dead[0].Extensions()[dispatch.DeadLetterWorkerExtension] != "gone" {
		t.Fatalf("dead letters %v", dead)
	}
	if c.n("r1") != 0 {
		t.Fatal("another worker ran a replay that was not for it")
	}
	entries, err := d.DeadLetters.List(context.Background(), "gone", deadletter.Filter{}, 10)
	if err != nil || len(entries) != 1 {
		t.Fatalf("stored again: %+v %v", entries, err)
	}
}

// A redelivery of a message every worker finished runs nobody again.
func TestRedeliveryOfDoneMessageRunsNobody(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	c := &counting{}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, c.instance("out"))
	s := waitStream(t, b, "in")
	for range 3 {
		s.In <- request("m", "")
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	if c.n("m") != 1 || len(pub.On("out")) != 1 {
		t.Fatalf("ran %d times, %d outputs", c.n("m"), len(pub.On("out")))
	}
}

// A panic in an engine is a failed attempt (error_type panic) and the
// dispatcher keeps serving.
func TestPanicIsAFailedAttempt(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 1})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		if in.ID() == "boom" {
			panic("engine bug")
		}
		return outputs("out")(in)
	}})
	s := waitStream(t, b, "in")
	s.In <- request("boom", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess { // one attempt allowed: dead-lettered at once
		t.Fatalf("ack %+v", a)
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 || dead[0].Extensions()[dispatch.DeadLetterReasonExtension] != "panic" {
		t.Fatalf("dead letters %v", dead)
	}
	s.In <- request("ok", "")
	if a := waitAck(t, b); a.ID != "ok" || a.Status != dispatch.AckSuccess {
		t.Fatalf("after the panic: ack %+v", a)
	}
	if st := d.Stats(); st.Panics != 1 {
		t.Fatalf("panics %d", st.Panics)
	}
}

// Undecodable and oversized events go to <topic>-dead at once, with their
// bytes, and never reach a worker.
func TestUndecodableAndOversizedEventsDeadLetterAtOnce(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxEventBytes: 1024})
	c := &counting{}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, c.instance("out"))
	s := waitStream(t, b, "in")
	s.In <- &runtimev1.TopicEventRequest{Id: "bad", Type: "t", SpecVersion: "1.0", Data: []byte("\x00raw")}
	big := request("big", "")
	big.Data = make([]byte, 2048)
	s.In <- big
	s.In <- request("fine", "")
	got := map[string]dispatch.Ack{}
	for range 3 {
		a := waitAck(t, b)
		got[a.ID] = a.Status
	}
	if got["bad"] != dispatch.AckSuccess || got["big"] != dispatch.AckSuccess || got["fine"] != dispatch.AckSuccess {
		t.Fatalf("acks %v", got)
	}
	reasons := map[string]string{}
	for _, e := range pub.On("in-dead") {
		reasons[e.ID()] = fmt.Sprint(e.Extensions()[dispatch.DeadLetterReasonExtension])
		if e.ID() == "bad" && string(e.Data()) != "\x00raw" {
			t.Errorf("raw bytes not kept: %q", e.Data())
		}
	}
	if reasons["bad"] != "undecodable" || reasons["big"] != "too_large" || len(reasons) != 2 {
		t.Fatalf("dead letters %v", reasons)
	}
	if c.n("fine") != 1 || c.n("bad")+c.n("big") != 0 {
		t.Fatalf("calls %v", c.calls)
	}
}

// A worker whose queue is full does not hold up the others: they process
// the message and it comes back later for the slow one only.
func TestSlowWorkerDoesNotHoldUpOthers(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, QueueDepth: 1})
	entered, release := make(chan struct{}, 5), make(chan struct{})
	d.Attach(dispatch.Worker{ID: "slow", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		entered <- struct{}{}
		<-release
		return outputs("slow.out")(in)
	}})
	fast := &counting{}
	d.Attach(dispatch.Worker{ID: "fast", Topic: "in"}, fast.instance("fast.out"))
	s := waitStream(t, b, "in")
	s.In <- request("m0", "")
	<-entered
	// One at a time, each after fast ran the one before (m0 included), so
	// that fast's own queue (depth 1) never fills: a busy machine can leave
	// m0 in fast's queue when m1 arrives, and m1 would then be given back
	// for fast too.
	waitFast := func(id string) {
		deadline := time.Now().Add(5 * time.Second)
		for fast.n(id) == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	waitFast("m0")
	for i := 1; i < 5; i++ {
		id := "m" + strconv.Itoa(i)
		s.In <- request(id, "")
		waitFast(id)
	}
	// slow holds m0 running and m1 queued; m2..m4 find its queue full.
	retried := map[string]bool{}
	for range 3 {
		a := waitAck(t, b)
		if a.Status != dispatch.AckRetry {
			t.Fatalf("ack %+v, want RETRY while slow is busy", a)
		}
		retried[a.ID] = true
	}
	if len(retried) != 3 || retried["m0"] || retried["m1"] {
		t.Fatalf("retried %v, want m2..m4 (m1 is queued)", retried)
	}
	close(release)
	for range 2 {
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	for i := range 5 {
		if fast.n("m"+strconv.Itoa(i)) != 1 {
			t.Fatalf("fast ran m%d %d times", i, fast.n("m"+strconv.Itoa(i)))
		}
	}
	var again string
	for id := range retried {
		again = id
	}
	s.In <- request(again, "") // the redelivery: only slow runs it
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess || fast.n(again) != 1 {
		t.Fatalf("redelivery ack %+v, fast ran %s %d times", a, again, fast.n(again))
	}
}

// A delivery of an event that is still in flight is answered together with
// it; the event runs once.
func TestDuplicateDeliveryInFlightRunsOnce(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 2)
	entered, release := make(chan struct{}, 2), make(chan struct{})
	var calls atomic.Int32
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		calls.Add(1)
		entered <- struct{}{}
		<-release
		return outputs("out")(in)
	}})
	s := waitStream(t, b, "in")
	s.In <- request("m", "")
	<-entered
	s.In <- request("m", "")
	deadline := time.Now().Add(5 * time.Second)
	for d.Stats().Duplicates == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	for range 2 {
		if a := waitAck(t, b); a.ID != "m" || a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("ran %d times", calls.Load())
	}
}

// A worker the catalog runs but this node cannot keeps the message
// unacknowledged (another node runs it), then dead-letters it as
// not_runnable after its attempts and the grace period.
func TestUnrunnableWorkerKeepsMessagePending(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 2})
	c := &counting{}
	d.Attach(dispatch.Worker{ID: "here", Topic: "in"}, c.instance("out"))
	d.SetUnrunnable(dispatch.Worker{ID: "elsewhere", Topic: "in"})
	s := waitStream(t, b, "in")
	s.In <- request("m", "")
	if a := waitAck(t, b); a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want RETRY: worker elsewhere has not seen it", a)
	}
	s.In <- request("m", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v, want SUCCESS after not_runnable dead letter", a)
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 || dead[0].Extensions()[dispatch.DeadLetterReasonExtension] != "not_runnable" || dead[0].Extensions()[dispatch.DeadLetterWorkerExtension] != "elsewhere" {
		t.Fatalf("dead letters %v", dead)
	}
	if c.n("m") != 1 {
		t.Fatalf("here ran m %d times", c.n("m"))
	}
	d.ClearUnrunnable("elsewhere")
	s.In <- request("m2", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v after ClearUnrunnable", a)
	}
}

// Drain lets the message in flight finish and be acked SUCCESS, and gives
// any message received meanwhile back at once.
func TestDrainFinishesInFlightAndGivesBackNew(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		entered <- struct{}{}
		<-release
		return outputs("out")(in)
	}})
	s := waitStream(t, b, "in")
	s.In <- request("inflight", "")
	<-entered
	drained := make(chan bool)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		drained <- d.Drain(ctx)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !d.Draining() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	s.In <- request("late", "")
	if a := waitAck(t, b); a.ID != "late" || a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want late given back", a)
	}
	close(release)
	if a := waitAck(t, b); a.ID != "inflight" || a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
	if !<-drained {
		t.Fatal("Drain reported unfinished messages")
	}
}

// Two workers of one group never run at the same time; each sees the
// fencing token on its input and carries it on its outputs, and tokens grow.
func TestGroupWorkersAreMutuallyExclusive(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 4, QueueDepth: 64})
	var inside, overlaps atomic.Int32
	var tokenMu sync.Mutex
	tokens := map[string]bool{}
	body := func(in *event.Event) ([]event.Event, error) {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(100 * time.Microsecond)
		inside.Add(-1)
		tok, _ := in.Extensions()[dispatch.FencingExtension].(string)
		tokenMu.Lock()
		tokens[tok] = true
		tokenMu.Unlock()
		return outputs("out")(in)
	}
	d.Attach(dispatch.Worker{ID: "a", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: body})
	d.Attach(dispatch.Worker{ID: "b", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: body})
	s := waitStream(t, b, "in")
	const n = 40
	for i := range n {
		s.In <- request("m"+strconv.Itoa(i), "")
	}
	for range n {
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping executions in one group", overlaps.Load())
	}
	if len(tokens) != 2*n || tokens[""] {
		t.Fatalf("%d distinct tokens for %d executions (%v)", len(tokens), 2*n, tokens[""])
	}
	for _, o := range pub.On("out") {
		if o.Extensions()[dispatch.FencingExtension] == nil {
			t.Fatalf("output %s without fencing token", o.ID())
		}
	}
}

// An output produced under a lock that another holder took over meanwhile
// is refused (a stale fencing token) and counted; the attempt fails.
func TestStaleHolderOutputIsRefused(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1})
	entered, release := make(chan struct{}), make(chan struct{})
	var fence *engines.Fence // what a gateway call of the worker would check
	d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{
		Ctx: func(ctx context.Context) { fence = engines.FenceFrom(ctx) },
		Fn: func(in *event.Event) ([]event.Event, error) {
			close(entered)
			<-release
			return outputs("out")(in)
		}})
	s := waitStream(t, b, "in")
	s.In <- request("m", "")
	<-entered
	// Another node steals the lock (as after the max age): a newer token.
	it, err := st.Get(context.Background(), grouplock.Key("g"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(context.Background(), grouplock.Key("g"), []byte(`{"token":99,"holder":"other/x","held":true,"acquired_ms":1}`), state.PutOptions{ETag: it.ETag}); err != nil {
		t.Fatal(err)
	}
	if fence == nil || fence.Group != "g" || fence.Token != 1 {
		t.Fatalf("the call's fence %+v, want group g token 1", fence)
	}
	if err := fence.Check(context.Background()); !errors.Is(err, grouplock.ErrStale) {
		t.Fatalf("fence check after the theft: %v, want ErrStale (a gateway call is refused)", err)
	}
	close(release)
	if a := waitAck(t, b); a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want RETRY", a)
	}
	if len(pub.On("out")) != 0 || d.Stats().StaleRefused != 1 {
		t.Fatalf("outputs %d, stale refused %d", len(pub.On("out")), d.Stats().StaleRefused)
	}
}

// A state store that fails makes the message come back, never lost or
// half-recorded.
func TestStateStoreFailureGivesMessageBack(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	st := &failingStore{Store: state.NewMemoryStore()}
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1})
	c := &counting{}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, c.instance("out"))
	s := waitStream(t, b, "in")
	st.fail.Store(true)
	s.In <- request("m", "")
	if a := waitAck(t, b); a.Status != dispatch.AckRetry || c.n("m") != 0 {
		t.Fatalf("ack %+v, calls %d", a, c.n("m"))
	}
	st.fail.Store(false)
	s.In <- request("m", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess || c.n("m") != 1 {
		t.Fatalf("ack %+v, calls %d", a, c.n("m"))
	}
}

type failingStore struct {
	state.Store
	fail atomic.Bool
	// putFailures: this many next writes fail as if daprd were away.
	putFailures atomic.Int32
}

func (f *failingStore) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	if f.putFailures.Add(-1) >= 0 {
		return errors.New("state store down")
	}
	return f.Store.Put(ctx, key, value, opts)
}

// The delivery record of a message whose worker has run is saved when the
// state store comes back within RecordSaveRetry (a daprd restart), so a
// redelivery finds it done and never runs the worker again; an outage
// longer than that gives the message back (at-least-once).
func TestRecordSaveOutlastsAShortStateOutage(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	st := &failingStore{Store: state.NewMemoryStore()}
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, RecordSaveRetry: 2 * time.Second})
	c := &counting{}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, c.instance("out"))
	s := waitStream(t, b, "in")
	st.putFailures.Store(3) // about 350 ms of backoff
	s.In <- request("m", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess || c.n("m") != 1 {
		t.Fatalf("ack %+v, calls %d: want SUCCESS after the store came back, one call", a, c.n("m"))
	}
	s.In <- request("m", "") // the broker's redelivery (the ack was lost with daprd)
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess || c.n("m") != 1 {
		t.Fatalf("redelivery: ack %+v, calls %d: want SUCCESS from the record, still one call", a, c.n("m"))
	}
	st.putFailures.Store(1000) // longer than RecordSaveRetry
	s.In <- request("m2", "")
	if a := waitAck(t, b); a.Status != dispatch.AckRetry || c.n("m2") != 1 {
		t.Fatalf("long outage: ack %+v, calls %d: want RETRY", a, c.n("m2"))
	}
}

func (f *failingStore) Get(ctx context.Context, key string) (state.Item, error) {
	if f.fail.Load() {
		return state.Item{}, errors.New("state store down")
	}
	return f.Store.Get(ctx, key)
}

// Detaching a worker with a full queue of slow calls waits for the call in
// progress only: queued messages are given back, never started (issue 9:
// a stop must not wait for every queued call). Repeated because the serve
// loop's choice between its queue and the stop is random when both are
// ready.
func TestDetachDoesNotRunTheQueue(t *testing.T) {
	for round := range 10 {
		b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
		d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, QueueDepth: 8})
		var calls atomic.Int32
		entered, release := make(chan struct{}, 8), make(chan struct{})
		d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
			calls.Add(1)
			entered <- struct{}{}
			<-release
			return nil, nil
		}})
		s := waitStream(t, b, "in")
		for i := range 5 {
			s.In <- request(fmt.Sprintf("m%d", i), "")
		}
		<-entered
		for d.Queued("w") < 4 {
			time.Sleep(time.Millisecond)
		}
		stopped := d.Stopped("w")
		detached := make(chan struct{})
		go func() { d.Detach(context.Background(), "w"); close(detached) }()
		<-stopped
		close(release)
		<-detached
		if n := calls.Load(); n != 1 {
			t.Fatalf("round %d: %d calls ran, want only the one in progress at the stop", round, n)
		}
	}
}

// A dead letter is stored before it is published: whoever sees it on
// <topic>-dead can list it at once (worker dead letters and undecodable
// ones alike). A publish that fails leaves it stored and the message
// unacked; the redelivery publishes it, still one entry.
func TestDeadLetterIsListableWhenPublished(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 1, MaxEventBytes: 1024})
	var mu sync.Mutex
	listed := map[string]bool{}
	failOnce := true
	pub.FailWhen(func(topic string, e *event.Event) error {
		if topic != "in-dead" {
			return nil
		}
		owner := fmt.Sprint(e.Extensions()[dispatch.DeadLetterWorkerExtension])
		if owner == "<nil>" {
			owner = deadletter.TopicOwner("in")
		}
		entries, err := d.DeadLetters.List(context.Background(), owner, deadletter.Filter{}, 0)
		mu.Lock()
		defer mu.Unlock()
		for _, x := range entries {
			if x.EventID == e.ID() && err == nil {
				listed[e.ID()] = true
			}
		}
		if e.ID() == "bad" && failOnce {
			failOnce = false
			return errors.New("broker down")
		}
		return nil
	})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, (&counting{fail: map[string]bool{"bad": true}}).instance("out"))
	s := waitStream(t, b, "in")
	s.In <- request("bad", "")
	if a := waitAck(t, b); a.ID != "bad" || a.Status != dispatch.AckRetry {
		t.Fatalf("ack with the dead letter's publish failing: %+v", a)
	}
	s.In <- request("bad", "") // redelivered: attempts used up, published now
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack of the redelivery: %+v", a)
	}
	s.In <- &runtimev1.TopicEventRequest{Id: "raw", Type: "t", SpecVersion: "1.0", Data: []byte("\x00raw")}
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack of the undecodable event: %+v", a)
	}
	mu.Lock()
	defer mu.Unlock()
	if !listed["bad"] || !listed["raw"] {
		t.Fatalf("listable when published: %v", listed)
	}
	if n := len(pub.On("in-dead")); n != 2 {
		t.Fatalf("%d dead letters published, want 2", n)
	}
	if entries, err := d.DeadLetters.List(context.Background(), "w", deadletter.Filter{}, 0); err != nil || len(entries) != 1 {
		t.Fatalf("stored for w: %+v %v", entries, err)
	}
}

// waitCond waits until cond holds (5 s at most); what describes the state
// when it does not.
func waitCond(t *testing.T, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what())
		}
		time.Sleep(time.Millisecond)
	}
}

// publishN sends messages m0… to the worker's topic "in".
func publishN(t *testing.T, b *dispatchtest.Broker, n int) {
	t.Helper()
	s := waitStream(t, b, "in")
	for i := range n {
		s.In <- request("m"+strconv.Itoa(i), "")
	}
}

// batcherInstance is a FuncInstance that batches its calls (engines.Batcher).
type batcherInstance struct {
	dispatchtest.FuncInstance
	fill int
}

func (b *batcherInstance) CallsToFill() int { return b.fill }

// A worker whose Instance batches its calls gets as many of its messages at
// once as the Instance asks for (more than MaxConcurrency); any other
// worker gets MaxConcurrency.
func TestBatcherRaisesConcurrency(t *testing.T) {
	for name, c := range map[string]struct {
		fill, want int
	}{
		"batcher":         {fill: 6, want: 6},
		"batcher, less":   {fill: 1, want: 2},
		"batching is off": {fill: 0, want: 2},
		"not a batcher":   {fill: -1, want: 2},
	} {
		t.Run(name, func(t *testing.T) {
			b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
			d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 2, QueueDepth: 64})
			var inside, most atomic.Int32
			release := make(chan struct{})
			body := func(in *event.Event) ([]event.Event, error) {
				n := inside.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				<-release
				inside.Add(-1)
				return nil, nil
			}
			var inst engines.Instance = &dispatchtest.FuncInstance{Fn: body}
			if c.fill >= 0 {
				inst = &batcherInstance{FuncInstance: dispatchtest.FuncInstance{Fn: body}, fill: c.fill}
			}
			d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, inst)
			const n = 10
			publishN(t, b, n)
			// Every serving goroutine is inside once want messages are and
			// the others wait in the queue.
			waitCond(t, func() bool { return inside.Load() == int32(c.want) && d.Queued("w") == n-c.want }, func() string {
				return fmt.Sprintf("%d messages at once and %d queued, want %d and %d", inside.Load(), d.Queued("w"), c.want, n-c.want)
			})
			close(release)
			for range n {
				if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
					t.Fatalf("ack %+v", a)
				}
			}
			if m := most.Load(); m != int32(c.want) {
				t.Fatalf("at most %d messages at once, want %d", m, c.want)
			}
		})
	}
}

// Stopping a worker whose Instance batches gives back the calls still
// waiting inside the engine (as it gives back its queue) and waits only for
// the running one; a grouped worker keeps the default concurrency.
func TestStopGivesBackCallsWaitingInTheEngine(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 2, QueueDepth: 64})
	var entered, givenBack atomic.Int32
	release := make(chan struct{})
	var running sync.Once
	inst := &givingBack{fill: 6, process: func(ctx context.Context) error {
		entered.Add(1)
		first := false
		running.Do(func() { first = true })
		if first {
			<-release // the call the engine runs
			return nil
		}
		<-engines.GiveBack(ctx) // waiting for the process
		givenBack.Add(1)
		return fmt.Errorf("fake: %w", engines.ErrGivenBack)
	}}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, inst)
	const n = 6
	publishN(t, b, n)
	waitCond(t, func() bool { return entered.Load() == n }, func() string {
		return fmt.Sprintf("%d calls in the engine, want %d", entered.Load(), n)
	})
	detached := make(chan struct{})
	go func() {
		d.Detach(context.Background(), "w")
		close(detached)
	}()
	waitCond(t, func() bool { return givenBack.Load() == n-1 }, func() string {
		return fmt.Sprintf("%d calls given back, want %d", givenBack.Load(), n-1)
	})
	select {
	case <-detached:
		t.Fatal("Detach returned while a call was running")
	default:
	}
	close(release)
	<-detached
	// Every message goes back to the broker (the worker is gone from this
	// node); the record says which one w finished and that the others were
	// never attempted.
	for range n {
		if a := waitAck(t, b); a.Status != dispatch.AckRetry {
			t.Fatalf("ack %+v after the stop, want RETRY", a)
		}
	}
	done, untried := 0, 0
	recs := delivery.NewStore(st, time.Hour)
	for i := range n {
		rec, err := recs.Load(context.Background(), delivery.Key("test", "m"+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		switch s := rec.Get("w"); {
		case s.Terminal():
			done++
		case s.Attempts == 0:
			untried++
		}
	}
	if done != 1 || untried != n-1 {
		t.Fatalf("%d done and %d never attempted, want 1 and %d", done, untried, n-1)
	}
	if len(pub.On("in"+dispatch.DeadLetterSuffix)) != 0 {
		t.Fatal("a given-back call was dead-lettered")
	}
}

// givingBack is a Batcher whose process decides, per call, whether it runs
// or waits to be given back.
type givingBack struct {
	fill    int
	process func(ctx context.Context) error
}

func (g *givingBack) CallsToFill() int { return g.fill }

func (g *givingBack) Process(ctx context.Context, _ *event.Event) ([]event.Event, error) {
	return nil, g.process(ctx)
}

func (g *givingBack) Close(context.Context) error { return nil }

func TestGroupedBatcherKeepsDefaultConcurrency(t *testing.T) {
	if got := dispatch.Concurrency(2, dispatch.Worker{ID: "w", Group: "g"}, &batcherInstance{fill: 6}); got != 2 {
		t.Fatalf("grouped: %d, want 2", got)
	}
	if got := dispatch.Concurrency(2, dispatch.Worker{ID: "w"}, &batcherInstance{fill: 6}); got != 6 {
		t.Fatalf("ungrouped: %d, want 6", got)
	}
}

// The test hook UnsafeNoFencing (WM_TEST_UNSAFE_NO_FENCING, the chaos
// soak's "checker must be able to fail" demo) lets the stale holder's output
// of TestStaleHolderOutputIsRefused through, still carrying its old token.
func TestUnsafeNoFencingLetsStaleOutputThrough(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, UnsafeNoFencing: true})
	entered, release := make(chan struct{}), make(chan struct{})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{
		Fn: func(in *event.Event) ([]event.Event, error) {
			close(entered)
			<-release
			return outputs("out")(in)
		}})
	s := waitStream(t, b, "in")
	s.In <- request("m", "")
	<-entered
	it, err := st.Get(context.Background(), grouplock.Key("g"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put(context.Background(), grouplock.Key("g"), []byte(`{"token":99,"holder":"other/x","held":true,"acquired_ms":1}`), state.PutOptions{ETag: it.ETag}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v, want SUCCESS", a)
	}
	outs := pub.On("out")
	if len(outs) != 1 || outs[0].Extensions()[dispatch.FencingExtension] != "1" || d.Stats().StaleRefused != 0 {
		t.Fatalf("outputs %v, stale refused %d; want the stale output with token 1", outs, d.Stats().StaleRefused)
	}
}

// A dead letter whose save fails after the last attempt is made on the
// redelivery with that attempt's reason and error, not a generic
// worker_failed (soak finding 13: a timed-out input was dead-lettered as
// worker_failed); a second failed save keeps them too.
func TestDeadLetterMadeOnRedeliveryKeepsTheAttemptsReason(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 1})
	var failures atomic.Int32
	pub.FailWhen(func(topic string, _ *event.Event) error {
		if topic == "in-dead" && failures.Add(1) <= 2 {
			return errors.New("broker down")
		}
		return nil
	})
	slow := &dispatchtest.FuncInstance{Fn: func(*event.Event) ([]event.Event, error) {
		return nil, fmt.Errorf("%w: no answer within 1s", engines.ErrTimeout)
	}}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, slow)
	s := waitStream(t, b, "in")
	for i, want := range []dispatch.Ack{dispatch.AckRetry, dispatch.AckRetry, dispatch.AckSuccess} {
		s.In <- request("slow", "")
		if a := waitAck(t, b); a.ID != "slow" || a.Status != want {
			t.Fatalf("delivery %d: ack %+v, want %v", i+1, a, want)
		}
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 {
		t.Fatalf("%d dead letters", len(dead))
	}
	ext := dead[0].Extensions()
	if ext[dispatch.DeadLetterReasonExtension] != "timeout" {
		t.Fatalf("dead letter reason %v, want timeout", ext[dispatch.DeadLetterReasonExtension])
	}
	if e := fmt.Sprint(ext[dispatch.DeadLetterErrorExtension]); !strings.Contains(e, "no answer within 1s") || strings.Count(e, "attempts exhausted") != 1 {
		t.Fatalf("dead letter error %q: want the attempt's error once", e)
	}
	entries, err := d.DeadLetters.List(context.Background(), "w", deadletter.Filter{}, 0)
	if err != nil || len(entries) != 1 || entries[0].Reason != "timeout" {
		t.Fatalf("stored dead letters %+v %v", entries, err)
	}
}

// A held worker (no live node can run it) keeps its topic subscribed with
// no worker attached: its message is given back until its attempts, then
// dead-lettered not_runnable rather than left unseen in the broker; a Park
// (or a release) closes that stream, and an Attach takes it over without
// a new subscription.
func TestHeldWorkerKeepsItsTopicAndDeadLetters(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 2})
	ctx := context.Background()
	held := dispatch.Worker{ID: "gpu", Topic: "in"}
	d.Hold(ctx, held)
	s := waitStream(t, b, "in")
	s.In <- request("m", "")
	if a := waitAck(t, b); a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want RETRY before the attempts are used", a)
	}
	s.In <- request("m", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v, want SUCCESS after the not_runnable dead letter", a)
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 || dead[0].Extensions()[dispatch.DeadLetterReasonExtension] != "not_runnable" || dead[0].Extensions()[dispatch.DeadLetterWorkerExtension] != "gpu" {
		t.Fatalf("dead letters %v", dead)
	}

	// Parked (placement caught up: another node can run it): the stream
	// closes, the worker stays unrunnable.
	d.Park(ctx, held)
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the held topic's stream stayed open after Park")
	}
	if d.Held("gpu") || !d.Unrunnable("gpu") {
		t.Fatalf("held %v unrunnable %v after Park, want false true", d.Held("gpu"), d.Unrunnable("gpu"))
	}

	// Held again, then attached: the same stream serves the worker.
	subs := b.Subscriptions()
	d.Hold(ctx, held)
	for deadline := time.Now().Add(5 * time.Second); b.Subscriptions() == subs; {
		if time.Now().After(deadline) {
			t.Fatal("Hold did not subscribe again")
		}
		time.Sleep(time.Millisecond)
	}
	subs++
	s = waitStream(t, b, "in")
	c := &counting{}
	d.Attach(held, c.instance("out"))
	if b.Subscriptions() != subs {
		t.Fatalf("Attach subscribed again (%d subscriptions, want %d)", b.Subscriptions(), subs)
	}
	s.In <- request("m2", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess || c.n("m2") != 1 {
		t.Fatalf("ack %+v, runs %d: want the attached worker to serve the held topic's stream", a, c.n("m2"))
	}
	select {
	case <-s.Done():
		t.Fatal("the attach closed the stream it serves on")
	default:
	}
	if d.Held("gpu") {
		t.Fatal("still held after Attach")
	}
}

// A node paused between its lock check and its publish (the check passed,
// a later holder of the lock then published on the topic) has its outputs
// refused by the broker's fence: counted as stale, the attempt fails and
// the message comes back; a lock's outputs go out fenced by it.
func TestBrokerFenceRefusesAPausedHoldersOutputs(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Batching{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: outputs("out")})
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v, want SUCCESS", a)
	}
	if outs := pub.On("out"); len(outs) != 1 || outs[0].Extensions()[dispatch.FencingExtension] == nil {
		t.Fatalf("outputs %v, want one with a token", outs)
	}
	// Another node took the lock and published under a far higher token.
	pub.Mark("out", "g", 1<<40)
	s.In <- request("m2", "")
	if a := waitAck(t, b); a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want RETRY", a)
	}
	if n := len(pub.On("out")); n != 1 || d.Stats().StaleRefused != 1 {
		t.Fatalf("outputs %d, stale refused %d; want 1 and 1", n, d.Stats().StaleRefused)
	}
	// Another lock's outputs are not held back by g's mark.
	d.Attach(dispatch.Worker{ID: "w2", Topic: "in2", Group: "h"}, &dispatchtest.FuncInstance{Fn: outputs("out")})
	s2 := waitStream(t, b, "in2")
	s2.In <- request("m3", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v, want SUCCESS", a)
	}
}
