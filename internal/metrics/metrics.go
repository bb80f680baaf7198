// Package metrics defines the Prometheus metrics of a node (all named
// workmanager_…, served at /metrics by cmd/worker) and the handles the hot
// path keeps to update them cheaply.
//
// The hot path never looks a metric up by its labels per message: Worker
// and Topic hold the children of their labels, created once when the
// worker is attached or the topic subscribed, and the counters of the
// per-reason metrics (failures, dead letters) are created on their first
// use and kept. Labels are bounded: worker ids, engine names, topics,
// groups and fixed reason texts; never event ids or error texts.
//
// A worker's series are deleted when it is detached (stopped, deleted,
// moved to another topic, group or output policy), a topic's when the node
// stops subscribing to it: so a node that serves changing workers does
// not keep the series of the ones it no longer serves. A worker attached
// again starts its counters at zero (rate() and increase() treat that as a
// counter reset). Group-lock series are kept for the life of the process
// (groups are shared by workers and few).
//
// docs/operating.md lists every metric.
package metrics

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/virtufin/workmanager/internal/grouplock"
)

// Namespace prefixes every metric of this package.
const Namespace = "workmanager"

// Label names.
const (
	LabelWorker = "worker_id"
	// LabelWorkerName is the worker's name next to its id ("" when it has
	// none; one name per id for ever, so it adds no series).
	LabelWorkerName = "worker_name"
	LabelEngine     = "engine"
	LabelReason     = "reason"
	LabelTopic      = "topic"
	LabelGroup      = "group"
	LabelStatus     = "status"
	LabelOp         = "op"
	LabelResult     = "result"
)

// LatencyBuckets are the buckets (seconds) of the latency histograms: from
// half a millisecond to a minute (WORKER_TIMEOUT is 30 s by default).
var LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// Metrics are a node's metrics, registered on one registry. A nil
// *Metrics is not usable; tests that do not look at metrics pass New(nil).
type Metrics struct {
	// Per worker: worker_id, worker_name, engine.
	received, succeeded, outputs, queueRejections *prometheus.CounterVec
	failed, deadLettered                          *prometheus.CounterVec // + reason
	processing, queueWait                         *prometheus.HistogramVec
	inFlight, concurrency                         *prometheus.GaugeVec

	// Per topic.
	handling          *prometheus.HistogramVec // topic, status
	topicDeadLettered *prometheus.CounterVec   // topic, reason
	reconnects        *prometheus.CounterVec   // topic

	// Node.
	messagesInFlight prometheus.GaugeFunc
	inFlightSource   atomic.Pointer[func() int64]
	infraDropped     prometheus.CounterFunc
	infraDropSource  atomic.Pointer[func() int64]
	queues           *queueCollector
	recordSeconds    *prometheus.HistogramVec // op
	recordErrors     *prometheus.CounterVec   // op

	// Group locks: group.
	lockAcquisitions, lockContentions, lockThefts, lockTheftsAborted, lockStaleRefused, lockForwarded *prometheus.CounterVec
	lockWait                                                                                          *prometheus.HistogramVec

	// Engines: engine, reason.
	restarts, restartFailures *prometheus.CounterVec

	// Recovery.
	recoveryDuration prometheus.Gauge
	recoveries       *prometheus.CounterVec // result
}

