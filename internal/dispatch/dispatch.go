// Package dispatch owns the hot path: one Dapr streaming subscription per
// topic, the delivery guarantees of every message (a delivery record per
// message, per-worker attempts, group locks with fencing tokens, dead
// letters on "<topic>-dead"), each worker's own bounded queue, publishing of
// each output CloudEvent to the topic named by its type, and the final ack.
// It knows nothing about Temporal: the node attaches and detaches workers.
//
// The path of one message is a file per stage, each entered once and in
// order: stream.go (the Dapr stream) → receive.go (receive and decode) →
// record.go (its delivery record; queued to each worker owing an answer) →
// lock.go (a worker's turn: its group lock) → call.go (the engine) →
// outputs.go (checked, fenced, published) → settle.go (the record written,
// dead letters through internal/deadletter, the ack). A grouped turn whose
// group another node holds goes from lock.go to forward.go (run there, its
// outcome back) and on to settle.go. This file attaches and detaches
// workers and topics.
package dispatch

import (
	"context"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/types"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/metrics"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/workerstats"
)

// Config tunes the hot path.
type Config struct {
	// PubSub is the Dapr pub/sub component name.
	PubSub string
	// NodeID names this node in lock holders and dead letters.
	NodeID string
	// MaxConcurrency bounds the messages one worker processes at once; an
	// Instance that batches its calls (engines.Batcher) may raise it for
	// its worker.
	MaxConcurrency int
	// QueueDepth bounds the messages waiting for one worker beyond those it
	// processes. A message that finds the queue full is not attempted by
	// that worker on this delivery (it comes back later), so a slow worker
	// never holds up the others on its topic and memory stays bounded.
	QueueDepth int
	// QueueWait is how long a message waits for room in a full queue
	// before it is given back for that worker. Waiting messages hold one
	// of daprd's delivery slots (the component's concurrency), so keep it
	// short.
	QueueWait time.Duration
	// MaxAttempts and RetryBackoff are the cluster's default retry policy:
	// attempts per (message, worker) before "<topic>-dead", and the delay
	// before the second attempt (doubling after each further one).
	MaxAttempts  int
	RetryBackoff time.Duration
	// NotRunnableGrace is how long a worker that the catalog runs but this
	// node cannot may keep a message pending before it is dead-lettered as
	// not_runnable (after MaxAttempts such deliveries). Another node that
	// runs it normally takes the message first.
	NotRunnableGrace time.Duration
	// MaxEventBytes is the largest event data accepted; larger events go
	// to "<topic>-dead" at once with reason too_large.
	MaxEventBytes int
	// MaxOutputs bounds the outputs of one call (default 100) and
	// MaxOutputBytes the data of one output (default MaxEventBytes): a call
	// beyond them fails, reason output_limit.
	MaxOutputs, MaxOutputBytes int
	// Secrets are values that must never leave the node in an error text
	// (the node's tokens and passwords): they are redacted.
	Secrets []string
	// PanicOn is a test hook (never set in production): a Go panic is
	// raised on the hot path, inside a worker's attempt, for each input that
	// carries this CloudEvent extension.
	PanicOn string
	// UnsafeNoFencing is a test hook (never set in production; the node
	// sets it only from WM_TEST_UNSAFE_NO_FENCING, which only the chaos
	// soak's "checker must be able to fail" demo sets): a grouped call's
	// outputs are published without checking that its lease is still the
	// group's lock, so a stale holder's outputs get through.
	UnsafeNoFencing bool
	// ReconnectMin and ReconnectMax bound the backoff between reconnects.
	ReconnectMin, ReconnectMax time.Duration
	// RecordSaveRetry is how long the outcomes of a delivery whose workers
	// have run are tried again when the state store cannot be reached
	// (daprd restarting): a record that is not saved makes the redelivery
	// run the workers again. Default 5s; keep it under the broker's
	// processing timeout.
	RecordSaveRetry time.Duration
	// OnSubscription, when set, learns the state of each topic's
	// subscription: an error when it could not be opened or was lost, nil
	// when it is open or no longer wanted (the node's broker health check).
	OnSubscription func(topic string, err error)
	// Serving, when set, tells whether this node may serve messages now
	// (reconcile.MemberGate: a node that is not a cluster member, or has
	// not reconciled since it became one again, may hold an old state of a
	// worker that was stopped meanwhile). While it is false no attempt
	// starts and no output is published: a message is given back (RETRY),
	// not lost, and an attempt that finished meanwhile is given back
	// unpublished (not counted). It is checked for every message and
	// before each attempt and its publishing, so it must be cheap.
	Serving func() bool
	// Suspect, when set, tells whether an event (its source and id) was in
	// flight in worker at enough crashes of this node that it must not
	// run again (engines/crashjournal): such an event is dead-lettered for
	// that worker as `crashed` without calling its engine. It is asked for
	// every message and worker, so it must be cheap.
	Suspect func(worker, source, id string) bool
	// ForwardTimeout bounds the wait for a turn forwarded to the node
	// holding its group (Deps.Peers): longer than a call and its
	// publishing (the node: WORKER_TIMEOUT + 5 s; default 2 minutes). A
	// holder that does not answer by then (paused, cut off) leaves the
	// attempt undecided (forward.go) and is not sent the next one.
	ForwardTimeout time.Duration
}

