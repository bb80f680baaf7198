package dispatch_test

import (
	"fmt"
	"testing"

	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
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
