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

// Issue 44 item 1: an event the crash journal names as in flight at the
// node's crashes (Config.Suspect) is dead-lettered for that worker as
// `crashed` without its engine being called; the other workers of the
// topic, and the worker's other events, run as usual.
func TestSuspectEventIsDeadLetteredCrashedWithoutRunning(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 3,
		Suspect: func(worker, source, id string) bool { return worker == "bad" && source == "test" && id == "boom" }})
	var badCalls atomic.Int32
	d.Attach(dispatch.Worker{ID: "bad", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(ev *event.Event) ([]event.Event, error) {
		badCalls.Add(1)
		return outputs("bad.out")(ev)
	}})
	other := &counting{}
	d.Attach(dispatch.Worker{ID: "other", Topic: "in"}, other.instance("other.out"))
	s := waitStream(t, b, "in")
	s.In <- request("boom", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v, want SUCCESS (dead-lettered for bad, done by other)", a)
	}
	if n := badCalls.Load(); n != 0 {
		t.Fatalf("the suspect event was run %d times in the worker that crashed on it", n)
	}
	dead := pub.On("in-dead")
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dead))
	}
	ext := dead[0].Extensions()
	if ext[dispatch.DeadLetterReasonExtension] != "crashed" || ext[dispatch.DeadLetterWorkerExtension] != "bad" {
		t.Fatalf("dead letter extensions %v; want reason crashed for worker bad", ext)
	}
	if other.n("boom") != 1 {
		t.Fatalf("the other worker ran it %d times, want 1", other.n("boom"))
	}
	s.In <- request("fine", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
	if badCalls.Load() != 1 || len(pub.On("in-dead")) != 1 {
		t.Fatalf("another event of the worker: %d calls, %d dead letters; want 1 call, no new dead letter", badCalls.Load(), len(pub.On("in-dead")))
	}
}