// CloudEvent extensions the hot path reads or writes.
const (
	// CorrelationExtension is copied from each input to its outputs.
	CorrelationExtension = "correlationid"
	// FencingExtension carries the group lock's fencing token (decimal) on
	// the input a grouped worker sees and on each of its outputs, so that
	// downstream services can refuse a stale holder.
	FencingExtension = publish.FencingExtension
	// Dead-letter extensions, added to the original event on "<topic>-dead".
	DeadLetterReasonExtension    = deadletter.ReasonExtension
	DeadLetterAttemptsExtension  = deadletter.AttemptsExtension
	DeadLetterErrorExtension     = deadletter.ErrorExtension
	DeadLetterWorkerExtension    = deadletter.WorkerExtension
	DeadLetterTruncatedExtension = deadletter.TruncatedExtension
)

// ControlExtension reports whether k is one of WorkManager's own control
// extensions — the fencing token, the replay marker
// (deadletter.ReplayExtension, "workmanagerreplay") and any other
// "workmanager…" name, the dead-letter extensions ("deadletter…") —,
// which only the node sets: a worker's output never carries one it wrote
// itself (a forged replay marker would make the other workers of the
// target topic skip the event, a forged token would pass downstream as a
// group's). The node sets fencingtoken on a grouped worker's outputs.
func ControlExtension(k string) bool {
	return k == FencingExtension || strings.HasPrefix(k, "workmanager") || strings.HasPrefix(k, "deadletter")
}

// DeadLetterSuffix names a topic's dead-letter topic: "<topic>-dead".
const DeadLetterSuffix = deadletter.TopicSuffix

// maxErrorText bounds the error text carried by dead letters and events.
const maxErrorText = 1024

// Deps are the services the hot path uses.
type Deps struct {
	Sub         Subscriber
	Pub         publish.Publisher
	Events      *lifecycleevents.Emitter // worker errors and dead letters (nil: none)
	Records     *delivery.Store
	Locks       *grouplock.Locks
	DeadLetters *deadletter.Store
	// Metrics receives the hot path's metrics (nil: metrics.New(nil),
	// counted but registered nowhere).
	Metrics *metrics.Metrics
	// TracerProvider, when set, traces every attempt of a worker at a
	// message as a span that continues the input's W3C trace context (its
	// traceparent and tracestate extensions) and is carried on by the
	// outputs. nil: no tracing, and nothing on the hot path pays for it.
	TracerProvider trace.TracerProvider
	// Propagator reads and writes the trace context (nil with a
	// TracerProvider: W3C Trace Context).
	Propagator propagation.TextMapPropagator
	// WorkerStats counts each worker's attempts, failures and dead
	// letters for GetWorker (nil: not counted); its Run writes them.
	WorkerStats *workerstats.Recorder
	// Peers, when set, sends a grouped worker's turn to the node that
	// holds its group (forward.go; nil: every turn takes the lock here).
	Peers Forwarder
}

