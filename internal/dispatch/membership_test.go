package dispatch_test

import (
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// Issue 33 item 5: a node that is not a cluster member (Config.Serving
// false: a stop may have been announced without it) serves no message: it
// is given back (RETRY) without calling the worker, and served once the
// node serves again. A call that was running when the node stopped serving
// publishes nothing and is given back too.
func TestNoMessageServedWhileNotServing(t *testing.T) {
	var serving atomic.Bool
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1,
		Serving: serving.Load})
	c := &counting{}
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, c.instance("out"))
	s := waitStream(t, b, "in")

	s.In <- request("m1", "")
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckRetry {
		t.Fatalf("not serving: got %+v, want m1 RETRY", a)
	}
	if c.n("m1") != 0 || len(pub.On("out")) != 0 {
		t.Fatalf("not serving, yet the worker ran (%d calls, %d outputs)", c.n("m1"), len(pub.On("out")))
	}

	serving.Store(true)
	s.In <- request("m1", "")
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckSuccess {
		t.Fatalf("serving again: got %+v, want m1 SUCCESS", a)
	}
	if c.n("m1") != 1 || len(pub.On("out")) != 1 {
		t.Fatalf("serving again: %d calls, %d outputs, want 1 and 1", c.n("m1"), len(pub.On("out")))
	}
}

func TestCallRunningWhenServingEndsPublishesNothing(t *testing.T) {
	var serving atomic.Bool
	serving.Store(true)
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1,
		Serving: serving.Load})
	calls := 0
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		calls++
		serving.Store(false) // the node is paused past the TTL while the call runs
		out := event.New()
		out.SetType("out")
		return []event.Event{out}, nil
	}})
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	if a := waitAck(t, b); a.ID != "m1" || a.Status != dispatch.AckRetry {
		t.Fatalf("got %+v, want m1 RETRY", a)
	}
	if calls != 1 || len(pub.On("out")) != 0 {
		t.Fatalf("%d calls, %d outputs; want 1 call and no output", calls, len(pub.On("out")))
	}
}
