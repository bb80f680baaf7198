package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
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
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func request(id string, correlation string) *runtimev1.TopicEventRequest {
	req := &runtimev1.TopicEventRequest{Id: id, Source: "test", Type: "in", SpecVersion: "1.0",
		DataContentType: "application/json", Data: []byte(`{"n":1}`), Topic: "in", PubsubName: "pubsub"}
	if correlation != "" {
		req.Extensions, _ = structpb.NewStruct(map[string]any{"correlationid": correlation, "traceparent": "00-abc-def-01"})
	}
	return req
}

func outputs(types ...string) func(*event.Event) ([]event.Event, error) {
	return func(in *event.Event) ([]event.Event, error) {
		var out []event.Event
		for _, t := range types {
			e := event.New()
			e.SetType(t)
			if err := e.SetData(event.ApplicationJSON, map[string]string{"from": in.ID()}); err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		return out, nil
	}
}

func waitAck(t *testing.T, b *dispatchtest.Broker) dispatchtest.Acked {
	t.Helper()
	select {
	case a := <-b.Acks:
		return a
	case <-time.After(5 * time.Second):
		t.Fatal("no ack")
	}
	return dispatchtest.Acked{}
}

func waitStream(t *testing.T, b *dispatchtest.Broker, topic string) *dispatchtest.Stream {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if s := b.Stream(topic); s != nil {
			return s
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("no subscription")
	return nil
}

// oneWorker is a dispatcher with worker w1 on topic "in" running fn, its
// broker, its publisher and the stream w1 subscribed.
func oneWorker(t *testing.T, conc int, fn func(*event.Event) ([]event.Event, error)) (*dispatch.Dispatcher, *dispatchtest.Broker, *publishtest.Recorder, *dispatchtest.Stream) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, conc)
	d.Attach(dispatch.Worker{ID: "w1", Topic: "in"}, &dispatchtest.FuncInstance{Fn: fn})
	return d, b, pub, waitStream(t, b, "in")
}

func newTestDispatcher(t *testing.T, b *dispatchtest.Broker, pub *publishtest.Recorder, conc int) *dispatch.Dispatcher {
	return newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: conc})
}

// newTestDispatcherWith uses st for delivery records, group locks and dead
// letters (a store that can fail, or one shared by two "nodes").
func newTestDispatcherWith(t *testing.T, b dispatch.Subscriber, pub publish.Publisher, st state.Store, cfg dispatch.Config) *dispatch.Dispatcher {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return dispatch.New(ctx, quietLog(), testDeps(b, pub, st), cfg)
}

func testDeps(b dispatch.Subscriber, pub publish.Publisher, st state.Store) dispatch.Deps {
	return dispatch.Deps{Sub: b, Pub: pub, Events: lifecycleevents.NewEmitter(pub), Records: delivery.NewStore(st, time.Hour),
		Locks:       grouplock.New(st, grouplock.Config{RetryBase: time.Millisecond, MaxRetries: 3}),
		DeadLetters: deadletter.NewStore(st, time.Hour)}
}

func TestOutputsGoToTheirTypeWithCorrelationID(t *testing.T) {
	_, b, pub, s := oneWorker(t, 2, outputs("out.a", "out.b"))

	s.In <- request("m1", "corr-1")
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
	s.In <- request("m2", "")
	waitAck(t, b)
	if len(pub.All()) != 4 {
		t.Fatalf("published %d events", len(pub.All()))
	}
	for i, p := range pub.All() {
		if p.Topic != p.Event.Type() {
			t.Errorf("event %d published to %q, type %q", i, p.Topic, p.Event.Type())
		}
		if p.Event.ID() == "" || p.Event.Source() != "workmanager/workers/w1" || p.Event.SpecVersion() != "1.0" {
			t.Errorf("event %d defaults: %v", i, p.Event)
		}
		cid, ok := p.Event.Extensions()[dispatch.CorrelationExtension]
		if i < 2 && cid != "corr-1" {
			t.Errorf("event %d correlationid %v", i, cid)
		}
		if i >= 2 && ok {
			t.Errorf("event %d has correlationid %v though the input had none", i, cid)
		}
	}
}

