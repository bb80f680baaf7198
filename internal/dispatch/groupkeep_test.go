package dispatch_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// Issue 47 item 1: a run of a group's messages on one node holds the lock
// once (GROUP_LOCK_KEEP_FOR) and the next call starts while the previous
// call's outputs go out. The promises stay: no two calls of the group
// overlap, every call has a token of its own, and the outputs, in the
// order they were published, carry growing tokens; the store saw a few
// acquisitions, not one per message.
func TestKeptGroupLockPipelinesInTokenOrder(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	st := state.NewMemoryStore()
	var acquired atomic.Int64
	locks := grouplock.New(st, grouplock.Config{RetryBase: time.Millisecond, MaxRetries: 3, Node: "n1", KeepFor: 64, TokenBlock: 64,
		OnEvent: func(ev grouplock.Event) {
			if ev.Kind == grouplock.EventAcquired {
				acquired.Add(1)
			}
		}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	d := dispatch.New(ctx, quietLog(), dispatch.Deps{Sub: b, Pub: pub, Events: lifecycleevents.NewEmitter(pub), Records: delivery.NewStore(st, time.Hour),
		Locks: locks, DeadLetters: deadletter.NewStore(st, time.Hour)},
		dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 8, QueueDepth: 256})
	var inside, overlaps atomic.Int32
	var mu sync.Mutex
	tokens := map[string]int{}
	body := func(in *event.Event) ([]event.Event, error) {
		if inside.Add(1) > 1 {
			overlaps.Add(1)
		}
		time.Sleep(50 * time.Microsecond)
		inside.Add(-1)
		tok, _ := in.Extensions()[dispatch.FencingExtension].(string)
		mu.Lock()
		tokens[tok]++
		mu.Unlock()
		return outputs("out")(in)
	}
	d.Attach(dispatch.Worker{ID: "a", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: body})
	d.Attach(dispatch.Worker{ID: "b", Topic: "in", Group: "g"}, &dispatchtest.FuncInstance{Fn: body})
	s := waitStream(t, b, "in")
	const n = 200
	for i := range n {
		s.In <- request("m"+strconv.Itoa(i), "")
	}
	for range n {
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlapping calls in one group", overlaps.Load())
	}
	if len(tokens) != 2*n || tokens[""] != 0 {
		t.Fatalf("%d distinct tokens for %d calls", len(tokens), 2*n)
	}
	last := int64(-1)
	outs := pub.On("out")
	for _, o := range outs {
		tok, err := strconv.ParseInt(o.Extensions()[dispatch.FencingExtension].(string), 10, 64)
		if err != nil || tok <= last {
			t.Fatalf("output %s: token %v after %d in publish order (%v)", o.ID(), o.Extensions()[dispatch.FencingExtension], last, err)
		}
		last = tok
	}
	if len(outs) != 2*n {
		t.Fatalf("%d outputs, want %d", len(outs), 2*n)
	}
	if a := acquired.Load(); a >= n {
		t.Fatalf("%d acquisitions for %d calls: the lock was not kept", a, 2*n)
	} else {
		t.Logf("%d calls, %d acquisitions", 2*n, a)
	}
}

// Issue 47 item 2: a keyed group (GroupKey "subject") serialises the
// executions of one key and runs different keys in parallel; every
// execution of a key has its own, growing token; an event without the key
// takes the whole group's lock.
func TestKeyedGroupSerialisesPerKey(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	st := state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 8, QueueDepth: 256})
	var mu sync.Mutex
	inside := map[string]int{} // key → executions inside now
	var overlapsSameKey, most, now int
	lastTok := map[string]int64{}
	body := func(in *event.Event) ([]event.Event, error) {
		key := in.Subject()
		mu.Lock()
		inside[key]++
		now++
		if inside[key] > 1 {
			overlapsSameKey++
		}
		most = max(most, now)
		tok, _ := strconv.ParseInt(in.Extensions()[dispatch.FencingExtension].(string), 10, 64)
		if tok <= lastTok[key] {
			t.Errorf("key %q: token %d after %d", key, tok, lastTok[key])
		}
		lastTok[key] = tok
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		inside[key]--
		now--
		mu.Unlock()
		return outputs("out")(in)
	}
	d.Attach(dispatch.Worker{ID: "a", Topic: "in", Group: "g", GroupKey: "subject"}, &dispatchtest.FuncInstance{Fn: body})
	s := waitStream(t, b, "in")
	const keys, each = 4, 10
	for i := range keys * each {
		req := request("m"+strconv.Itoa(i), "")
		if i%(keys+1) != keys { // some events without the key
			req.Extensions, _ = structpb.NewStruct(map[string]any{"subject": "order-" + strconv.Itoa(i%(keys+1))})
		}
		s.In <- req
	}
	for range keys * each {
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v", a)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if overlapsSameKey != 0 {
		t.Fatalf("%d overlapping executions of one key", overlapsSameKey)
	}
	if most < 2 {
		t.Fatalf("at most %d executions at once: different keys must run in parallel", most)
	}
	if _, ok := lastTok[""]; !ok {
		t.Fatal("no event without the key ran (under the group's lock)")
	}
}

// The optional context attributes Dapr passes among a TopicEventRequest's
// extensions (it has no fields for them) arrive as the attributes they
// are: before, subject, time and dataschema were dropped.
func TestDecodeKeepsSubjectTimeAndDataSchema(t *testing.T) {
	req := request("m1", "")
	req.Extensions, _ = structpb.NewStruct(map[string]any{"subject": "order-7", "time": "2026-11-28T10:00:00Z", "dataschema": "https://example.com/s", "partitionkey": "p1"})
	var ev event.Event
	if err := dispatch.Decode(req, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Subject() != "order-7" || ev.Time().IsZero() || ev.DataSchema() != "https://example.com/s" || ev.Extensions()["partitionkey"] != "p1" {
		t.Fatalf("decoded subject %q time %v dataschema %q extensions %v", ev.Subject(), ev.Time(), ev.DataSchema(), ev.Extensions())
	}
}