// serving reports whether the node may serve messages now (Config.Serving).
func (d *Dispatcher) serving() bool { return d.cfg.Serving == nil || d.cfg.Serving() }

// Worker identifies a worker to the hot path.
type Worker struct {
	ID string
	// Name is the worker's unique name ("" when it has none): its events
	// and metrics carry it next to ID.
	Name  string
	Topic string
	Group string
	// GroupKey names the CloudEvent attribute or extension whose value
	// keys Group's lock (grouplock.KeyedName); "" or an event without it:
	// the whole group's lock.
	GroupKey string
	// Tenant owns the worker ("" or tenant.Default: the default tenant):
	// its group is locked per tenant (grouplock.Name).
	Tenant string
	// MaxAttempts and RetryBackoff override the cluster defaults when set.
	MaxAttempts  int
	RetryBackoff time.Duration
	// AllowedOutputs are the topics its outputs may go to
	// (internal/workerpolicy); empty: any but the reserved ones and Topic.
	AllowedOutputs []string
	// TopicPrefix confines its outputs to its tenant's topics ("" for any).
	TopicPrefix string
	// Engine names the engine that runs it, for its metrics' engine label.
	Engine string
}

// Equal reports whether w and o are the same worker with the same settings.
func (w Worker) Equal(o Worker) bool {
	return w.ID == o.ID && w.Name == o.Name && w.Topic == o.Topic && w.Group == o.Group && w.GroupKey == o.GroupKey && w.Tenant == o.Tenant && w.Engine == o.Engine && w.MaxAttempts == o.MaxAttempts &&
		w.RetryBackoff == o.RetryBackoff && slices.Equal(w.AllowedOutputs, o.AllowedOutputs) && w.TopicPrefix == o.TopicPrefix
}

// Dispatcher routes messages from topic streams to attached workers.
type Dispatcher struct {
	log *slog.Logger
	Deps
	cfg Config
	ctx context.Context

	// closing counts instances closing in the background (a swap's old
	// one, a stopped worker's); DetachAll waits for them.
	closing sync.WaitGroup

	mu         sync.Mutex
	topics     map[string]*topic
	workers    map[string]*worker
	unrunnable map[string]Worker // catalog says running, this node cannot run it
	// held are the unrunnable workers (by id) that keep their topic
	// subscribed although no worker of it is attached (Hold).
	held map[string]bool

	draining atomic.Bool
	inflight atomic.Int64 // messages received and not yet acked
	stats    counters

	tracer trace.Tracer // nil: tracing off
	// letters stores, publishes and announces dead letters.
	letters *deadletter.Sender
}

type counters struct {
	processed, failed, deadLettered, staleRefused, duplicates, deferred, panics atomic.Int64
}

// New returns a Dispatcher whose streams and calls live until ctx ends. ctx
// should outlive the process's shutdown signal: Drain lets in-flight calls
// finish first, and only cancelling ctx cuts them off.
func New(ctx context.Context, log *slog.Logger, deps Deps, cfg Config) *Dispatcher {
	if cfg.MaxConcurrency <= 0 {
		cfg.MaxConcurrency = 1
	}
	if cfg.QueueDepth <= 0 {
		cfg.QueueDepth = 2 * cfg.MaxConcurrency
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.MaxEventBytes <= 0 {
		cfg.MaxEventBytes = 1 << 20
	}
	if cfg.MaxOutputs <= 0 {
		cfg.MaxOutputs = 100
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = cfg.MaxEventBytes
	}
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = 2 * time.Minute
	}
	if cfg.RecordSaveRetry <= 0 {
		cfg.RecordSaveRetry = 5 * time.Second
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
	if deps.Metrics == nil {
		deps.Metrics = metrics.New(nil)
	}
	d := &Dispatcher{
		log: log, Deps: deps, cfg: cfg, ctx: ctx,
		topics: map[string]*topic{}, workers: map[string]*worker{}, unrunnable: map[string]Worker{}, held: map[string]bool{},
	}
	d.letters = &deadletter.Sender{Store: deps.DeadLetters, Pub: deps.Pub, Events: deps.Events, Log: log}
	if deps.TracerProvider != nil {
		d.tracer = deps.TracerProvider.Tracer("github.com/virtufin/workmanager/internal/dispatch")
		if d.Propagator == nil {
			d.Propagator = propagation.TraceContext{}
		}
	}
	d.Metrics.SetInFlight(d.inflight.Load)
	d.Metrics.SetQueues(d.queues)
	return d
}

// queues reports the length of every attached worker's queue (read when
// the metrics are scraped).
func (d *Dispatcher) queues() []metrics.Queue {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]metrics.Queue, 0, len(d.workers))
	for _, w := range d.workers {
		out = append(out, metrics.Queue{Worker: w.ID, Name: w.Name, Engine: w.Engine, Length: len(w.queue)})
	}
	return out
}