func TestWorkerCannotForgeCorrelationID(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	d.Attach(dispatch.Worker{ID: "w1", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(*event.Event) ([]event.Event, error) {
		e := event.New()
		e.SetType("out")
		e.SetExtension(dispatch.CorrelationExtension, "forged")
		return []event.Event{e}, nil
	}})
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	waitAck(t, b)
	if _, ok := pub.All()[0].Event.Extensions()[dispatch.CorrelationExtension]; ok {
		t.Fatal("a correlation id appeared although the input had none")
	}
}

func TestFailureRetriesAndEmitsWorkerError(t *testing.T) {
	for name, err := range map[string]error{
		"worker_failed": fmt.Errorf("%w: ValueError: boom", engines.ErrWorkerFailed),
		"timeout":       fmt.Errorf("%w after 1s", engines.ErrTimeout),
	} {
		t.Run(name, func(t *testing.T) {
			b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
			d := newTestDispatcher(t, b, pub, 1)
			d.Attach(dispatch.Worker{ID: "w1", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: func(*event.Event) ([]event.Event, error) { return nil, err }})
			s := waitStream(t, b, "in")
			s.In <- request("m1", "")
			if a := waitAck(t, b); a.Status != dispatch.AckRetry {
				t.Fatalf("ack %+v, want RETRY", a)
			}
			if len(pub.All()) != 1 || pub.All()[0].Topic != lifecycleevents.Topic || pub.All()[0].Event.Type() != lifecycleevents.TypePrefix+"error" {
				t.Fatalf("published %v", pub.All())
			}
			var data lifecycleevents.Data
			if err := pub.All()[0].Event.DataAs(&data); err != nil || data.ErrorType != name || data.WorkerID != "w1" || data.Group != "g" ||
				data.Attempt != 1 || data.MaxAttempts != 3 || data.EventID != "m1" {
				t.Fatalf("error data %+v %v", data, err)
			}
		})
	}
}

// An output the broker refuses is not lost: the input is answered RETRY, so
// the broker redelivers it, and once publishing works again it is answered
// SUCCESS with its output published.
func TestRefusedOutputRetriesTheInput(t *testing.T) {
	_, b, pub, s := oneWorker(t, 1, outputs("out"))
	refused := errors.New("redis: connection pool timeout")
	pub.Fail(refused)
	s.In <- request("m1", "")
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want RETRY", a)
	}
	pub.Fail(nil)
	s.In <- request("m1", "") // the redelivery
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("redelivery ack %+v, want SUCCESS", a)
	}
	if len(pub.All()) != 1 || pub.All()[0].Topic != "out" || pub.All()[0].Event.ID() != "m1/w1/0/9f86d081" {
		t.Fatalf("published %+v, want the one output of m1", pub.All())
	}
}

// A failed ack is logged, not fatal: the broker redelivers that message, and
// the stream goes on with the next ones.
func TestFailedAckDoesNotStallTheStream(t *testing.T) {
	d, b, _, s := oneWorker(t, 1, outputs("out"))
	lost := errors.New("stream closed by daprd")
	b.FailAcks(lost)
	s.In <- request("m1", "")
	if a := waitAck(t, b); a.ID != "m1" {
		t.Fatalf("ack %+v", a)
	}
	b.FailAcks(nil)
	s.In <- request("m2", "")
	if a := waitAck(t, b); a.ID != "m2" || a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v, want m2 SUCCESS", a)
	}
	if st := d.Stats(); st.Processed != 2 {
		t.Fatalf("processed %d, want 2", st.Processed)
	}
}

