package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
)

// streamAck is one answer and the stream it was sent on.
type streamAck struct {
	dispatchtest.Acked
	stream *dispatchtest.Stream
	closed bool // the stream was closed when the answer was sent
}

// taggingBroker is a dispatchtest.Broker whose streams report which of them
// each answer was sent on.
type taggingBroker struct {
	*dispatchtest.Broker
	acks chan streamAck
}

type taggedStream struct {
	*dispatchtest.Stream
	acks chan streamAck
}

func (b *taggingBroker) Subscribe(ctx context.Context, pubsub, topic string) (dispatch.Stream, error) {
	st, err := b.Broker.Subscribe(ctx, pubsub, topic)
	if err != nil {
		return nil, err
	}
	return &taggedStream{Stream: st.(*dispatchtest.Stream), acks: b.acks}, nil
}

func (s *taggedStream) Ack(id string, status dispatch.Ack) error {
	closed := false
	select {
	case <-s.Done():
		closed = true
	default:
	}
	s.acks <- streamAck{Acked: dispatchtest.Acked{ID: id, Status: status}, stream: s.Stream, closed: closed}
	return s.Stream.Ack(id, status)
}

// docs/architecture.md, "The path of a message": after the subscription
// reconnects, the broker's redelivery of an event still in flight (daprd
// forgot the closed stream's delivery) is answered on the new stream, where
// daprd waits for it, not on the old, closed one (it was unanswered until
// the broker's processing timeout).
func TestRedeliveryAfterReconnectIsAnsweredOnTheNewStream(t *testing.T) {
	b := &taggingBroker{Broker: dispatchtest.NewBroker(), acks: make(chan streamAck, 16)}
	pub := &publishtest.Recorder{}
	release := make(chan struct{})
	running := make(chan struct{}, 4)
	d := newTestDispatcherWith(t, b, pub, state.NewMemoryStore(), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 2,
		ReconnectMin: time.Millisecond, ReconnectMax: 5 * time.Millisecond})
	d.Attach(dispatch.Worker{ID: "w", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(in *event.Event) ([]event.Event, error) {
		running <- struct{}{}
		<-release
		return outputs("x")(in)
	}})
	first := waitStream(t, b.Broker, "in")
	first.In <- request("m1", "")
	<-running
	first.Close() // daprd went away while m1 runs
	var second *dispatchtest.Stream
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if s := b.Broker.Stream("in"); s != first && s != nil {
			second = s
			break
		}
	}
	if second == nil {
		t.Fatal("did not resubscribe")
	}
	second.In <- request("m1", "") // the broker redelivers it on the new stream
	// Wait until the dispatcher has taken the redelivery (it is counted as
	// a duplicate of the event in flight).
	for deadline := time.Now().Add(5 * time.Second); d.Stats().Duplicates == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the redelivery was not taken as a delivery of the event in flight")
		}
	}
	close(release)
	var onNew bool
	timeout := time.After(5 * time.Second)
	for !onNew {
		select {
		case a := <-b.acks:
			if a.ID != "m1" || a.Status != dispatch.AckSuccess {
				t.Fatalf("ack %+v", a.Acked)
			}
			if a.stream == second && !a.closed {
				onNew = true
			}
		case <-timeout:
			t.Fatal("the redelivery on the new stream was never answered there")
		}
	}
	select {
	case <-running:
		t.Fatal("the event ran twice")
	default:
	}
}
