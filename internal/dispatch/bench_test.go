package dispatch_test

import (
	"context"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"

	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// BenchmarkDispatchOneOutput measures the in-process hot path per message:
// decode the Dapr event into a CloudEvent, hand it to the worker goroutine,
// call a no-op engine that returns one output, fill the output's defaults and
// correlation id, "publish" it (counted, not sent) and ack. The transport is
// an in-memory stream; compare with BenchmarkBaselineChannelHandoff, the bare
// cost of one goroutine handoff and one ack on the same machine.
// (The engine's own cost, cloning its output, is included here.)
func BenchmarkDispatchOneOutput(b *testing.B) {
	out := event.New()
	out.SetType("out")
	benchmarkDispatch(b, func(*event.Event) ([]event.Event, error) { return []event.Event{out.Clone()}, nil })
}

// BenchmarkDispatchNoopEngine is the same path with an engine that returns
// no output: the dispatch overhead alone.
func BenchmarkDispatchNoopEngine(b *testing.B) {
	benchmarkDispatch(b, func(*event.Event) ([]event.Event, error) { return nil, nil })
}

func benchmarkDispatch(b *testing.B, fn func(*event.Event) ([]event.Event, error)) {
	broker := newFakeBrokerBench()
	pub := &publishtest.Discard{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	deps := testDeps(broker, pub, state.NewMemoryStore())
	deps.Events = nil
	d := dispatch.New(ctx, quietLog(), deps, dispatch.Config{PubSub: "pubsub", MaxConcurrency: 1})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: fn})
	s := waitStreamB(b, broker.Broker, "in")
	req := request("m1", "corr-1")
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s.In <- req
		<-broker.Acks
	}
	b.StopTimer()
	_ = pub
}

// BenchmarkDecode measures dispatch.Decode alone.
func BenchmarkDecode(b *testing.B) {
	req := request("m1", "corr-1")
	var e event.Event
	b.ReportAllocs()
	for range b.N {
		if err := dispatch.Decode(req, &e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBaselineChannelHandoff is the floor under BenchmarkDispatchNoopEngine:
// the same two channel round trips with no work at all.
func BenchmarkBaselineChannelHandoff(b *testing.B) {
	in := make(chan *runtimev1.TopicEventRequest, 1024)
	jobs := make(chan *runtimev1.TopicEventRequest)
	acks := make(chan dispatchtest.Acked, 1024)
	go func() {
		for m := range in {
			jobs <- m
		}
		close(jobs)
	}()
	go func() {
		for m := range jobs {
			acks <- dispatchtest.Acked{ID: m.Id}
		}
	}()
	req := request("m1", "corr-1")
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		in <- req
		<-acks
	}
	close(in)
}

type benchBroker struct{ *dispatchtest.Broker }

func newFakeBrokerBench() benchBroker { return benchBroker{dispatchtest.NewBroker()} }

func (b benchBroker) Subscribe(ctx context.Context, p, t string) (dispatch.Stream, error) {
	return b.Broker.Subscribe(ctx, p, t)
}

func waitStreamB(b *testing.B, br *dispatchtest.Broker, topic string) *dispatchtest.Stream {
	for {
		if s := br.Stream(topic); s != nil {
			return s
		}
	}
}