func TestFanOutAcksOnceAfterAllWorkers(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	release := make(chan struct{})
	d.Attach(dispatch.Worker{ID: "slow", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		<-release
		return outputs("a")(in)
	}})
	d.Attach(dispatch.Worker{ID: "fast", Topic: "in"}, &dispatchtest.FuncInstance{Fn: outputs("b")})
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	select {
	case a := <-b.Acks:
		t.Fatalf("acked %+v before the slow worker finished", a)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
	if b.Subscriptions() != 1 {
		t.Fatalf("%d subscriptions for one topic", b.Subscriptions())
	}
}

func TestHotSwapDrainsOldInstance(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 4)
	entered, release := make(chan struct{}), make(chan struct{})
	old := &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		close(entered)
		<-release
		return outputs("old")(in)
	}}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, old)
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	<-entered
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: outputs("new")})
	s.In <- request("m2", "")
	if a := waitAck(t, b); a.ID != "m2" {
		t.Fatalf("first ack %+v, want m2 (served by the new code while m1 is in flight)", a)
	}
	if old.Closed() {
		t.Fatal("old instance closed while a call was in flight")
	}
	close(release)
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !old.Closed() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !old.Closed() {
		t.Fatal("old instance not closed after draining")
	}
}

// A detached worker's instance closes after Detach returned (its
// process's exit is not a stop's to wait for: no message runs in it any
// more), and DetachAll, a node's shutdown, waits until every close is done.
func TestDetachAllWaitsForTheClosesDetachDoesNotWaitFor(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	release := make(chan struct{})
	slow := &dispatchtest.FuncInstance{Fn: outputs("x"), OnClose: func() { <-release }}
	d.Attach(dispatch.Worker{ID: "slow", Topic: "in"}, slow)
	other := &dispatchtest.FuncInstance{Fn: outputs("x")}
	d.Attach(dispatch.Worker{ID: "other", Topic: "in2"}, other)
	waitStream(t, b, "in")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d.Detach(ctx, "slow") // returns while the instance's Close blocks
	if slow.Closed() {
		t.Fatal("the instance closed before its Close returned")
	}
	all := make(chan struct{})
	go func() { d.DetachAll(ctx); close(all) }()
	select {
	case <-all:
		t.Fatal("DetachAll returned while a detached instance was still closing")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatal("DetachAll did not return once the close was done")
	}
	if !slow.Closed() || !other.Closed() {
		t.Fatalf("after DetachAll: closed %v and %v, want both", slow.Closed(), other.Closed())
	}
}

// A background close that does not end (an engine waiting for a call it
// abandoned) is given up after its bound: the Close sees its context end,
// and DetachAll returns.
func TestABackgroundCloseIsBounded(t *testing.T) {
	dispatch.SetInstanceCloseBound(t, 100*time.Millisecond)
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	var closeCtx context.Context
	stuck := &dispatchtest.FuncInstance{Fn: outputs("x")}
	stuck.OnCtxClose = func(ctx context.Context) { closeCtx = ctx; <-ctx.Done() }
	d.Attach(dispatch.Worker{ID: "stuck", Topic: "in"}, stuck)
	waitStream(t, b, "in")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d.DetachAll(ctx)
	if ctx.Err() != nil {
		t.Fatal("DetachAll waited for the close past its bound")
	}
	if closeCtx == nil || closeCtx.Err() == nil {
		t.Fatal("the close's context did not end at the bound")
	}
}

func TestDetachClosesStreamAndInstance(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	inst := &dispatchtest.FuncInstance{Fn: outputs("x")}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, inst)
	s := waitStream(t, b, "in")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.Detach(ctx, "w")
	d.WaitClosed(ctx)
	if !inst.Closed() {
		t.Fatal("instance not closed")
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("stream not closed after the last worker left")
	}
	if st := d.Stats(); st.Workers != 0 || st.Topics != 0 {
		t.Fatalf("stats %+v", st)
	}
	d.Detach(ctx, "w") // idempotent
}

func TestReconnectsAfterStreamError(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 1)
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: outputs("x")})
	first := waitStream(t, b, "in")
	first.Close() // daprd went away
	deadline := time.Now().Add(5 * time.Second)
	for b.Subscriptions() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	second := b.Stream("in")
	if second == first || second == nil {
		t.Fatal("did not resubscribe")
	}
	second.In <- request("m1", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
}

