package publish

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/internal/batch"
)

// Coalescing is a Publisher that coalesces concurrent Publish calls into
// one PublishBatch per topic on a Batcher (a group commit of outputs): while
// one batch is in flight the next callers queue, and the queue goes out as
// the next batch. A caller alone waits for nothing more than its own
// publish, which goes as a single Publish; under load one request (and one
// Redis script) carries the outputs of many messages instead of one each,
// which is most of what a publish costs daprd (docs/performance.md,
// "Outputs published together").
//
// The promises of Publish are kept per call: a call returns once its event
// is published, or with an error; one caller's events keep their order (a
// caller publishes one event at a time); events of different callers have
// no order between them, as before. A batch that fails is retried event by
// event, each caller with its own context, so that one refused event fails
// only its own call (the events of a failed batch that were already added
// may then be added twice: at least once, as any retried publish).
//
// A call whose context carries a span (tracing on) publishes on its own,
// so that daprd continues that trace; PublishBatch and PublishFenced go
// straight through.
type Coalescing struct {
	pub      Batcher
	timeout  time.Duration
	maxBytes int
	c        batch.Coalescer[pubReq]
}

// CoalesceMax bounds the events of one coalesced batch.
const CoalesceMax = 64

// CoalesceMaxBytes bounds the data of one coalesced request: an event
// larger than that goes alone, and a batch is cut before it would pass it
// (well inside daprd's request limit, --max-body-size).
const CoalesceMaxBytes = 1 << 20

// NewCoalescing coalesces the Publish calls made on pub; timeout bounds
// one batch (0: 30s).
func NewCoalescing(pub Batcher, timeout time.Duration) *Coalescing {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	c := &Coalescing{pub: pub, timeout: timeout, maxBytes: CoalesceMaxBytes}
	c.c = batch.Coalescer[pubReq]{Run: c.run, Max: CoalesceMax}
	return c
}

type pubReq struct {
	topic string
	e     *event.Event
	err   error
	done  chan struct{}
}

// errAlone: the request's batch failed; its caller publishes it alone.
var errAlone = errors.New("publish: batch failed, publish alone")

// Publish implements Publisher.
func (c *Coalescing) Publish(ctx context.Context, topic string, e *event.Event) error {
	if trace.SpanContextFromContext(ctx).IsValid() || len(e.DataEncoded) > c.maxBytes {
		return c.pub.Publish(ctx, topic, e)
	}
	r := &pubReq{topic: topic, e: e, done: make(chan struct{})}
	c.c.Add(r)
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("publish %s to %s: %w", e.ID(), topic, ctx.Err())
	}
	if errors.Is(r.err, errAlone) {
		return c.pub.Publish(ctx, topic, e)
	}
	return r.err
}

// Queued is how many calls wait for the next batch.
func (c *Coalescing) Queued() int { return c.c.Queued() }

// PublishBatch implements Batcher (not coalesced).
func (c *Coalescing) PublishBatch(ctx context.Context, topic string, es []*event.Event) error {
	return c.pub.PublishBatch(ctx, topic, es)
}

// PublishFenced implements Fencer when the coalesced Publisher does (not
// coalesced: a fenced request names one lock).
func (c *Coalescing) PublishFenced(ctx context.Context, topic, lock string, es []*event.Event) error {
	_, err := Fenced(ctx, c.pub, topic, lock, es)
	return err
}

// run publishes one batch: per topic, in the callers' order, in requests
// of at most maxBytes of data; the topics' requests go out together.
func (c *Coalescing) run(reqs []*pubReq) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var groups [][]*pubReq
	at := map[string]int{} // topic -> its open group in groups
	size := map[string]int{}
	for _, r := range reqs {
		n := len(r.e.DataEncoded)
		i, ok := at[r.topic]
		if !ok || size[r.topic]+n > c.maxBytes {
			i = len(groups)
			groups = append(groups, nil)
			at[r.topic], size[r.topic] = i, 0
		}
		groups[i] = append(groups[i], r)
		size[r.topic] += n
	}
	if len(groups) == 1 {
		c.send(ctx, groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.send(ctx, g)
		}()
	}
	c.send(ctx, groups[0])
	wg.Wait()
}

// send publishes one topic's group and answers its callers.
func (c *Coalescing) send(ctx context.Context, g []*pubReq) {
	defer func() {
		for _, r := range g {
			close(r.done)
		}
	}()
	if len(g) == 1 {
		g[0].err = c.pub.Publish(ctx, g[0].topic, g[0].e)
		return
	}
	es := make([]*event.Event, len(g))
	for i, r := range g {
		es[i] = r.e
	}
	if err := c.pub.PublishBatch(ctx, g[0].topic, es); err != nil {
		for _, r := range g {
			r.err = errAlone
		}
	}
}