type topic struct {
	name    string
	m       *metrics.Topic
	sources sourceCache // used only by the topic's stream goroutine
	workers atomic.Pointer[[]*worker]
	// unrunnable are the workers on this topic that this node cannot run.
	unrunnable atomic.Pointer[[]Worker]
	cancel     context.CancelFunc
	done       chan struct{}
	// subscribed: daprd confirmed the stream and it has not failed since.
	subscribed atomic.Bool
	// pending counts its messages in flight (received, not answered);
	// closing: its last worker left, so it answers what arrives with RETRY
	// and its stream closes once pending reaches 0 (closeTopic).
	pending atomic.Int64
	closing atomic.Bool

	mu       sync.Mutex
	inflight map[string]*message // by event id
}

type worker struct {
	Worker
	m      *metrics.Worker
	stats  *workerstats.Counter
	source types.URIRef
	// lock is its group's lock name, tenant included (grouplock.Name);
	// "" without a group.
	lock  string
	inst  atomic.Pointer[instance]
	queue chan job
	// taken counts the jobs taken from queue; stalledAt is taken + 1 as
	// it was when an offer last waited in vain for room (0: never): while
	// they still agree, offers do not wait (offer).
	taken, stalledAt atomic.Int64
	// waiting counts the offers waiting for room in queue (tests).
	waiting atomic.Int32

	mu     sync.RWMutex // closed and sends to queue
	closed bool
	// stopCtx is cancelled when the worker is stopped (stop); stopped is
	// its Done channel.
	stopCtx context.Context
	stopNow context.CancelFunc
	stopped <-chan struct{}
	wg      sync.WaitGroup
	// giveBack: its calls carry stopped as their give-back channel
	// (engines.WithGiveBack): more of them run at once than the default,
	// and those still waiting inside the engine come back at a stop.
	giveBack bool

	// spanName and spanAttrs start its spans (set when tracing is on).
	spanName  string
	spanAttrs []attribute.KeyValue
}

// instance guards one engine instance so that it is closed only after its
// in-flight calls returned (hot reload never drops or tears a call).
type instance struct {
	engines.Instance
	// lender is the Instance when it lends its outputs (engines.Lender):
	// a call's outputs are then published from the worker's own memory.
	lender engines.Lender
	mu     sync.RWMutex
	closed bool
}

func newInstance(inst engines.Instance) *instance {
	l, _ := inst.(engines.Lender)
	return &instance{Instance: inst, lender: l}
}

// closeInBackground closes i once its calls returned, without waiting:
// a swap's old instance and a stopped worker's (whose calls have
// returned: stop). A worker process's exit — its sandbox's teardown — was
// most of a stop's time in the node (Python 2.5 ms, .NET 5-7 ms), and no
// message runs in it any more; DetachAll (node shutdown) waits for every
// close. Close is given instanceCloseBound: an engine's Close that waits
// for a call it abandoned (an in-process native call still in native code
// past its deadline) then returns its error, which is logged.
func (d *Dispatcher) closeInBackground(i *instance) {
	d.closing.Add(1)
	go func() {
		defer d.closing.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), instanceCloseBound)
		defer cancel()
		i.closeWhenIdle(ctx, d.log)
	}()
}

