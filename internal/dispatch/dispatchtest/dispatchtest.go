// Package dispatchtest owns the in-memory fakes of the dispatcher's inputs:
// a broker that delivers what a test pushes and records acks (and can be told
// to refuse subscriptions or fail acks), and an engine instance made of a
// function. The dispatcher's, the node's and the activities' tests share
// them; the publisher fake is publishtest's.
package dispatchtest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/dispatch"
)

// Broker is an in-memory dispatch.Subscriber: tests push messages into a
// topic's Stream and read the answers from Acks. A stream nobody pushes to
// never delivers (an idle subscription).
type Broker struct {
	// Acks receives every ack, in order, including those that failed.
	Acks chan Acked

	mu      sync.Mutex
	streams map[string]*Stream
	subs    atomic.Int32
	refuse  atomic.Pointer[error]
	ackErr  atomic.Pointer[error]
	late    atomic.Int32
}

// LateAcks counts the acks sent on a stream the dispatcher had closed
// already: with daprd they fail ("SendMsg called after CloseSend") and the
// broker delivers the message again.
func (b *Broker) LateAcks() int { return int(b.late.Load()) }

var _ dispatch.Subscriber = (*Broker)(nil)

// Acked is one answer the dispatcher gave.
type Acked struct {
	ID     string
	Status dispatch.Ack
}

// NewBroker returns a broker with room for 65,536 unread acks.
func NewBroker() *Broker {
	return &Broker{streams: map[string]*Stream{}, Acks: make(chan Acked, 1<<16)}
}

// Subscribe implements dispatch.Subscriber.
func (b *Broker) Subscribe(_ context.Context, _, topic string) (dispatch.Stream, error) {
	if err := b.refuse.Load(); err != nil {
		return nil, *err
	}
	s := &Stream{In: make(chan *runtimev1.TopicEventRequest, 1024), done: make(chan struct{}), b: b}
	b.mu.Lock()
	b.streams[topic] = s
	b.mu.Unlock()
	b.subs.Add(1)
	return s, nil
}

// Stream returns the latest stream opened on topic, or nil.
func (b *Broker) Stream(topic string) *Stream {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.streams[topic]
}

// Subscriptions counts the streams opened so far.
func (b *Broker) Subscriptions() int { return int(b.subs.Load()) }

// Refuse makes every Subscribe fail with err until Refuse(nil) (a broker
// that is down or out of connections).
func (b *Broker) Refuse(err error) { b.refuse.Store(errPtr(err)) }

// FailAcks makes every Ack return err, after recording it (the answer was
// attempted), until FailAcks(nil).
func (b *Broker) FailAcks(err error) { b.ackErr.Store(errPtr(err)) }

// Stream is one subscription of a Broker.
type Stream struct {
	// In delivers to the dispatcher.
	In   chan *runtimev1.TopicEventRequest
	done chan struct{}
	once sync.Once
	b    *Broker
}

// Recv implements dispatch.Stream.
func (s *Stream) Recv() (*runtimev1.TopicEventRequest, error) {
	select {
	case m := <-s.In:
		return m, nil
	case <-s.done:
		return nil, errors.New("stream closed")
	}
}

// Ack implements dispatch.Stream.
func (s *Stream) Ack(id string, status dispatch.Ack) error {
	s.b.Acks <- Acked{id, status}
	select {
	case <-s.done:
		s.b.late.Add(1)
		return errors.New("SendMsg called after CloseSend")
	default:
	}
	if err := s.b.ackErr.Load(); err != nil {
		return *err
	}
	return nil
}

// Close implements dispatch.Stream.
func (s *Stream) Close() { s.once.Do(func() { close(s.done) }) }

// Done is closed when the dispatcher closes the stream.
func (s *Stream) Done() <-chan struct{} { return s.done }

// FuncInstance is an engines.Instance made of a function; calling it after
// Close fails.
type FuncInstance struct {
	Fn func(*event.Event) ([]event.Event, error)
	// Ctx, when set, sees each call's context before Fn runs (e.g. for the
	// group lock's engines.Fence).
	Ctx func(context.Context)
	// OnClose, when set, runs in Close before it returns (a slow or
	// blocking process exit); OnCtxClose the same, with Close's context.
	OnClose    func()
	OnCtxClose func(context.Context)
	closed     atomic.Bool
}

var _ engines.Instance = (*FuncInstance)(nil)

// Process implements engines.Instance.
func (f *FuncInstance) Process(ctx context.Context, in *event.Event) ([]event.Event, error) {
	if f.closed.Load() {
		return nil, errors.New("closed instance called")
	}
	if f.Ctx != nil {
		f.Ctx(ctx)
	}
	return f.Fn(in)
}

// Close implements engines.Instance.
func (f *FuncInstance) Close(ctx context.Context) error {
	if f.OnClose != nil {
		f.OnClose()
	}
	if f.OnCtxClose != nil {
		f.OnCtxClose(ctx)
	}
	f.closed.Store(true)
	return nil
}

// Closed reports whether Close was called.
func (f *FuncInstance) Closed() bool { return f.closed.Load() }

func errPtr(err error) *error {
	if err == nil {
		return nil
	}
	return &err
}

// LendingInstance is a FuncInstance that lends its outputs
// (engines.Lender), as the native engine does: each output's data is a
// buffer of the instance's own, overwritten with '#' when its loan comes
// back, so that an output read after its return shows it. A loan returned
// twice panics.
type LendingInstance struct {
	FuncInstance
	lent, returned atomic.Int64
}

var _ engines.Lender = (*LendingInstance)(nil)

// ProcessLent implements engines.Lender.
func (l *LendingInstance) ProcessLent(ctx context.Context, in *event.Event) ([]event.Event, engines.Loan, error) {
	outs, err := l.Process(ctx, in)
	lent := outs
	var answer *engines.ErrorAnswer
	if errors.As(err, &answer) {
		lent = answer.Outputs
	}
	if len(lent) == 0 {
		return outs, nil, err
	}
	loan := &lentData{l: l}
	for i := range lent {
		buf := append([]byte(nil), lent[i].DataEncoded...)
		lent[i].DataEncoded = buf
		loan.bufs = append(loan.bufs, buf)
	}
	l.lent.Add(1)
	return outs, loan, err
}

// Loans are how many loans were handed out and how many came back.
func (l *LendingInstance) Loans() (lent, returned int64) { return l.lent.Load(), l.returned.Load() }

type lentData struct {
	l        *LendingInstance
	bufs     [][]byte
	returned atomic.Bool
}

func (d *lentData) Return() {
	if d.returned.Swap(true) {
		panic("dispatchtest: a loan returned twice")
	}
	for _, b := range d.bufs {
		for i := range b {
			b[i] = '#'
		}
	}
	d.l.returned.Add(1)
}
