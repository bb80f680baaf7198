package dispatch_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// A worker whose queue stayed full for a whole QueueWait and has not moved
// since (a hung worker) gives the next messages back without waiting
// again: each wait holds one of daprd's concurrency slots, which the
// topic's other workers need. Once it moves, its messages run as before.
func TestAStalledQueueGivesBackWithoutWaiting(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	const wait = 2 * time.Second
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1",
		MaxConcurrency: 1, QueueDepth: 1, QueueWait: wait})
	s, _, release := fullQueue(t, d, b, dispatch.Worker{ID: "hung", Topic: "in"})

	givenBack := func(id string) time.Duration {
		t.Helper()
		began := time.Now()
		s.In <- request(id, "")
		if a := waitAck(t, b); a.ID != id || a.Status != dispatch.AckRetry {
			t.Fatalf("ack %+v, want %s given back", a, id)
		}
		return time.Since(began)
	}
	// The queue full: q3 waits QueueWait for room, in vain.
	if took := givenBack("q3"); took < wait {
		t.Fatalf("q3 given back after %s, before QueueWait (%s)", took, wait)
	}
	// Nothing taken since: q4 and q5 do not wait again.
	for _, id := range []string{"q4", "q5"} {
		if took := givenBack(id); took >= wait {
			t.Fatalf("%s given back after %s: it waited QueueWait again for a queue that has not moved", id, took)
		}
	}
	// The worker moves again: what was queued runs, and so does what comes next.
	close(release)
	done := map[string]bool{}
	for len(done) < 2 {
		a := waitAck(t, b)
		if a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v, want success", a)
		}
		done[a.ID] = true
	}
	if !done["q1"] || !done["q2"] {
		t.Fatalf("answered %v, want q1 and q2", done)
	}
	s.In <- request("q6", "")
	if a := waitAck(t, b); a.ID != "q6" || a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v, want q6 run", a)
	}
}

// A queue that moved during a wait that ended in vain (a slow worker: one
// job taken, its room taken by another waiting message) is not a stall:
// the next message still waits for room instead of being given back at
// once.
func TestAQueueThatMovedDuringTheWaitIsNotAStall(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	const wait = time.Second
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1",
		MaxConcurrency: 1, QueueDepth: 1, QueueWait: wait})
	s, entered, release := fullQueue(t, d, b, dispatch.Worker{ID: "slow", Topic: "in"})
	defer close(release)
	// m3 and m4 both wait for room; q1 finishes and q2 is taken, which
	// makes room for one of them.
	s.In <- request("m3", "")
	s.In <- request("m4", "")
	waitCond(t, func() bool { return d.Waiting("slow") == 2 },
		func() string { return fmt.Sprintf("%d offers wait for room, want 2", d.Waiting("slow")) })
	release <- struct{}{}
	if id := <-entered; id != "q2" {
		t.Fatalf("%s entered, want q2", id)
	}
	var loser string
	for loser == "" {
		a := waitAck(t, b)
		switch {
		case a.ID == "q1" && a.Status == dispatch.AckSuccess:
		case (a.ID == "m3" || a.ID == "m4") && a.Status == dispatch.AckRetry:
			loser = a.ID
		default:
			t.Fatalf("ack %+v, want q1 answered and one of m3, m4 given back", a)
		}
	}
	// The queue moved during the loser's wait: m5 waits for room again.
	began := time.Now()
	s.In <- request("m5", "")
	if a := waitAck(t, b); a.ID != "m5" || a.Status != dispatch.AckRetry {
		t.Fatalf("ack %+v, want m5 given back", a)
	}
	if took := time.Since(began); took < wait {
		t.Fatalf("m5 given back after %s without waiting QueueWait (%s): a queue that moved during %s's wait was taken for stalled", took, wait, loser)
	}
}

// fullQueue attaches w, whose calls block until release is closed, to d
// (configured with MaxConcurrency 1 and QueueDepth 1) and fills its queue:
// q1 running, q2 queued. entered receives each call's event id as it
// starts (q1's is read already). Its stream is s.
func fullQueue(t *testing.T, d *dispatch.Dispatcher, b *dispatchtest.Broker, w dispatch.Worker) (s *dispatchtest.Stream, entered chan string, release chan struct{}) {
	t.Helper()
	entered, release = make(chan string, 8), make(chan struct{})
	d.Attach(w, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		entered <- in.ID()
		<-release
		return nil, nil
	}})
	s = waitStream(t, b, w.Topic)
	s.In <- request("q1", "")
	if id := <-entered; id != "q1" {
		t.Fatalf("%s entered, want q1", id)
	}
	s.In <- request("q2", "")
	waitQueued(t, d, w.ID, 1)
	return s, entered, release
}