// instanceCloseBound bounds a background close: as long as a stop's
// Apply activity (workflows.ApplyTimeout) waited for it when the stop
// closed the instance itself.
var instanceCloseBound = 3 * time.Minute

func (i *instance) closeWhenIdle(ctx context.Context, log *slog.Logger) {
	i.mu.Lock()
	i.closed = true
	i.mu.Unlock()
	if err := i.Close(ctx); err != nil {
		log.Warn("closing worker instance", "err", err)
	}
}

// maxBatcherConcurrency bounds what an engines.Batcher may ask for.
const maxBatcherConcurrency = 256

// concurrency is how many of a worker's messages run at once: the
// configured default, or more for an Instance that batches the calls it
// holds (engines.Batcher), which then costs less per message, or that runs
// many at once (engines.Concurrent: async workers, extra processes). Not in
// a group: a group runs one message at a time (a keyed group one per key,
// so its keys fill batches like an ungrouped worker's messages). It is
// fixed when the worker is attached; a hot reload (same engine) keeps it.
func concurrency(def int, w Worker, inst engines.Instance) int {
	if w.Group != "" && w.GroupKey == "" {
		return def
	}
	n := def
	if b, ok := inst.(engines.Batcher); ok {
		n = max(n, min(b.CallsToFill(), maxBatcherConcurrency))
	}
	if c, ok := inst.(engines.Concurrent); ok {
		n = max(n, min(c.MaxCalls(), maxBatcherConcurrency))
	}
	return n
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
// finish on the old instance, which is then closed. A change of policy,
// group or topic replaces the worker in one step: no message of its topic
// sees the topic without it (and is acked without it) in between; what the
// old one had queued or running is given back (RETRY) for the new one.
func (d *Dispatcher) Attach(w Worker, inst engines.Instance) {
	d.mu.Lock()
	cur, attached := d.workers[w.ID]
	if attached && cur.Topic == w.Topic && cur.Worker.Equal(w) {
		// Policy and group changes need a fresh worker value (messages
		// read it without locks): swap the instance only when they are
		// equal.
		d.setUnrunnableLocked(w.ID, nil)
		old := cur.inst.Swap(newInstance(inst))
		d.mu.Unlock()
		d.closeInBackground(old)
		return
	}
	d.mu.Unlock()
	if attached {
		// Its series start over with the new worker (what the old one
		// still counts while it stops is lost).
		cur.m.Delete()
	}

	conc := concurrency(d.cfg.MaxConcurrency, w, inst)
	nw := &worker{Worker: w, source: types.URIRef{URL: url.URL{Path: "workmanager/workers/" + w.ID}}, giveBack: conc > d.cfg.MaxConcurrency,
		m: d.Metrics.Worker(w.ID, w.Name, w.Engine, w.Group, conc), stats: d.WorkerStats.Worker(w.ID),
		queue: make(chan job, d.cfg.QueueDepth)}
	nw.stopCtx, nw.stopNow = context.WithCancel(context.Background())
	nw.stopped = nw.stopCtx.Done()
	nw.inst.Store(newInstance(inst))
	if w.Group != "" {
		nw.lock = grouplock.Name(w.Tenant, w.Group)
	}
	if d.tracer != nil {
		nw.spanName, nw.spanAttrs = "worker "+w.ID, workerSpanAttrs(w)
	}
	for range conc {
		nw.wg.Add(1)
		go d.serve(nw)
	}
	d.mu.Lock()
	var (
		old      *worker
		oldTopic *topic
		oldLast  bool
	)
	if cur, ok := d.workers[w.ID]; ok {
		old, oldTopic = cur, d.topics[cur.Topic]
		if cur.Topic != w.Topic { // leaves its old topic
			oldLast = d.unlinkLocked(cur)
		}
	}
	d.workers[w.ID] = nw
	t := d.topicLocked(w.Topic)
	list := make([]*worker, 0, len(*t.workers.Load())+1)
	for _, x := range *t.workers.Load() {
		if x != old {
			list = append(list, x)
		}
	}
	list = append(list, nw)
	t.workers.Store(&list)
	// After it joined the topic's list: a message that reads the
	// unrunnable ones and then the list sees it in one of them, and a
	// hold on this topic ends without closing the stream it now uses.
	d.setUnrunnableLocked(w.ID, nil)
	d.mu.Unlock()
	if old != nil {
		d.stop(context.Background(), old, oldTopic, oldLast, false)
	}
}

// topicLocked returns the topic, subscribing to it when it is new.
func (d *Dispatcher) topicLocked(name string) *topic {
	if t, ok := d.topics[name]; ok {
		return t
	}
	ctx, cancel := context.WithCancel(d.ctx)
	t := &topic{name: name, m: d.Metrics.Topic(name), cancel: cancel, done: make(chan struct{}), inflight: map[string]*message{}}
	t.workers.Store(&[]*worker{})
	d.topics[name] = t
	d.refreshUnrunnableLocked(name)
	go d.topicLoop(ctx, t)
	return t
}

// SetUnrunnable records that the catalog runs w but this node could not
// load it: messages on its topic then wait for it (another node runs it) or
// dead-letter for it as not_runnable, instead of being acked without it.
func (d *Dispatcher) SetUnrunnable(w Worker) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, attached := d.workers[w.ID]; attached {
		return
	}
	d.setUnrunnableLocked(w.ID, &w)
}

