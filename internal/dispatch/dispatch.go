// Package dispatch owns the hot path: one Dapr streaming subscription per
// topic, fan-out of every message to the running workers on that topic,
// bounded concurrency per worker, publishing of each output CloudEvent to the
// topic named by its type, and the final ack (SUCCESS, or RETRY so that the
// broker redelivers when any worker failed). It knows nothing about Temporal:
// the node attaches and detaches workers.
//
// The path of one message: topicLoop (Recv) → dispatch (decode, fan-out to
// each worker's job channel) → serve (engine Process, publish outputs) →
// message.finish (ack once every worker answered).
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/publish"
)

// CorrelationExtension is copied from each input to its outputs.
const CorrelationExtension = "correlationid"

// Config tunes the hot path.
type Config struct {
	// PubSub is the Dapr pub/sub component name.
	PubSub string
	// MaxConcurrency bounds the messages one worker processes at once.
	MaxConcurrency int
	// ReconnectMin and ReconnectMax bound the backoff between reconnects.
	ReconnectMin, ReconnectMax time.Duration
	// OnSubscription, when set, learns the state of each topic's
	// subscription: an error when it could not be opened or was lost, nil
	// when it is open or no longer wanted (the node's broker health check).
	OnSubscription func(topic string, err error)
}

// Worker identifies a worker to the hot path.
type Worker struct {
	ID    string
	Topic string
	Group string
}

// Dispatcher routes messages from topic streams to attached workers.
type Dispatcher struct {
	log    *slog.Logger
	sub    Subscriber
	pub    publish.Publisher
	events *lifecycleevents.Emitter
	cfg    Config
	ctx    context.Context

	mu      sync.Mutex
	topics  map[string]*topic
	workers map[string]*worker

	processed, failed atomic.Int64
}

// New returns a Dispatcher whose streams live until ctx ends.
func New(ctx context.Context, log *slog.Logger, sub Subscriber, pub publish.Publisher, events *lifecycleevents.Emitter, cfg Config) *Dispatcher {
	if cfg.MaxConcurrency <= 0 {
		cfg.MaxConcurrency = 1
	}
	if cfg.ReconnectMin <= 0 {
		cfg.ReconnectMin = 100 * time.Millisecond
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		cfg.ReconnectMax = 5 * time.Second
	}
	if cfg.OnSubscription == nil {
		cfg.OnSubscription = func(string, error) {}
	}
	return &Dispatcher{
		log: log, sub: sub, pub: pub, events: events, cfg: cfg, ctx: ctx,
		topics: map[string]*topic{}, workers: map[string]*worker{},
	}
}

type topic struct {
	name    string
	sources sourceCache // used only by the topic's stream goroutine
	workers atomic.Pointer[[]*worker]
	cancel  context.CancelFunc
	done    chan struct{}
}

type worker struct {
	Worker
	source  types.URIRef
	inst    atomic.Pointer[instance]
	jobs    chan *message
	stopped chan struct{}
	wg      sync.WaitGroup
}

// instance guards one engine instance so that it is closed only after its
// in-flight calls returned (hot reload never drops or tears a call).
type instance struct {
	engines.Instance
	mu     sync.RWMutex
	closed bool
}

func (i *instance) closeWhenIdle(ctx context.Context, log *slog.Logger) {
	i.mu.Lock()
	i.closed = true
	i.mu.Unlock()
	if err := i.Close(ctx); err != nil {
		log.Warn("closing worker instance", "err", err)
	}
}

// Attached reports whether a worker is attached.
func (d *Dispatcher) Attached(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.workers[id]
	return ok
}

