package dispatch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"

	"github.com/virtufin/workmanager/engines"
)

// fakeBroker is an in-memory Subscriber: tests push messages and read acks.
type fakeBroker struct {
	mu      sync.Mutex
	streams map[string]*fakeStream
	subs    atomic.Int32
	acks    chan fakeAck
	// refuse, while set, is the error every Subscribe returns (a broker
	// that is down or out of connections).
	refuse atomic.Pointer[error]
	// ackErr, while set, is the error every Ack returns (after recording
	// the ack: the answer was attempted).
	ackErr atomic.Pointer[error]
}

type fakeAck struct {
	id     string
	status Ack
}

func newFakeBroker() *fakeBroker {
	return &fakeBroker{streams: map[string]*fakeStream{}, acks: make(chan fakeAck, 1<<16)}
}

func (b *fakeBroker) Subscribe(ctx context.Context, _, topic string) (Stream, error) {
	if err := b.refuse.Load(); err != nil {
		return nil, *err
	}
	s := &fakeStream{in: make(chan *runtimev1.TopicEventRequest, 1024), done: make(chan struct{}), b: b}
	b.mu.Lock()
	b.streams[topic] = s
	b.mu.Unlock()
	b.subs.Add(1)
	return s, nil
}

func (b *fakeBroker) stream(topic string) *fakeStream {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.streams[topic]
}

type fakeStream struct {
	in   chan *runtimev1.TopicEventRequest
	done chan struct{}
	once sync.Once
	b    *fakeBroker
}

func (s *fakeStream) Recv() (*runtimev1.TopicEventRequest, error) {
	select {
	case m := <-s.in:
		return m, nil
	case <-s.done:
		return nil, errors.New("stream closed")
	}
}

func (s *fakeStream) Ack(id string, status Ack) error {
	s.b.acks <- fakeAck{id, status}
	if err := s.b.ackErr.Load(); err != nil {
		return *err
	}
	return nil
}

func (s *fakeStream) Close() { s.once.Do(func() { close(s.done) }) }

// fakePublisher records published events; while fail is set, Publish
// records nothing and returns it (a broker that refuses publishes).
type fakePublisher struct {
	mu     sync.Mutex
	events []published
	n      atomic.Int64
	fail   atomic.Pointer[error]
}

type published struct {
	topic string
	ev    event.Event
}

func (p *fakePublisher) Publish(_ context.Context, topic string, e *event.Event) error {
	if err := p.fail.Load(); err != nil {
		return *err
	}
	p.n.Add(1)
	p.mu.Lock()
	p.events = append(p.events, published{topic, e.Clone()})
	p.mu.Unlock()
	return nil
}

// discardPublisher counts without keeping anything (benchmarks).
type discardPublisher struct{ n atomic.Int64 }

func (p *discardPublisher) Publish(context.Context, string, *event.Event) error {
	p.n.Add(1)
	return nil
}

// funcInstance is an engines.Instance made of a function.
type funcInstance struct {
	fn     func(*event.Event) ([]event.Event, error)
	closed atomic.Bool
}

func (f *funcInstance) Process(_ context.Context, in *event.Event) ([]event.Event, error) {
	if f.closed.Load() {
		return nil, errors.New("closed instance called")
	}
	return f.fn(in)
}

func (f *funcInstance) Close(context.Context) error { f.closed.Store(true); return nil }

var _ engines.Instance = (*funcInstance)(nil)