// Unrunnable reports whether w is recorded as not runnable here (and not
// attached).
func (d *Dispatcher) Unrunnable(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.unrunnable[id]
	return ok
}

// ClearUnrunnable forgets SetUnrunnable (the worker stopped or was deleted).
func (d *Dispatcher) ClearUnrunnable(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setUnrunnableLocked(id, nil)
}

// RetainUnrunnable forgets the unrunnable workers not in keep (a reconcile
// found them gone from the catalog).
func (d *Dispatcher) RetainUnrunnable(keep map[string]bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := range d.unrunnable {
		if !keep[id] {
			d.setUnrunnableLocked(id, nil)
		}
	}
}

func (d *Dispatcher) setUnrunnableLocked(id string, w *Worker) {
	old, had := d.unrunnable[id]
	if w == nil {
		if !had {
			return
		}
		delete(d.unrunnable, id)
		d.refreshUnrunnableLocked(old.Topic)
		d.releaseLocked(id, old.Topic)
		return
	}
	d.unrunnable[id] = *w
	if had && old.Topic != w.Topic {
		d.refreshUnrunnableLocked(old.Topic)
	}
	d.refreshUnrunnableLocked(w.Topic)
}

func (d *Dispatcher) refreshUnrunnableLocked(name string) {
	t, ok := d.topics[name]
	if !ok {
		return
	}
	var list []Worker
	for _, w := range d.unrunnable {
		if w.Topic == name {
			list = append(list, w)
		}
	}
	t.unrunnable.Store(&list)
}

// Hold records w as unrunnable here (SetUnrunnable) and, unlike Park,
// keeps its topic subscribed although no worker of it is attached: no
// live node can run w (a label none has), so its messages come here and
// dead-letter as not_runnable after MaxAttempts deliveries and
// NotRunnableGrace, instead of waiting unseen in the broker. A worker
// attached under w's id is parked first. Attach, ClearUnrunnable or Park
// ends the hold.
func (d *Dispatcher) Hold(ctx context.Context, w Worker) {
	d.mu.Lock()
	if _, attached := d.workers[w.ID]; attached {
		d.mu.Unlock()
		d.Park(ctx, w)
		d.mu.Lock()
	}
	if cur, ok := d.unrunnable[w.ID]; ok && cur.Topic != w.Topic {
		d.setUnrunnableLocked(w.ID, nil) // releases its old topic's hold
	}
	d.unrunnable[w.ID] = w
	d.held[w.ID] = true
	d.topicLocked(w.Topic) // subscribes when it is not yet
	d.refreshUnrunnableLocked(w.Topic)
	d.mu.Unlock()
}

