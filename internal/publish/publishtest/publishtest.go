// Package publishtest owns the in-memory publisher fakes every test shares:
// a Recorder that keeps what it is given and can be told to refuse, a
// Discard that only counts (benchmarks), and a DaprClient that records
// what a publish.Dapr sends to daprd.
package publishtest

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	dapr "github.com/dapr/go-sdk/client"

	"github.com/virtufin/workmanager/internal/publish"
)

// Published is one event a Recorder kept.
type Published struct {
	Topic string
	Event event.Event
}

// Recorder records what it is given. While a failure is set (Fail,
// FailWhen) a refused publish records nothing and returns the error (a
// broker that refuses publishes).
type Recorder struct {
	mu     sync.Mutex
	events []Published
	fail   func(topic string, e *event.Event) error
}

var _ publish.Publisher = (*Recorder)(nil)

// Publish implements publish.Publisher.
func (p *Recorder) Publish(_ context.Context, topic string, e *event.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		if err := p.fail(topic, e); err != nil {
			return err
		}
	}
	p.events = append(p.events, Published{topic, e.Clone()})
	return nil
}

// Fail makes every Publish return err until Fail(nil).
func (p *Recorder) Fail(err error) {
	if err == nil {
		p.FailWhen(nil)
		return
	}
	p.FailWhen(func(string, *event.Event) error { return err })
}

// FailWhen makes Publish return what fn returns for each event (nil: the
// event is kept) until FailWhen(nil).
func (p *Recorder) FailWhen(fn func(topic string, e *event.Event) error) {
	p.mu.Lock()
	p.fail = fn
	p.mu.Unlock()
}

// All returns what was published so far.
func (p *Recorder) All() []Published {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Published(nil), p.events...)
}

// On returns the events published to topic so far.
func (p *Recorder) On(topic string) []event.Event {
	var out []event.Event
	for _, e := range p.All() {
		if e.Topic == topic {
			out = append(out, e.Event)
		}
	}
	return out
}

// Discard counts publishes and keeps nothing.
type Discard struct{ n atomic.Int64 }

var _ publish.Publisher = (*Discard)(nil)

// Publish implements publish.Publisher.
func (p *Discard) Publish(context.Context, string, *event.Event) error {
	p.n.Add(1)
	return nil
}

// Count is how many events were published.
func (p *Discard) Count() int64 { return p.n.Load() }

// DaprCall is one PublishEvent a DaprClient was given.
type DaprCall struct {
	PubSub, Topic string
	// Metadata is the call's per-request metadata ("maxLenApprox", ...).
	Metadata map[string]string
}

// DaprClient is a Dapr client whose PublishEvent records the pub/sub,
// topic and per-request metadata of each call (every other method panics:
// it is not meant for them).
type DaprClient struct {
	dapr.Client
	mu    sync.Mutex
	calls []DaprCall
}

// PublishEvent implements dapr.Client.
func (c *DaprClient) PublishEvent(_ context.Context, pubsub, topic string, _ interface{}, opts ...dapr.PublishEventOption) error {
	req := &runtimev1.PublishEventRequest{}
	for _, o := range opts {
		o(req)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, DaprCall{PubSub: pubsub, Topic: topic, Metadata: req.GetMetadata()})
	return nil
}

// Calls returns the calls so far.
func (c *DaprClient) Calls() []DaprCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]DaprCall(nil), c.calls...)
}

// Batching is a Recorder that is also a publish.Batcher and a
// publish.Fencer: PublishBatch keeps a whole batch in its order, or, when
// the Recorder's failure refuses any of its events, none of it;
// PublishFenced also refuses it (publish.ErrFenced) when a higher token of
// its lock went out on its topic (Mark) — as WorkManager's daprd. Every
// request (Publish, PublishBatch, PublishFenced) first waits for Gate when
// it is set, and counts.
type Batching struct {
	Recorder
	// Gate, when set, holds every request until it is closed.
	Gate chan struct{}

	bmu   sync.Mutex
	sizes []int             // events per request, in order
	marks map[string]int64  // topic|lock → highest token published
	locks map[string]string // topic → lock of its last fenced request
}

var (
	_ publish.Batcher = (*Batching)(nil)
	_ publish.Fencer  = (*Batching)(nil)
)

// Mark records that an output of lock with fencing token tok went out on
// topic (a later holder's, published by another node).
func (p *Batching) Mark(topic, lock string, tok int64) {
	p.bmu.Lock()
	defer p.bmu.Unlock()
	if p.marks == nil {
		p.marks = map[string]int64{}
	}
	if tok > p.marks[topic+"|"+lock] {
		p.marks[topic+"|"+lock] = tok
	}
}

// PublishFenced implements publish.Fencer.
func (p *Batching) PublishFenced(ctx context.Context, topic, lock string, es []*event.Event) error {
	var low, high int64 = -1, -1
	for _, e := range es {
		s, _ := e.Extensions()[publish.FencingExtension].(string)
		tok, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("fenced output %s without a token: %q", e.ID(), s)
		}
		if low < 0 {
			low = tok
		}
		high = tok
	}
	if err := p.wait(ctx); err != nil {
		return err
	}
	p.bmu.Lock()
	if m, ok := p.marks[topic+"|"+lock]; ok && low < m {
		p.sizes = append(p.sizes, len(es))
		p.bmu.Unlock()
		return fmt.Errorf("token %d of %s on %s below %d: %w", low, lock, topic, m, publish.ErrFenced)
	}
	p.bmu.Unlock()
	if err := p.publishBatch(topic, es); err != nil {
		return err
	}
	p.Mark(topic, lock, high)
	return nil
}

func (p *Batching) wait(ctx context.Context) error {
	if p.Gate == nil {
		return nil
	}
	select {
	case <-p.Gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Publish implements publish.Publisher.
func (p *Batching) Publish(ctx context.Context, topic string, e *event.Event) error {
	if err := p.wait(ctx); err != nil {
		return err
	}
	p.bmu.Lock()
	p.sizes = append(p.sizes, 1)
	p.bmu.Unlock()
	return p.Recorder.Publish(ctx, topic, e)
}

// PublishBatch implements publish.Batcher.
func (p *Batching) PublishBatch(ctx context.Context, topic string, es []*event.Event) error {
	if err := p.wait(ctx); err != nil {
		return err
	}
	return p.publishBatch(topic, es)
}

func (p *Batching) publishBatch(topic string, es []*event.Event) error {
	p.bmu.Lock()
	p.sizes = append(p.sizes, len(es))
	p.bmu.Unlock()
	p.Recorder.mu.Lock()
	defer p.Recorder.mu.Unlock()
	if p.fail != nil {
		for _, e := range es {
			if err := p.fail(topic, e); err != nil {
				return err
			}
		}
	}
	for _, e := range es {
		p.events = append(p.events, Published{topic, e.Clone()})
	}
	return nil
}

// Requests returns the number of events of each request so far.
func (p *Batching) Requests() []int {
	p.bmu.Lock()
	defer p.bmu.Unlock()
	return append([]int(nil), p.sizes...)
}
