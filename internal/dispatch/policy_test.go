package dispatch_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// A call whose outputs break the worker's output policy or the node's
// output limits is a failed attempt that publishes none of its outputs
// (not even the allowed ones), ends in <topic>-dead with the rule named,
// and leaves the other workers on the topic alone.
func TestOutputPolicyAndLimits(t *testing.T) {
	for _, c := range []struct {
		name    string
		worker  dispatch.Worker
		outs    []string
		reason  string
		errText string
	}{
		{"forged lifecycle event", dispatch.Worker{ID: "w", Topic: "in"}, []string{"ok.out", "workmanager.lifecycle"}, "output_policy", `output 1: topic "workmanager.lifecycle" is reserved`},
		{"forged dead letter", dispatch.Worker{ID: "w", Topic: "in"}, []string{"other-dead"}, "output_policy", "is reserved"},
		{"own input topic", dispatch.Worker{ID: "w", Topic: "in"}, []string{"in"}, "output_policy", "own input topic"},
		{"outside the allowed list", dispatch.Worker{ID: "w", Topic: "in", AllowedOutputs: []string{"billing.*"}}, []string{"billing.a", "shipping.b"}, "output_policy", "not in allowed_output_topics"},
		{"too many outputs", dispatch.Worker{ID: "w", Topic: "in"}, []string{"a", "b", "c", "d"}, "output_limit", "4 outputs, more than MAX_OUTPUTS_PER_MESSAGE 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
			d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 1, MaxOutputs: 3})
			d.Attach(c.worker, &dispatchtest.FuncInstance{Fn: outputs(c.outs...)})
			other := &counting{}
			d.Attach(dispatch.Worker{ID: "other", Topic: "in"}, other.instance("other.out"))
			s := waitStream(t, b, "in")
			s.In <- request("m1", "")
			if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
				t.Fatalf("ack %+v", a)
			}
			for _, o := range c.outs {
				for _, ev := range pub.On(o) { // the node's own lifecycle events have other types
					if ev.Type() == o {
						t.Errorf("the worker's output was published to %s: %v", o, ev)
					}
				}
			}
			dead := pub.On("in-dead")
			if len(dead) != 1 {
				t.Fatalf("%d dead letters", len(dead))
			}
			ext := dead[0].Extensions()
			if ext[dispatch.DeadLetterReasonExtension] != c.reason || !strings.Contains(fmt.Sprint(ext[dispatch.DeadLetterErrorExtension]), c.errText) {
				t.Fatalf("dead letter reason %v error %v; want %s, %q", ext[dispatch.DeadLetterReasonExtension], ext[dispatch.DeadLetterErrorExtension], c.reason, c.errText)
			}
			if other.n("m1") != 1 || len(pub.On("other.out")) != 1 {
				t.Fatalf("the other worker: %d calls, %d outputs", other.n("m1"), len(pub.On("other.out")))
			}
		})
	}
}

// A worker whose allowed list names its input topic may publish to it.
func TestOutputPolicyAllowsListedInputTopic(t *testing.T) {
	b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
	d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 1})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in", AllowedOutputs: []string{"in"}}, &dispatchtest.FuncInstance{Fn: outputs("in")})
	s := waitStream(t, b, "in")
	s.In <- request("m1", "")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
	if len(pub.On("in")) != 1 || len(pub.On("in-dead")) != 0 {
		t.Fatalf("published %d to in, %d dead", len(pub.On("in")), len(pub.On("in-dead")))
	}
}

// Issue 44 item 3 (part): an output the policy or the limits refuse is
// refused again on every retry of the same input, so it is dead-lettered
// on its first failed attempt with its reason (attempts 1), not after
// MaxAttempts and their backoff.
func TestRefusedOutputsAreDeadLetteredAtOnce(t *testing.T) {
	noType := func(*event.Event) ([]event.Event, error) {
		o := event.New()
		o.SetID("o1")
		return []event.Event{o}, nil
	}
	engineRefused := func(*event.Event) ([]event.Event, error) {
		// What the engines return for outputs they cannot decode or the
		// runner cannot encode (wire.Error, native.WorkerError).
		return nil, fmt.Errorf("%w: %w: output 0: missing required attribute \"type\"", engines.ErrWorkerFailed, engines.ErrInvalidOutput)
	}
	for _, c := range []struct {
		name, reason string
		outs         []string
		fn           func(*event.Event) ([]event.Event, error)
	}{
		{"reserved topic", "output_policy", []string{"workmanager.lifecycle"}, nil},
		{"too many outputs", "output_limit", []string{"a", "b", "c", "d"}, nil},
		{"output without type", "output_invalid", nil, noType},
		{"outputs the engine cannot decode", "output_invalid", nil, engineRefused},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, pub, st := dispatchtest.NewBroker(), &publishtest.Recorder{}, state.NewMemoryStore()
			d := newTestDispatcherWith(t, b, pub, st, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 3, MaxOutputs: 3})
			var calls atomic.Int32
			d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(ev *event.Event) ([]event.Event, error) {
				calls.Add(1)
				if c.fn != nil {
					return c.fn(ev)
				}
				return outputs(c.outs...)(ev)
			}})
			s := waitStream(t, b, "in")
			s.In <- request("m1", "")
			if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
				t.Fatalf("ack %+v, want SUCCESS (dead-lettered at once)", a)
			}
			dead := pub.On("in-dead")
			if len(dead) != 1 || calls.Load() != 1 {
				t.Fatalf("%d dead letters after %d calls, want 1 after 1", len(dead), calls.Load())
			}
			ext := dead[0].Extensions()
			if ext[dispatch.DeadLetterReasonExtension] != c.reason || fmt.Sprint(ext[dispatch.DeadLetterAttemptsExtension]) != "1" {
				t.Fatalf("dead letter reason %v attempts %v; want %s after 1", ext[dispatch.DeadLetterReasonExtension], ext[dispatch.DeadLetterAttemptsExtension], c.reason)
			}
		})
	}
}
