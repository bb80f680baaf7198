package dispatch_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

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
