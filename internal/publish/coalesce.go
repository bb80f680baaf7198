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
// Fenced publishes (the outputs of a group's or a key's calls, each
// request one lock's run) are coalesced the same way when the Publisher
// is a RunsFencer: the runs of many locks to one topic go in one request,
// each run checked against its own lock's fence and published or refused
// on its own, so that a run's refusal (ErrFenced) is its caller's alone.
//
// A call whose context carries a span (tracing on) publishes on its own,
// so that daprd continues that trace; PublishBatch goes straight through.
type Coalescing struct {
	pub      Batcher
	runs     RunsFencer // nil: fenced publishes go straight through
	timeout  time.Duration
	maxBytes int
	c        batch.Coalescer[pubReq]
	fc       batch.Coalescer[fenceReq]
}

// CoalesceMax bounds the events of one coalesced batch.
const CoalesceMax = 64

// CoalesceMaxBytes bounds one coalesced request, its events' data and
// attributes (eventSize): an event larger than that goes alone, and a
// batch is cut before it would pass it — well inside daprd's request
// limit (--max-body-size; a request over it would fail whole and its
// events go again one by one).
const CoalesceMaxBytes = 1 << 20

// eventSize is about the size of e as published (its data, attributes
// and extensions), counted up to limit.
func eventSize(e *event.Event, limit int) int {
	n := len(e.DataEncoded)
	if ec, ok := e.Context.(*event.EventContextV1); ok {
		return n + AttributesSize(ec, limit)
	}
	return n + 1<<10 // another spec version: an allowance
}

// NewCoalescing coalesces the Publish calls made on pub; timeout bounds
// one batch (0: 30s).
func NewCoalescing(pub Batcher, timeout time.Duration) *Coalescing {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	c := &Coalescing{pub: pub, timeout: timeout, maxBytes: CoalesceMaxBytes}
	c.runs, _ = pub.(RunsFencer)
	c.c = batch.Coalescer[pubReq]{Run: c.run, Max: CoalesceMax}
	c.fc = batch.Coalescer[fenceReq]{Run: c.runFenced, Max: MaxFencedRuns}
	return c
}

type fenceReq struct {
	topic, lock string
	es          []*event.Event
	size        int
	err         error
	done        chan struct{}
}

type pubReq struct {
	topic string
	e     *event.Event
	size  int // eventSize
	err   error
	done  chan struct{}
}

// errAlone: the request's batch failed; its caller publishes it alone.
var errAlone = errors.New("publish: batch failed, publish alone")

// Publish implements Publisher.
func (c *Coalescing) Publish(ctx context.Context, topic string, e *event.Event) error {
	size := eventSize(e, c.maxBytes)
	if size > c.maxBytes || trace.SpanContextFromContext(ctx).IsValid() {
		return c.pub.Publish(ctx, topic, e)
	}
	r := &pubReq{topic: topic, e: e, size: size, done: make(chan struct{})}
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
func (c *Coalescing) Queued() int { return c.c.Queued() + c.fc.Queued() }

// PublishBatch implements Batcher (not coalesced).
func (c *Coalescing) PublishBatch(ctx context.Context, topic string, es []*event.Event) error {
	return c.pub.PublishBatch(ctx, topic, es)
}

// PublishFenced implements Fencer when the coalesced Publisher does:
// coalesced with other locks' runs to the same topic when it is a
// RunsFencer.
func (c *Coalescing) PublishFenced(ctx context.Context, topic, lock string, es []*event.Event) error {
	size := 0
	if c.runs != nil && lock != "" {
		for _, e := range es {
			size += eventSize(e, c.maxBytes)
		}
	}
	if c.runs == nil || lock == "" || len(es) == 0 || size > c.maxBytes || trace.SpanContextFromContext(ctx).IsValid() {
		_, err := Fenced(ctx, c.pub, topic, lock, es)
		return err
	}
	r := &fenceReq{topic: topic, lock: lock, es: es, size: size, done: make(chan struct{})}
	c.fc.Add(r)
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("publish %d fenced outputs (%s first) to %s: %w", len(es), es[0].ID(), topic, ctx.Err())
	}
	if errors.Is(r.err, errAlone) {
		return c.runs.PublishFenced(ctx, topic, lock, es)
	}
	return r.err
}

// runFenced publishes one batch of fenced runs: per topic, in requests of
// at most maxBytes; the topics' requests go out together.
func (c *Coalescing) runFenced(reqs []*fenceReq) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	groups := groupBy(reqs, func(r *fenceReq) (string, int) { return r.topic, r.size }, c.maxBytes)
	each(groups, func(g []*fenceReq) {
		defer func() {
			for _, r := range g {
				close(r.done)
			}
		}()
		if len(g) == 1 {
			g[0].err = c.runs.PublishFenced(ctx, g[0].topic, g[0].lock, g[0].es)
			return
		}
		runs := make([]FencedRun, len(g))
		for i, r := range g {
			runs[i] = FencedRun{Lock: r.lock, Events: r.es}
		}
		errs, err := c.runs.PublishFencedRuns(ctx, g[0].topic, runs)
		for i, r := range g {
			if err != nil {
				r.err = errAlone
			} else {
				r.err = errs[i]
			}
		}
	})
}

// groupBy splits reqs by topic, in their order, into groups of at most
// maxBytes (as key reports each request's topic and size).
func groupBy[T any](reqs []*T, key func(*T) (string, int), maxBytes int) [][]*T {
	var groups [][]*T
	at := map[string]int{} // topic -> its open group in groups
	size := map[string]int{}
	for _, r := range reqs {
		topic, n := key(r)
		i, ok := at[topic]
		if !ok || size[topic]+n > maxBytes {
			i = len(groups)
			groups = append(groups, nil)
			at[topic], size[topic] = i, 0
		}
		groups[i] = append(groups[i], r)
		size[topic] += n
	}
	return groups
}

// each runs send on every group, together, and returns when all are done.
func each[T any](groups [][]*T, send func([]*T)) {
	if len(groups) == 1 {
		send(groups[0])
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(g)
		}()
	}
	send(groups[0])
	wg.Wait()
}

// run publishes one batch: per topic, in the callers' order, in requests
// of at most maxBytes; the topics' requests go out together.
func (c *Coalescing) run(reqs []*pubReq) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	groups := groupBy(reqs, func(r *pubReq) (string, int) { return r.topic, r.size }, c.maxBytes)
	each(groups, func(g []*pubReq) { c.send(ctx, g) })
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