// Attach makes w serve its topic with inst. Attaching an attached worker
// swaps its instance (hot reload): later messages use inst, in-flight ones
// finish on the old instance, which is then closed.
func (d *Dispatcher) Attach(w Worker, inst engines.Instance) {
	d.mu.Lock()
	if cur, ok := d.workers[w.ID]; ok && cur.Topic == w.Topic {
		cur.Group = w.Group
		old := cur.inst.Swap(&instance{Instance: inst})
		d.mu.Unlock()
		go old.closeWhenIdle(context.WithoutCancel(d.ctx), d.log)
		return
	}
	d.mu.Unlock()
	d.Detach(context.Background(), w.ID) // topic changed: start over

	nw := &worker{Worker: w, source: types.URIRef{URL: url.URL{Path: "workmanager/workers/" + w.ID}}, jobs: make(chan *message), stopped: make(chan struct{})}
	nw.inst.Store(&instance{Instance: inst})
	for range d.cfg.MaxConcurrency {
		nw.wg.Add(1)
		go d.serve(nw)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.workers[w.ID] = nw
	t, ok := d.topics[w.Topic]
	if !ok {
		ctx, cancel := context.WithCancel(d.ctx)
		t = &topic{name: w.Topic, cancel: cancel, done: make(chan struct{})}
		t.workers.Store(&[]*worker{})
		d.topics[w.Topic] = t
		go d.topicLoop(ctx, t)
	}
	list := append(append([]*worker(nil), *t.workers.Load()...), nw)
	t.workers.Store(&list)
}

// Detach stops w: no new message reaches it, its in-flight messages finish,
// its instance is closed, and the topic's stream is closed when w was the
// last worker on it. Detaching an unknown worker is a no-op.
func (d *Dispatcher) Detach(ctx context.Context, id string) {
	d.mu.Lock()
	w, ok := d.workers[id]
	if !ok {
		d.mu.Unlock()
		return
	}
	delete(d.workers, id)
	t := d.topics[w.Topic]
	var list []*worker
	for _, x := range *t.workers.Load() {
		if x != w {
			list = append(list, x)
		}
	}
	t.workers.Store(&list)
	if len(list) == 0 {
		delete(d.topics, w.Topic)
		t.cancel()
	}
	d.mu.Unlock()

	close(w.stopped)
	w.wg.Wait()
	w.inst.Load().closeWhenIdle(ctx, d.log)
	if len(list) == 0 {
		select {
		case <-t.done:
		case <-ctx.Done():
		}
	}
}

// DetachAll detaches every worker (node shutdown).
func (d *Dispatcher) DetachAll(ctx context.Context) {
	d.mu.Lock()
	ids := make([]string, 0, len(d.workers))
	for id := range d.workers {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	for _, id := range ids {
		d.Detach(ctx, id)
	}
}

// Stats are hot-path counters since start.
type Stats struct {
	Workers, Topics   int
	Processed, Failed int64
}

// Stats returns the current counters.
func (d *Dispatcher) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Stats{Workers: len(d.workers), Topics: len(d.topics), Processed: d.processed.Load(), Failed: d.failed.Load()}
}

// topicLoop keeps one subscription open until ctx ends, reconnecting with
// backoff when daprd goes away.
func (d *Dispatcher) topicLoop(ctx context.Context, t *topic) {
	defer close(t.done)
	defer d.cfg.OnSubscription(t.name, nil) // no longer wanted
	log := d.log.With("topic", t.name)
	backoff := d.cfg.ReconnectMin
	for ctx.Err() == nil {
		st, err := d.sub.Subscribe(ctx, d.cfg.PubSub, t.name)
		if err == nil {
			log.Debug("subscribed")
			d.cfg.OnSubscription(t.name, nil)
			stopClose := context.AfterFunc(ctx, st.Close) // unblock Recv on unsubscribe
			var got bool
			for {
				req, err2 := st.Recv()
				if err2 != nil {
					err = err2
					break
				}
				got = true
				d.dispatch(ctx, t, st, req)
			}
			stopClose()
			st.Close()
			if got {
				backoff = d.cfg.ReconnectMin
			}
		}
		if ctx.Err() != nil {
			return
		}
		d.cfg.OnSubscription(t.name, err)
		log.Warn("subscription lost, reconnecting", "err", err, "backoff", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(2*backoff, d.cfg.ReconnectMax)
	}
}

// message is one received event on its way through the workers of a topic.
// Messages are pooled: one is reused once it has been acked.
type message struct {
	id      string
	ev      event.Event
	ec      event.EventContextV1
	stream  Stream
	pending atomic.Int32
	failed  atomic.Bool
	// correlation is the input's correlation id (hasCorrelation: present).
	correlation    any
	hasCorrelation bool
}

var messages = sync.Pool{New: func() any { return new(message) }}

// finish records one worker's answer and acks once all have answered.
func (m *message) finish(d *Dispatcher, ok bool) {
	if !ok {
		m.failed.Store(true)
	}
	if m.pending.Add(-1) != 0 {
		return
	}
	status := AckSuccess
	if m.failed.Load() {
		status = AckRetry
		d.failed.Add(1)
	} else {
		d.processed.Add(1)
	}
	if err := m.stream.Ack(m.id, status); err != nil {
		d.log.Warn("ack failed; the broker will redeliver", "event_id", m.id, "err", err)
	}
	m.failed.Store(false)
	ext := m.ec.Extensions
	clear(ext)
	m.ev, m.ec, m.stream, m.correlation, m.hasCorrelation = event.Event{}, event.EventContextV1{Extensions: ext}, nil, nil, false
	messages.Put(m)
}

func (d *Dispatcher) dispatch(ctx context.Context, t *topic, st Stream, req *runtimev1.TopicEventRequest) {
	ws := *t.workers.Load()
	m := messages.Get().(*message)
	m.id, m.stream = req.GetId(), st
	if len(ws) == 0 {
		m.pending.Store(1)
		m.finish(d, false)
		return
	}
	if err := decode(req, &m.ev, &m.ec, &t.sources); err != nil {
		d.log.Warn("undecodable CloudEvent, asking for redelivery", "topic", t.name, "event_id", req.GetId(), "err", err)
		m.pending.Store(1)
		m.finish(d, false)
		return
	}
	m.correlation, m.hasCorrelation = m.ev.Context.(*event.EventContextV1).Extensions[CorrelationExtension]
	m.pending.Store(int32(len(ws)))
	for _, w := range ws {
		select {
		case w.jobs <- m:
		case <-w.stopped:
			m.finish(d, false)
		case <-ctx.Done():
			m.finish(d, false)
		}
	}
}

// serve is one of a worker's MaxConcurrency goroutines.
func (d *Dispatcher) serve(w *worker) {
	defer w.wg.Done()
	for {
		select {
		case m := <-w.jobs:
			m.finish(d, d.handle(w, m))
		case <-w.stopped:
			return
		}
	}
}

// handle runs one message through one worker and publishes its outputs.
func (d *Dispatcher) handle(w *worker, m *message) bool {
	ctx := d.ctx
	outs, err := w.process(ctx, &m.ev)
	if err != nil {
		d.workerError(ctx, w, m, err)
		return false
	}
	for i := range outs {
		o := &outs[i]
		if err := d.complete(w, m, o, i); err != nil {
			d.workerError(ctx, w, m, err)
			return false
		}
		if err := d.pub.Publish(ctx, o.Type(), o); err != nil {
			d.workerError(ctx, w, m, err)
			return false
		}
	}
	return true
}

// complete fills an output's defaults (id derived from the input id, so a
// redelivery yields the same ids; source naming the worker) and its
// correlation id: the input's, copied when present and absent when absent.
func (d *Dispatcher) complete(w *worker, m *message, o *event.Event, i int) error {
	if o.Context == nil {
		return fmt.Errorf("%w: output %d is empty", engines.ErrWorkerFailed, i)
	}
	oc, ok := o.Context.(*event.EventContextV1)
	if !ok {
		oc = o.Context.AsV1()
		o.Context = oc
	}
	if oc.Type == "" {
		return fmt.Errorf("%w: output %d has no type", engines.ErrWorkerFailed, i)
	}
	if oc.ID == "" {
		oc.ID = m.id + "/" + w.ID + "/" + strconv.Itoa(i)
	}
	if oc.Source.URL == (url.URL{}) {
		oc.Source = w.source
	}
	if m.hasCorrelation {
		if oc.Extensions == nil {
			oc.Extensions = make(map[string]any, 1)
		}
		oc.Extensions[CorrelationExtension] = m.correlation
	} else {
		delete(oc.Extensions, CorrelationExtension)
	}
	return nil
}

func (w *worker) process(ctx context.Context, in *event.Event) ([]event.Event, error) {
	for {
		ref := w.inst.Load()
		ref.mu.RLock()
		if ref.closed {
			ref.mu.RUnlock()
			if w.inst.Load() == ref {
				return nil, engines.ErrClosed
			}
			continue // swapped by a hot reload: use the new instance
		}
		outs, err := ref.Process(ctx, in)
		ref.mu.RUnlock()
		return outs, err
	}
}

func (d *Dispatcher) workerError(ctx context.Context, w *worker, m *message, err error) {
	kind := "worker_failed"
	switch {
	case errors.Is(err, engines.ErrTimeout):
		kind = "timeout"
	case errors.Is(err, engines.ErrClosed):
		kind = "closed"
	case errors.Is(err, engines.ErrWorkerFailed):
	default:
		kind = "internal"
	}
	if kind == "closed" { // stopped or reloaded mid-call: not the worker's fault
		d.log.Info("call cut off by a stop or reload, message will be redelivered", "worker_id", w.ID, "event_id", m.id)
		return
	}
	d.log.Warn("worker error, message will be redelivered", "worker_id", w.ID, "topic", w.Topic, "event_id", m.id, "error_type", kind, "err", err)
	if d.events == nil {
		return
	}
	data := lifecycleevents.Data{WorkerID: w.ID, Group: w.Group, Topic: w.Topic, ErrorType: kind, ErrorMessage: err.Error()}
	if err := d.events.Emit(ctx, "", lifecycleevents.Error, data); err != nil {
		d.log.Warn("publishing worker.error failed", "worker_id", w.ID, "err", err)
	}
}