// New creates the metrics and registers them on reg (nil: registered
// nowhere, e.g. in tests that do not read them). It panics when reg
// already holds metrics of the same names (a programming error).
func New(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	}
	histogram := func(name, help string, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: LatencyBuckets}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	}
	w := []string{LabelWorker, LabelWorkerName, LabelEngine}
	wr := []string{LabelWorker, LabelWorkerName, LabelEngine, LabelReason}
	m := &Metrics{
		received:        counter("worker_messages_received_total", "Attempts a worker began: messages it took from its queue to process.", w...),
		succeeded:       counter("worker_messages_processed_total", "Attempts that succeeded: the engine returned and every output was published.", w...),
		failed:          counter("worker_messages_failed_total", "Failed attempts, by the reason the hot path gave them (the lifecycle error event's error_type).", wr...),
		deadLettered:    counter("worker_messages_dead_lettered_total", "Messages sent to <topic>-dead for a worker once its attempts were used up, by reason.", wr...),
		outputs:         counter("worker_outputs_published_total", "Output events a worker's calls published.", w...),
		queueRejections: counter("worker_queue_rejections_total", "Messages given back for a worker because its queue stayed full for WORKER_QUEUE_WAIT.", w...),
		processing:      histogram("worker_processing_seconds", "Duration of the engine call of one attempt (the worker's code), failed or not.", w...),
		queueWait:       histogram("worker_queue_wait_seconds", "Time a message waited in a worker's queue for one of its WORKER_MAX_CONCURRENCY slots.", w...),
		inFlight:        gauge("worker_in_flight", "Attempts a worker is running now.", w...),
		concurrency:     gauge("worker_concurrency_limit", "The attempts a worker may run at once (WORKER_MAX_CONCURRENCY, or more for an engine that batches calls); worker_in_flight / this is its saturation.", w...),

		handling:          histogram("message_handling_seconds", "Time from receiving a message on a topic to acking it (record read, every worker's attempt, record write), by ack status (success, retry).", LabelTopic, LabelStatus),
		topicDeadLettered: counter("topic_dead_lettered_total", "Messages sent to <topic>-dead for no worker attached here: undecodable, too_large, not_runnable, not_running.", LabelTopic, LabelReason),
		reconnects:        counter("stream_reconnects_total", "Times a topic's subscription was lost (or could not be opened) and is reopened.", LabelTopic),

		recordSeconds: histogram("delivery_record_seconds", "State round trips of delivery records: op load (read before the workers run) and update (write after).", LabelOp),
		recordErrors:  counter("delivery_record_errors_total", "Delivery-record round trips that failed (the message is redelivered), by op.", LabelOp),

		lockAcquisitions:  counter("grouplock_acquisitions_total", "Group locks taken in the store (including thefts): one per hold, which may serve a run of the group's messages (GROUP_LOCK_KEEP_FOR).", LabelGroup),
		lockContentions:   counter("grouplock_contentions_total", "Acquisitions given up because the group stayed locked for all their tries (a lock_contention attempt).", LabelGroup),
		lockThefts:        counter("grouplock_thefts_total", "Locks taken from another holder: past GROUP_LOCK_MAX_AGE_MS without a write, or whose node has gone.", LabelGroup),
		lockTheftsAborted: counter("grouplock_thefts_aborted_total", "Tries that found the lock past its max age but written under its token, so it was not stolen.", LabelGroup),
		lockStaleRefused:  counter("grouplock_stale_refused_total", "Outputs refused because the lock they were produced under had been taken over (stale fencing token).", LabelGroup),
		lockForwarded:     counter("grouplock_forwarded_total", "Attempts this node sent to the node holding their group's lock, which ran them under its lock (dispatch's forwarded turns).", LabelGroup),
		lockWait:          histogram("grouplock_acquire_seconds", "Time one attempt spent acquiring its group's lock (successful acquisitions).", LabelGroup),

		restarts:        counter("engine_process_restarts_total", "Worker processes an engine restarted after a crash or a timeout, by engine and reason.", LabelEngine, LabelReason),
		restartFailures: counter("engine_process_restart_failures_total", "Restarts whose new process could not be started (the next call tries again).", LabelEngine, LabelReason),

		recoveryDuration: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "recovery_duration_seconds",
			Help: "Duration of the node's start-up recovery (RecoveryWorkflow, then reconcile), set when it ended."}),
		recoveries: counter("recoveries_total", "Start-up recoveries that ended, by result (succeeded, failed).", LabelResult),
	}
	m.messagesInFlight = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "messages_in_flight",
		Help: "Messages received by this node and not yet acked."}, func() float64 {
		if f := m.inFlightSource.Load(); f != nil {
			return float64((*f)())
		}
		return 0
	})
	m.infraDropped = prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: "infra_events_dropped_total",
		Help: "Infrastructure events (workmanager.infra.*: group locks, node membership) dropped because their queue was full: the broker was slower than they were produced."}, func() float64 {
		if f := m.infraDropSource.Load(); f != nil {
			return float64((*f)())
		}
		return 0
	})
	m.queues = &queueCollector{desc: prometheus.NewDesc(Namespace+"_worker_queue_length",
		"Messages waiting in a worker's queue (at most WORKER_QUEUE_DEPTH).", []string{LabelWorker, LabelWorkerName, LabelEngine}, nil)}
	if reg != nil {
		reg.MustRegister(m.received, m.succeeded, m.failed, m.deadLettered, m.outputs, m.queueRejections, m.processing,
			m.queueWait, m.inFlight, m.concurrency, m.handling, m.topicDeadLettered, m.reconnects, m.recordSeconds, m.recordErrors,
			m.lockAcquisitions, m.lockContentions, m.lockThefts, m.lockTheftsAborted, m.lockStaleRefused, m.lockForwarded, m.lockWait,
			m.restarts, m.restartFailures, m.recoveryDuration, m.recoveries, m.messagesInFlight, m.infraDropped, m.queues)
	}
	return m
}

