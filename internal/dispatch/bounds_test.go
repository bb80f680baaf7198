package dispatch_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// manyOutputs is an ordinary worker: n outputs of type "out".
func manyOutputs(n int) func(*event.Event) ([]event.Event, error) {
	types := make([]string, n)
	for i := range types {
		types[i] = "out"
	}
	return outputs(types...)
}

// encodedSize is the size of e as JSON, the form it is published in.
func encodedSize(t *testing.T, e event.Event) int {
	t.Helper()
	b, err := e.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

// Issue 42, item 4: an input whose attributes are too large (a 4 MiB id,
// a long source, a 4 MiB correlation id, thousands of extensions) never
// reaches a worker, which would copy them into each of its outputs: it is
// dead-lettered at once as too_large, and the dead letter itself is
// small. The node's heap does not grow by the outputs it used to publish.
func TestOversizedInputAttributesAreTooLarge(t *testing.T) {
	huge := strings.Repeat("i", 4<<20)
	many := map[string]any{}
	for i := range 2000 {
		many[fmt.Sprintf("ext%d", i)] = "0123456789"
	}
	for name, mutate := range map[string]func(r *runtimev1.TopicEventRequest){
		"id":     func(r *runtimev1.TopicEventRequest) { r.Id = huge },
		"source": func(r *runtimev1.TopicEventRequest) { r.Source = "https://example.com/" + strings.Repeat("s", 64<<10) },
		"correlation": func(r *runtimev1.TopicEventRequest) {
			r.Extensions, _ = structpb.NewStruct(map[string]any{"correlationid": huge})
		},
		"tracestate": func(r *runtimev1.TopicEventRequest) {
			r.Extensions, _ = structpb.NewStruct(map[string]any{"tracestate": huge})
		},
		"extensions": func(r *runtimev1.TopicEventRequest) { r.Extensions, _ = structpb.NewStruct(many) },
	} {
		t.Run(name, func(t *testing.T) {
			b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
			d := newTestDispatcher(t, b, pub, 1)
			c := &counting{}
			d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
				c.instance("out").Fn(in)
				return manyOutputs(100)(in)
			}})
			s := waitStream(t, b, "in")
			big := request("big", "")
			mutate(big)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s.In <- big
			a := waitAck(t, b)
			runtime.ReadMemStats(&after)
			if a.Status != dispatch.AckSuccess {
				t.Fatalf("ack %v", a.Status)
			}
			if c.n(big.Id) != 0 || len(pub.On("out")) != 0 {
				t.Fatalf("the worker ran it (%d calls, %d outputs)", c.n(big.Id), len(pub.On("out")))
			}
			dead := pub.On("in-dead")
			if len(dead) != 1 || dead[0].Extensions()[dispatch.DeadLetterReasonExtension] != "too_large" {
				t.Fatalf("dead letters %v", dead)
			}
			if n := encodedSize(t, dead[0]); n > 16<<10 {
				t.Errorf("the dead letter is %d bytes", n)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Errorf("the event cost the node %d bytes", grew)
			}
			s.In <- request("fine", "corr")
			if a := waitAck(t, b); a.ID != "fine" || a.Status != dispatch.AckSuccess || c.n("fine") != 1 {
				t.Fatalf("the next event: ack %+v, %d calls", a, c.n("fine"))
			}
		})
	}
}

// Issue 42, item 4: output ids are derived from the input's id but stay
// short when it is long, are the same on a retry (deduplication relies on
// them) and differ between inputs.
func TestOutputIDsStayShort(t *testing.T) {
	_, b, pub, s := oneWorker(t, 1, manyOutputs(3))
	n := 0
	pub.FailWhen(func(topic string, _ *event.Event) error {
		if topic != "out" {
			return nil
		}
		if n++; n == 3 { // the first attempt's third output
			return errors.New("refused")
		}
		return nil
	})
	long1, long2 := strings.Repeat("a", 1000), strings.Repeat("a", 999)+"b"
	for i, id := range []string{long1, long1, long2} {
		s.In <- request(id, "")
		if a := waitAck(t, b); (a.Status == dispatch.AckSuccess) != (i > 0) {
			t.Fatalf("delivery %d: ack %v", i, a.Status)
		}
	}
	outs := pub.On("out")
	if len(outs) != 8 {
		t.Fatalf("%d outputs", len(outs))
	}
	first, retry, other := outs[:2], outs[2:5], outs[5:]
	for i, o := range outs {
		if len(o.ID()) > 128 {
			t.Errorf("output %d: id of %d bytes", i, len(o.ID()))
		}
	}
	for k := range 2 {
		if first[k].ID() != retry[k].ID() {
			t.Errorf("output %d of the retry: id %q, first %q", k, retry[k].ID(), first[k].ID())
		}
	}
	seen := map[string]bool{}
	for _, o := range append(retry, other...) {
		seen[o.ID()] = true
	}
	if len(seen) != 6 {
		t.Errorf("%d distinct ids among two inputs' 6 outputs", len(seen))
	}
}

// Issue 42, item 4: an output's attributes and extensions are bounded
// (engines.ReplyOutputOverhead): an output with thousands of extensions or
// one huge one is refused (output_limit) and nothing is published.
func TestOutputAttributesAreBounded(t *testing.T) {
	for name, fill := range map[string]func(e *event.Event){
		"many extensions": func(e *event.Event) {
			for i := range 5000 {
				e.SetExtension(fmt.Sprintf("x%d", i), "v")
			}
		},
		"one large extension": func(e *event.Event) { e.SetExtension("big", strings.Repeat("v", 1<<20)) },
		"large subject":       func(e *event.Event) { e.SetSubject(strings.Repeat("s", 1<<20)) },
	} {
		t.Run(name, func(t *testing.T) {
			b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
			d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 1})
			d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(*event.Event) ([]event.Event, error) {
				ok, bad := event.New(), event.New()
				ok.SetType("out")
				bad.SetType("out")
				fill(&bad)
				return []event.Event{ok, bad}, nil
			}})
			s := waitStream(t, b, "in")
			s.In <- request("m", "")
			waitAck(t, b)
			if n := len(pub.On("out")); n != 0 {
				t.Fatalf("%d outputs published", n)
			}
			dead := pub.On("in-dead")
			if len(dead) != 1 || dead[0].Extensions()[dispatch.DeadLetterReasonExtension] != "output_limit" {
				t.Fatalf("dead letters %v", dead)
			}
			if msg := fmt.Sprint(dead[0].Extensions()[dispatch.DeadLetterErrorExtension]); !strings.Contains(msg, "output 1") ||
				!strings.Contains(msg, fmt.Sprint(engines.ReplyOutputOverhead)) {
				t.Errorf("error %q", msg)
			}
		})
	}
}