// Held reports whether w is held (Hold) here.
func (d *Dispatcher) Held(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.held[id]
}

// HeldWorkers returns the workers held here (Hold).
func (d *Dispatcher) HeldWorkers() []Worker {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Worker, 0, len(d.held))
	for id := range d.held {
		out = append(out, d.unrunnable[id])
	}
	return out
}

// releaseLocked ends id's hold on topic name; when that leaves the topic
// with neither a worker nor a hold, its stream is closed (in the
// background, once its messages in flight are answered).
func (d *Dispatcher) releaseLocked(id, name string) {
	if !d.held[id] {
		return
	}
	delete(d.held, id)
	t, ok := d.topics[name]
	if !ok || len(*t.workers.Load()) > 0 || d.heldOnLocked(name) {
		return
	}
	d.unlinkTopicLocked(t)
	go d.closeTopic(context.WithoutCancel(d.ctx), t)
}

// heldOnLocked reports whether a held worker keeps topic name subscribed.
func (d *Dispatcher) heldOnLocked(name string) bool {
	for id := range d.held {
		if d.unrunnable[id].Topic == name {
			return true
		}
	}
	return false
}

// Detach stops w, which the catalog no longer runs (stopped or deleted):
// no new message reaches it, its in-flight messages finish, messages still
// queued for it are given back, its instance is closed (right after
// Detach returns: WaitClosed), and the topic's stream is closed when w was
// the last worker on it. From then on its
// topic's messages are acked without it. Detaching an unknown worker is a
// no-op. A worker the catalog still runs is parked instead (Park).
func (d *Dispatcher) Detach(ctx context.Context, id string) {
	d.detach(ctx, id, nil)
}

// Park stops serving w here although the catalog still runs it (the node is
// fenced, or its new code cannot be loaded here): it is detached as by
// Detach and, in the same step, recorded as unrunnable here (SetUnrunnable),
// so that no message of its topic is acked on this node without it — what
// was queued or running for it, and what arrives later, is given back
// (RETRY, or dead-lettered as not_runnable after NotRunnableGrace) for a
// node that runs it. Attach or ClearUnrunnable ends it.
func (d *Dispatcher) Park(ctx context.Context, w Worker) {
	d.detach(ctx, w.ID, &w)
}

func (d *Dispatcher) detach(ctx context.Context, id string, park *Worker) {
	d.mu.Lock()
	if park != nil {
		if old, ok := d.unrunnable[id]; ok && old.Topic != park.Topic {
			d.setUnrunnableLocked(id, nil)
		}
		// Before it leaves the topic's list: a message that reads the list
		// and then the unrunnable ones sees it in one of them.
		d.unrunnable[id] = *park
		d.refreshUnrunnableLocked(park.Topic)
		d.releaseLocked(id, park.Topic)
	}
	w, ok := d.workers[id]
	if !ok {
		d.mu.Unlock()
		return
	}
	t := d.topics[w.Topic]
	last := d.unlinkLocked(w)
	d.mu.Unlock()
	d.stop(ctx, w, t, last, true)
}

// unlinkLocked takes w off the dispatcher and its topic, and reports
// whether it was the topic's last worker (its stream is then closed).
func (d *Dispatcher) unlinkLocked(w *worker) bool {
	if d.workers[w.ID] == w {
		delete(d.workers, w.ID)
	}
	t := d.topics[w.Topic]
	var list []*worker
	for _, x := range *t.workers.Load() {
		if x != w {
			list = append(list, x)
		}
	}
	t.workers.Store(&list)
	if len(list) > 0 || d.heldOnLocked(w.Topic) {
		return false
	}
	d.unlinkTopicLocked(t)
	return true
}

// unlinkTopicLocked takes t, left without workers and holds, off the
// dispatcher; the caller closes its stream (closeTopic).
func (d *Dispatcher) unlinkTopicLocked(t *topic) {
	delete(d.topics, t.name)
	// Its stream stays open until the messages in flight are answered
	// (stop, closeTopic): their acks travel on it.
	t.closing.Store(true)
	// Under d.mu: a topic of the same name subscribed again gets
	// fresh series (what the old stream still counts is lost).
	t.m.Delete()
}