// SetInFlight makes workmanager_messages_in_flight read n (the
// dispatcher's count, read at scrape time).
func (m *Metrics) SetInFlight(n func() int64) { m.inFlightSource.Store(&n) }

// SetInfraDropped makes workmanager_infra_events_dropped_total read n
// (infraevents.Emitter.Dropped, read at scrape time).
func (m *Metrics) SetInfraDropped(n func() int64) { m.infraDropSource.Store(&n) }

// Queue is one worker's queue as SetQueues reports it.
type Queue struct {
	Worker, Name, Engine string
	Length               int
}

// SetQueues makes workmanager_worker_queue_length read the queues list
// returns (at scrape time, so that the hot path does nothing for it).
func (m *Metrics) SetQueues(list func() []Queue) { m.queues.list.Store(&list) }

type queueCollector struct {
	desc *prometheus.Desc
	list atomic.Pointer[func() []Queue]
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.list.Load()
	if f == nil {
		return
	}
	for _, q := range (*f)() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(q.Length), q.Worker, q.Name, q.Engine)
	}
}

// Worker holds the metrics of one attached worker. The exported fields are
// the children of its labels, for the hot path to update directly.
type Worker struct {
	m                *Metrics
	id, name, engine string
	group            string
	Received         prometheus.Counter
	Succeeded        prometheus.Counter
	Outputs          prometheus.Counter
	QueueRejection   prometheus.Counter
	Processing       prometheus.Observer
	QueueWait        prometheus.Observer
	InFlight         prometheus.Gauge
	// LockWait, StaleRefused and Forwarded are its group's (nil without a
	// group).
	LockWait     prometheus.Observer
	StaleRefused prometheus.Counter
	Forwarded    prometheus.Counter

	mu      sync.Mutex
	failed  map[string]prometheus.Counter
	dead    map[string]prometheus.Counter
	deleted bool
}

// Worker returns the metrics of worker id, named name ("" for none), run
// by engine, in group ("" for none), that runs at most concurrency attempts
// at once.
func (m *Metrics) Worker(id, name, engine, group string, concurrency int) *Worker {
	w := &Worker{m: m, id: id, name: name, engine: engine, group: group,
		Received: m.received.WithLabelValues(id, name, engine), Succeeded: m.succeeded.WithLabelValues(id, name, engine),
		Outputs: m.outputs.WithLabelValues(id, name, engine), QueueRejection: m.queueRejections.WithLabelValues(id, name, engine),
		Processing: m.processing.WithLabelValues(id, name, engine), QueueWait: m.queueWait.WithLabelValues(id, name, engine),
		InFlight: m.inFlight.WithLabelValues(id, name, engine),
		failed:   map[string]prometheus.Counter{}, dead: map[string]prometheus.Counter{}}
	m.concurrency.WithLabelValues(id, name, engine).Set(float64(concurrency))
	if group != "" {
		w.LockWait = m.lockWait.WithLabelValues(group)
		w.StaleRefused = m.lockStaleRefused.WithLabelValues(group)
		w.Forwarded = m.lockForwarded.WithLabelValues(group)
	}
	return w
}

// Failed counts one failed attempt for reason.
func (w *Worker) Failed(reason string) { w.child(w.failed, w.m.failed, reason).Inc() }

// DeadLettered counts one dead letter for reason.
func (w *Worker) DeadLettered(reason string) { w.child(w.dead, w.m.deadLettered, reason).Inc() }

func (w *Worker) child(cache map[string]prometheus.Counter, vec *prometheus.CounterVec, reason string) prometheus.Counter {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c, ok := cache[reason]; ok {
		return c
	}
	var c prometheus.Counter
	if w.deleted {
		// A straggler after Delete (a message settled after its worker was
		// detached): counted nowhere rather than bringing the series back.
		c = prometheus.NewCounter(prometheus.CounterOpts{Name: "detached"})
	} else {
		c = vec.WithLabelValues(w.id, w.name, w.engine, reason)
	}
	cache[reason] = c
	return c
}

