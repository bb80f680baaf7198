package dispatch_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// An instance that lends its outputs (engines.Lender: the native engine's
// outputs point into the worker's response buffer until FreeResult) gets
// every loan back exactly once, and only after the outputs were published:
// the fake overwrites an output's data when its loan comes back, so an
// output published after that would carry '#'s. Ungrouped and grouped
// (published in token order, batched with other calls' outputs), an error
// answer's own response, and a publish that fails.
func TestLentOutputsAreReturnedOnceAfterPublishing(t *testing.T) {
	for name, tc := range map[string]struct {
		group  string
		answer bool
	}{
		"ungrouped":    {},
		"grouped":      {group: "g"},
		"error answer": {answer: true},
	} {
		t.Run(name, func(t *testing.T) {
			b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
			d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 4, QueueDepth: 64})
			fn := outputs("out.a", "out.b")
			if tc.answer {
				fn = func(in *event.Event) ([]event.Event, error) {
					outs, _ := outputs("out.a", "out.b")(in)
					return nil, &engines.ErrorAnswer{Message: "no stock", Outputs: outs}
				}
			}
			inst := &dispatchtest.LendingInstance{FuncInstance: dispatchtest.FuncInstance{Fn: fn}}
			d.Attach(dispatch.Worker{ID: "w1", Topic: "in", Group: tc.group}, inst)
			s := waitStream(t, b, "in")
			const n = 40
			sendAllSucceed(t, b, s, n)
			if lent, back := inst.Loans(); lent != n || back != n {
				t.Fatalf("%d loans, %d returned, want %d each", lent, back, n)
			}
			for _, topic := range []string{"out.a", "out.b"} {
				got := pub.On(topic)
				if len(got) != n {
					t.Fatalf("%d outputs on %s, want %d", len(got), topic, n)
				}
				for _, e := range got {
					var data map[string]string
					if err := json.Unmarshal(e.Data(), &data); err != nil || data["from"] == "" {
						t.Fatalf("output %s published with data %q (%v): read after its loan came back", e.ID(), e.Data(), err)
					}
				}
			}
		})
	}
	t.Run("publish fails", func(t *testing.T) {
		b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
		d := newTestDispatcher(t, b, pub, 1)
		inst := &dispatchtest.LendingInstance{FuncInstance: dispatchtest.FuncInstance{Fn: outputs("out")}}
		d.Attach(dispatch.Worker{ID: "w1", Topic: "in"}, inst)
		s := waitStream(t, b, "in")
		pub.Fail(errors.New("redis: connection pool timeout"))
		s.In <- request("m1", "")
		if a := waitAck(t, b); a.Status != dispatch.AckRetry {
			t.Fatalf("ack %+v, want RETRY", a)
		}
		if lent, back := inst.Loans(); lent != 1 || back != 1 {
			t.Fatalf("%d loans, %d returned, want 1 each", lent, back)
		}
	})
}