func TestSubscriptionStateIsReported(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	var mu sync.Mutex
	subState := map[string]error{}
	seen := 0
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deps := testDeps(b, pub, state.NewMemoryStore())
	deps.Events = nil
	d := dispatch.New(ctx, quietLog(), deps, dispatch.Config{PubSub: "pubsub", MaxConcurrency: 1,
		ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond,
		OnSubscription: func(topic string, err error) {
			mu.Lock()
			defer mu.Unlock()
			subState[topic] = err
			seen++
		}})
	current := func() (error, bool) {
		mu.Lock()
		defer mu.Unlock()
		err, ok := subState["in"]
		return err, ok
	}
	waitUntil := func(what string, cond func(error, bool) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if cond(current()) {
				return
			}
			if time.Now().After(deadline) {
				err, ok := current()
				t.Fatalf("%s: state %v (reported %v)", what, err, ok)
			}
			time.Sleep(time.Millisecond)
		}
	}
	refused := errors.New("redis: connection pool timeout")
	b.Refuse(refused)
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: outputs("x")})
	waitUntil("refused subscription", func(err error, ok bool) bool { return errors.Is(err, refused) })
	b.Refuse(nil)
	waitUntil("subscription open", func(err error, ok bool) bool { return ok && err == nil })
	b.Stream("in").Close() // stream lost: reported, then reopened
	waitUntil("reopened", func(err error, ok bool) bool { return ok && err == nil && b.Subscriptions() >= 2 })
	b.Refuse(refused)
	d.Detach(context.Background(), "w")
	if err, ok := current(); !ok || err != nil {
		t.Fatalf("a detached topic must be reported as no longer failing: %v", err)
	}
}

func TestDecodeRejectsInvalidEvent(t *testing.T) {
	for name, req := range map[string]*runtimev1.TopicEventRequest{
		"no id":          {Source: "s", Type: "t", SpecVersion: "1.0"},
		"no type":        {Id: "1", Source: "s", SpecVersion: "1.0"},
		"no source":      {Id: "1", Type: "t", SpecVersion: "1.0"},
		"bad source":     {Id: "1", Source: "%zz", Type: "t", SpecVersion: "1.0"},
		"spec version 2": {Id: "1", Source: "s", Type: "t", SpecVersion: "2.0"},
	} {
		var e event.Event
		if err := dispatch.Decode(req, &e); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	var e event.Event
	if err := dispatch.Decode(request("ok", "c"), &e); err != nil || e.ID() != "ok" || e.Extensions()[dispatch.CorrelationExtension] != "c" {
		t.Fatalf("valid event: %v %v", err, e)
	}
}

// A topic's last worker leaving (a stop, or its topic moving to other
// nodes) keeps the stream open until the messages in flight are answered
// (its calls finish first):
// their acks reach the broker instead of failing on a closed stream and
// coming back after the processing timeout (chaos soak, issue 45).
func TestLastWorkerLeavingAnswersItsMessagesFirst(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcher(t, b, pub, 2)
	release := make(chan struct{})
	started := make(chan struct{}, 2)
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		started <- struct{}{}
		<-release
		return nil, nil
	}})
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	s.In <- request("m2", "")
	<-started
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	detached := make(chan struct{})
	go func() { d.Detach(ctx, "w"); close(detached) }()
	time.Sleep(20 * time.Millisecond) // the detach is waiting for the calls
	close(release)
	<-detached
	got := map[string]dispatch.Ack{}
	for len(got) < 2 {
		a := waitAck(t, b)
		got[a.ID] = a.Status
	}
	// RETRY or SUCCESS (the record says the worker is done: a node that
	// serves the topic skips it), but answered on the open stream.
	if b.LateAcks() != 0 {
		t.Fatalf("acks %v, %d sent on the closed stream", got, b.LateAcks())
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("stream not closed after its messages were answered")
	}
}