// Delete removes the worker's series (it was detached). Updates through
// this Worker afterwards are lost, not exported.
func (w *Worker) Delete() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deleted = true
	clear(w.failed)
	clear(w.dead)
	l := prometheus.Labels{LabelWorker: w.id}
	for _, v := range []interface{ DeletePartialMatch(prometheus.Labels) int }{w.m.received, w.m.succeeded, w.m.failed,
		w.m.deadLettered, w.m.outputs, w.m.queueRejections, w.m.processing, w.m.queueWait, w.m.inFlight, w.m.concurrency} {
		v.DeletePartialMatch(l)
	}
}

// Topic holds the metrics of one topic the node subscribes to.
type Topic struct {
	m                 *Metrics
	name              string
	HandledSuccess    prometheus.Observer
	HandledRetry      prometheus.Observer
	Reconnects        prometheus.Counter
	RecordLoad        prometheus.Observer
	RecordUpdate      prometheus.Observer
	RecordLoadError   prometheus.Counter
	RecordUpdateError prometheus.Counter

	mu      sync.Mutex
	dead    map[string]prometheus.Counter
	deleted bool
}

// Topic returns the metrics of topic name.
func (m *Metrics) Topic(name string) *Topic {
	return &Topic{m: m, name: name,
		HandledSuccess: m.handling.WithLabelValues(name, "success"), HandledRetry: m.handling.WithLabelValues(name, "retry"),
		Reconnects: m.reconnects.WithLabelValues(name),
		RecordLoad: m.recordSeconds.WithLabelValues("load"), RecordUpdate: m.recordSeconds.WithLabelValues("update"),
		RecordLoadError: m.recordErrors.WithLabelValues("load"), RecordUpdateError: m.recordErrors.WithLabelValues("update"),
		dead: map[string]prometheus.Counter{}}
}

// DeadLettered counts one dead letter of the topic for no attached worker.
func (t *Topic) DeadLettered(reason string) {
	t.mu.Lock()
	c, ok := t.dead[reason]
	if !ok {
		if t.deleted {
			c = prometheus.NewCounter(prometheus.CounterOpts{Name: "detached"})
		} else {
			c = t.m.topicDeadLettered.WithLabelValues(t.name, reason)
		}
		t.dead[reason] = c
	}
	t.mu.Unlock()
	c.Inc()
}

// Delete removes the topic's series (the node no longer subscribes to it).
func (t *Topic) Delete() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.deleted = true
	clear(t.dead)
	l := prometheus.Labels{LabelTopic: t.name}
	t.m.handling.DeletePartialMatch(l)
	t.m.topicDeadLettered.DeletePartialMatch(l)
	t.m.reconnects.DeletePartialMatch(l)
}

// GroupLockEvent counts what a group-lock operation did
// (grouplock.Config.OnEvent).
func (m *Metrics) GroupLockEvent(e grouplock.Event) {
	switch e.Kind {
	case grouplock.EventAcquired:
		m.lockAcquisitions.WithLabelValues(e.Group).Inc()
		if e.Stolen {
			m.lockThefts.WithLabelValues(e.Group).Inc()
		}
	case grouplock.EventTheftAborted:
		m.lockTheftsAborted.WithLabelValues(e.Group).Inc()
	case grouplock.EventContended:
		m.lockContentions.WithLabelValues(e.Group).Inc()
	}
}

// EngineRestart counts one worker process an engine restarted
// (builtin.Config.OnProcessRestart); err is the restart's error.
func (m *Metrics) EngineRestart(engine, reason string, err error) {
	reason = ReasonLabel(reason)
	m.restarts.WithLabelValues(engine, reason).Inc()
	if err != nil {
		m.restartFailures.WithLabelValues(engine, reason).Inc()
	}
}

// ReasonLabel turns an engine's restart reason ("process exited", "killed
// at the deadline") into a label value ("process_exited",
// "killed_at_the_deadline"): lower case, [a-z0-9_] only, at most 40
// characters. The engines' reasons are fixed texts, so the values stay few.
func ReasonLabel(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(s)) {
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "_"):
			b.WriteByte('_')
		}
		if b.Len() >= 40 {
			break
		}
	}
	out := strings.TrimSuffix(b.String(), "_")
	if out == "" {
		return "unknown"
	}
	return out
}

// RecoveryDone records the end of the node's start-up recovery.
func (m *Metrics) RecoveryDone(d time.Duration, err error) {
	m.recoveryDuration.Set(d.Seconds())
	result := "succeeded"
	if err != nil {
		result = "failed"
	}
	m.recoveries.WithLabelValues(result).Inc()
}