// topicCloseWait bounds how long a topic whose last worker left keeps its
// stream open for the answers of its messages in flight.
const topicCloseWait = 10 * time.Second

// closeTopic closes t's stream once its messages in flight were answered
// (or topicCloseWait passed, or ctx ended), and waits for its loop to end.
// Closing it at once made the answers of a stop's or a move's last
// messages fail ("SendMsg called after CloseSend") and the broker deliver
// them again after its processing timeout (chaos soak, issue 45).
func (d *Dispatcher) closeTopic(ctx context.Context, t *topic) {
	wait := time.NewTimer(topicCloseWait)
	defer wait.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for t.pending.Load() > 0 {
		select {
		case <-tick.C:
			continue
		case <-wait.C:
			d.log.Warn("topic left with messages still unanswered: closing its stream (the broker redelivers them)", "topic", t.name, "in_flight", t.pending.Load())
		case <-ctx.Done():
		}
		break
	}
	t.cancel()
	select {
	case <-t.done:
	case <-ctx.Done():
	}
}

// stop ends a worker taken off its topic: its in-flight messages finish,
// its queued ones are given back, its instance is closed (in the
// background: closeInBackground); when it was the
// last on t, stop waits for t's stream to end. deleteMetrics drops its
// series (not when a new worker of the same id has them already).
func (d *Dispatcher) stop(ctx context.Context, w *worker, t *topic, last, deleteMetrics bool) {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.stopNow()
	w.wg.Wait()
	for {
		select {
		case j := <-w.queue: // never started: not an attempt
			j.r.outcome = outcomeCut
			d.leave(j.m)
			continue
		default:
		}
		break
	}
	d.closeInBackground(w.inst.Load())
	if deleteMetrics {
		w.m.Delete()
	}
	if last {
		d.closeTopic(ctx, t)
	}
}

// DetachAll detaches every worker (node shutdown) and waits until every
// instance, also those closing in the background, is closed.
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
	d.WaitClosed(ctx)
}

// WaitClosed waits until the instances closing in the background (a
// swap's old one, a detached worker's) are closed, or ctx ends.
func (d *Dispatcher) WaitClosed(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		d.closing.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Drain stops taking new messages (each one received from now on is given
// back at once for another node) and waits until every message in flight
// was processed and acked, or ctx ends. It reports whether all finished.
// Streams stay open so that the acks reach the broker; cancelling the
// dispatcher's context afterwards cuts off what is still running.
func (d *Dispatcher) Drain(ctx context.Context) bool {
	d.draining.Store(true)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for d.inflight.Load() > 0 {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// Stats are hot-path counters since start.
type Stats struct {
	Workers, Topics int
	// Processed and Failed count messages acked SUCCESS and RETRY.
	Processed, Failed int64
	// DeadLettered counts dead letters published.
	DeadLettered int64
	// StaleRefused counts outputs refused because the group lock they were
	// produced under had been taken over (a stale fencing token).
	StaleRefused int64
	// Duplicates counts deliveries of an event already in flight here.
	Duplicates int64
	// Deferred counts (message, worker) pairs given back because the
	// worker's queue was full or its retry backoff had not passed.
	Deferred int64
	// Panics counts recovered panics on the hot path.
	Panics int64
}

// Stats returns the current counters.
func (d *Dispatcher) Stats() Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := &d.stats
	return Stats{Workers: len(d.workers), Topics: len(d.topics), Processed: s.processed.Load(), Failed: s.failed.Load(),
		DeadLettered: s.deadLettered.Load(), StaleRefused: s.staleRefused.Load(), Duplicates: s.duplicates.Load(),
		Deferred: s.deferred.Load(), Panics: s.panics.Load()}
}

// Subscribed reports whether this node holds a confirmed subscription to
// topic (a worker of it attached, daprd's answer in).
func (d *Dispatcher) Subscribed(topic string) bool {
	d.mu.Lock()
	t, ok := d.topics[topic]
	d.mu.Unlock()
	return ok && t.subscribed.Load()
}
