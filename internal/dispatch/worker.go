package dispatch

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/workerpolicy"
)

// CloudEvent extensions the hot path reads or writes.
const (
	// CorrelationExtension is copied from each input to its outputs.
	CorrelationExtension = "correlationid"
	// FencingExtension carries the group lock's fencing token (decimal) on
	// the input a grouped worker sees and on each of its outputs, so that
	// downstream services can refuse a stale holder.
	FencingExtension = "fencingtoken"
	// Dead-letter extensions, added to the original event on "<topic>-dead".
	DeadLetterReasonExtension   = "deadletterreason"
	DeadLetterAttemptsExtension = "deadletterattempts"
	DeadLetterErrorExtension    = "deadlettererror"
	DeadLetterWorkerExtension   = "deadletterworker"
	// DeadLetterTruncatedExtension, on a too_large dead letter, is the
	// size of the event's data, of which only the first MAX_EVENT_BYTES
	// are carried.
	DeadLetterTruncatedExtension = "deadlettertruncated"
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
const DeadLetterSuffix = "-dead"

// Dead-letter reasons (the deadletterreason extension).
const (
	reasonWorkerFailed   = "worker_failed"
	reasonTimeout        = "timeout"
	reasonLockContention = "lock_contention"
	reasonLockError      = "lock_error"
	reasonStaleLock      = "stale_lock"
	reasonPublishFailed  = "publish_failed"
	reasonPanic          = "panic"
	reasonInternal       = "internal"
	reasonUndecodable    = "undecodable"
	reasonTooLarge       = "too_large"
	reasonNotRunnable    = "not_runnable"
	reasonNotRunning     = "not_running" // a replay for a worker stopped or deleted since
	reasonOutputPolicy   = "output_policy"
	reasonOutputLimit    = "output_limit"
	reasonOutputInvalid  = "output_invalid"
	// reasonCrashed: the event was in flight in the worker at crashes of
	// the node (Config.Suspect); it is not run again.
	reasonCrashed = "crashed"
)

// maxErrorText bounds the error text carried by dead letters and events.
const maxErrorText = 1024

// offer queues m for w, waiting at most wait for room; false when w's
// queue stayed full (the message comes back later for w).
func (w *worker) offer(m *message, r *result, wait time.Duration) bool {
	w.mu.RLock() // held while waiting: Detach waits at most wait for it
	defer w.mu.RUnlock()
	if w.closed {
		r.outcome = outcomeCut
		return true
	}
	m.wg.Add(1)
	j := job{m: m, r: r}
	select {
	case w.queue <- j:
		return true
	default:
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case w.queue <- j:
			return true
		case <-t.C:
		}
	}
	m.wg.Done()
	return false
}

// serve is one of a worker's MaxConcurrency goroutines.
func (d *Dispatcher) serve(w *worker) {
	defer w.wg.Done()
	for {
		select {
		case j := <-w.queue:
			// select picks at random among ready cases: a detached
			// worker must not go on taking its queue (Detach would wait
			// for every queued call), so stopped is checked again.
			select {
			case <-w.stopped:
				j.r.outcome = outcomeCut
				j.m.wg.Done()
				return
			default:
			}
			if !d.serving() { // see run: given back, not an attempt
				j.r.outcome = outcomeCut
				j.m.wg.Done()
				continue
			}
			start := time.Now()
			w.m.QueueWait.Observe(seconds(j.r.queued, monoOf(start)))
			w.m.Received.Inc()
			w.m.InFlight.Inc()
			d.handle(w, j.m, j.r, start)
			w.m.InFlight.Dec()
			j.m.wg.Done()
		case <-w.stopped:
			return
		}
	}
}

// handle makes one attempt of w at m: take the group lock when w has a
// group (renewed until the attempt ends), run the engine, publish the outputs (each checked against the
// lock's fencing token first), release the lock. A panic anywhere in it is
// a failed attempt of w. start is when the attempt began.
func (d *Dispatcher) handle(w *worker, m *message, r *result, start time.Time) {
	var (
		span    trace.Span // nil: tracing off
		outputs int
	)
	defer func() {
		if p := recover(); p != nil {
			d.stats.panics.Add(1)
			d.log.Error("panic while processing a message", append([]any{"worker_id", w.ID, "event_id", m.id, "panic", p,
				"stack", string(debug.Stack())}, logAttrs(m, r.trace)...)...)
			r.outcome, r.reason, r.err = outcomeFailed, reasonPanic, fmt.Errorf("panic: %v", p)
		}
		if span != nil {
			d.endSpan(span, r, outputs)
		}
	}()
	ctx := d.ctx
	if d.tracer != nil {
		ctx, span = d.startSpan(ctx, w, m, r)
	}
	in := &m.ev
	var lease *grouplock.Lease
	if w.Group != "" {
		var err error
		lease, err = d.acquire(ctx, w, w.lockFor(m))
		if err != nil {
			r.outcome, r.reason, r.err = outcomeFailed, reasonLockError, err
			switch {
			case errors.Is(err, grouplock.ErrContended):
				r.reason = reasonLockContention
			case ctx.Err() != nil || w.isStopped():
				// Stopped (or moved away) while waiting for the lock: said
				// below, not a store error.
			default:
				// The store failed under the lock: not the worker's
				// failure, and not an attempt (a flapping store must not
				// dead-letter grouped messages); given back.
				r.outcome = outcomeDeferred
				d.log.Warn("group lock not taken: state store error; the message is given back, not counted as an attempt",
					append([]any{"group", w.Group, "worker_id", w.ID, "err", err}, logAttrs(m, r.trace)...)...)
			}
			if ctx.Err() != nil || w.isStopped() {
				r.outcome = outcomeCut // stopped while waiting: given back, not an attempt
				d.log.Debug("worker stopped while its message waited for the group lock: given back", "group", w.Group, "worker_id", w.ID)
			}
			return
		}
		// Renewed while the call and its publishing run, so a call longer
		// than GROUP_LOCK_MAX_AGE keeps its lock; a renewal that finds the
		// lock taken makes every later Check (the gateway's, the outputs')
		// refuse. Release stops the renewals.
		lease.KeepAlive(ctx)
		defer func() {
			if err := lease.Release(context.WithoutCancel(ctx)); err != nil {
				d.log.Warn("group lock not released after retries; this node takes it back on its next message of the group, other nodes once it leaves the cluster membership or after 10 × GROUP_LOCK_MAX_AGE_MS (GROUP_LOCK_MAX_AGE_MS if nothing was published under it)",
					append([]any{"group", w.Group, "worker_id", w.ID, "err", err}, logAttrs(m, r.trace)...)...)
			}
		}()
		in = withExtension(m, FencingExtension, strconv.FormatInt(lease.Token, 10))
		ctx = engines.WithFence(ctx, &engines.Fence{Group: lease.Group, Token: lease.Token, Check: lease.Check})
		locked := time.Now()
		w.m.LockWait.Observe(locked.Sub(start).Seconds())
		start = locked
	}
	if d.cfg.PanicOn != "" {
		if _, ok := m.ec.Extensions[d.cfg.PanicOn]; ok {
			panic("injected by the " + d.cfg.PanicOn + " test hook")
		}
	}
	if w.giveBack {
		ctx = engines.WithGiveBack(ctx, w.stopped)
	}
	outs, err := w.process(ctx, in)
	w.m.Processing.Observe(time.Since(start).Seconds())
	if err != nil {
		d.fail(r, err)
		return
	}
	// Every output is checked before any is published: a call is
	// published whole or not at all.
	if reason, err := d.checkOutputs(w, m, outs); err != nil {
		r.outcome, r.reason, r.err = outcomeFailed, reason, err
		return
	}
	if !d.serving() {
		// Lost the cluster membership during the call (paused, store
		// unreachable): a stop may have been announced meanwhile, so
		// nothing is published; the message comes back (see run).
		r.outcome = outcomeCut
		return
	}
	if lease != nil && len(outs) > 0 {
		// The call is over: the group's next call on this node may start
		// while these outputs go out (the hold stays this node's until
		// they have), after those of the group's earlier calls.
		lease.Yield(ctx)
		if err := lease.Turn(ctx); err != nil {
			r.outcome = outcomeCut // shutting down: given back
			return
		}
	}
	var tp, ts string
	if span != nil {
		tp, ts = d.traceContext(ctx)
	} else {
		tp, ts = inputTraceContext(m) // tracing off: pass the input's on, or start one
	}
	for i := range outs {
		o := &outs[i]
		setTraceContext(o, tp, ts)
		if lease != nil && !d.cfg.UnsafeNoFencing {
			if err := lease.Check(ctx); err != nil {
				if errors.Is(err, grouplock.ErrStale) {
					d.stats.staleRefused.Add(1)
					w.m.StaleRefused.Inc()
					r.outcome, r.reason, r.err = outcomeFailed, reasonStaleLock, fmt.Errorf("output %d refused: %w", i, err)
					return
				}
				// A store error while checking: not an attempt, as above
				// (the outputs before this one went out, and go out again).
				r.outcome, r.reason, r.err = outcomeDeferred, reasonLockError, err
				return
			}
		}
		if lease != nil {
			o.SetExtension(FencingExtension, strconv.FormatInt(lease.Token, 10))
		}
		if err := d.Pub.Publish(ctx, o.Type(), o); err != nil {
			r.outcome, r.reason, r.err = outcomeFailed, reasonPublishFailed, err
			return
		}
		w.m.Outputs.Inc()
		outputs++
	}
	r.outcome = outcomeDone
}

// acquire takes w's group lock for one message. A stop of w ends the wait
// (for the group's local slot, held by w's other messages, or for the
// store): a stop returns within about one message's time, not one per
// message waiting for the group, and those come back later. A lock won as
// the stop comes is given back at once: after a stop no message starts.
func (d *Dispatcher) acquire(ctx context.Context, w *worker, lock string) (*grouplock.Lease, error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-w.stopped:
			cancel()
		case <-actx.Done():
		}
	}()
	lease, err := d.Locks.Acquire(actx, lock, d.cfg.NodeID+"/"+w.ID)
	if err == nil && w.isStopped() {
		if rerr := lease.Release(context.WithoutCancel(ctx)); rerr != nil {
			d.log.Warn("group lock not released", "group", w.Group, "worker_id", w.ID, "err", rerr)
		}
		return nil, fmt.Errorf("worker %s stopped: %w", w.ID, context.Canceled)
	}
	return lease, err
}

// lockFor is the lock m takes for w: its group's, or, for a keyed group,
// the key's (grouplock.KeyedName) when m carries the key's attribute.
func (w *worker) lockFor(m *message) string {
	if w.GroupKey == "" {
		return w.lock
	}
	if k := eventAttribute(&m.ev, w.GroupKey); k != "" {
		return grouplock.KeyedName(w.lock, k)
	}
	return w.lock
}

// eventAttribute is the value of a CloudEvent's context attribute or extension
// name, as text ("" when absent).
func eventAttribute(ev *event.Event, name string) string {
	switch name {
	case "id":
		return ev.ID()
	case "source":
		return ev.Source()
	case "type":
		return ev.Type()
	case "subject":
		return ev.Subject()
	case "dataschema":
		return ev.DataSchema()
	case "datacontenttype":
		return ev.DataContentType()
	case "specversion":
		return ev.SpecVersion()
	case "time":
		if t := ev.Time(); !t.IsZero() {
			return t.UTC().Format(time.RFC3339Nano)
		}
		return ""
	}
	v, ok := ev.Extensions()[name]
	if !ok || v == nil {
		return ""
	}
	s, err := types.ToString(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return s
}

// isStopped reports whether w was detached.
func (w *worker) isStopped() bool {
	select {
	case <-w.stopped:
		return true
	default:
		return false
	}
}

// fail classifies an engine error.
func (d *Dispatcher) fail(r *result, err error) {
	r.outcome, r.err = outcomeFailed, err
	switch {
	case errors.Is(err, engines.ErrClosed) || errors.Is(err, engines.ErrGivenBack) || d.ctx.Err() != nil:
		// Stopped or reloaded mid-call, or given back before it started:
		// not the worker's fault.
		r.outcome = outcomeCut
	case errors.Is(err, engines.ErrTimeout):
		r.reason = reasonTimeout
	case errors.Is(err, engines.ErrReplyTooLarge):
		// The engine refused the reply while reading it: the outputs are
		// over the node's limits, like those checkOutputs refuses.
		r.reason = reasonOutputLimit
	case errors.Is(err, engines.ErrInvalidOutput):
		// Returned, but with outputs that cannot be published: the same
		// input returns them again (retryCannotFix).
		r.reason = reasonOutputInvalid
	case errors.Is(err, engines.ErrWorkerFailed):
		r.reason = reasonWorkerFailed
	default:
		r.reason = reasonInternal
	}
}

// withExtension returns m's event with one more extension, without
// changing m's (other workers read it concurrently).
func withExtension(m *message, k string, v any) *event.Event {
	ec := m.ec
	ec.Extensions = maps.Clone(m.ec.Extensions)
	if ec.Extensions == nil {
		ec.Extensions = map[string]any{}
	}
	ec.Extensions[k] = v
	ev := m.ev
	ev.Context = &ec
	return &ev
}

// checkOutputs completes every output (id, source, correlation id) and
// holds them to the worker's output policy and the node's output limits;
// a refusal is the worker's failure, with the rule's name in the error.
func (d *Dispatcher) checkOutputs(w *worker, m *message, outs []event.Event) (string, error) {
	if n := len(outs); n > d.cfg.MaxOutputs {
		return reasonOutputLimit, fmt.Errorf("%w: %d outputs, more than MAX_OUTPUTS_PER_MESSAGE %d", engines.ErrWorkerFailed, n, d.cfg.MaxOutputs)
	}
	idBase := ""
	if len(outs) > 0 {
		idBase = outputIDBase(m.id)
	}
	for i := range outs {
		o := &outs[i]
		if err := d.completeOutput(w, m, o, i, idBase); err != nil {
			return reasonOutputInvalid, err
		}
		if err := workerpolicy.CheckOutput(w.TopicPrefix, w.AllowedOutputs, w.Topic, o.Type()); err != nil {
			return reasonOutputPolicy, fmt.Errorf("%w: output %d: %w", engines.ErrWorkerFailed, i, err)
		}
		if n := len(o.DataEncoded); n > d.cfg.MaxOutputBytes {
			return reasonOutputLimit, fmt.Errorf("%w: output %d: %d bytes of data, more than MAX_OUTPUT_BYTES %d", engines.ErrWorkerFailed, i, n, d.cfg.MaxOutputBytes)
		}
		if n := attributesSize(o.Context.(*event.EventContextV1), MaxOutputAttributeBytes); n > MaxOutputAttributeBytes {
			return reasonOutputLimit, fmt.Errorf("%w: output %d: its attributes and extensions take %d bytes or more, more than %d", engines.ErrWorkerFailed, i, n, MaxOutputAttributeBytes)
		}
	}
	return "", nil
}

// MaxOutputAttributeBytes bounds an output's attributes and extensions
// (its encoded size beyond its data, as the reply limit allows for it),
// the input's correlation id included.
const MaxOutputAttributeBytes = engines.ReplyOutputOverhead

// urlSize is about the length of u as a string (without building it).
func urlSize(u *url.URL) int {
	n := len(u.Scheme) + len(u.Opaque) + len(u.Host) + len(u.Path) + len(u.RawPath) + len(u.RawQuery) + len(u.Fragment) + len(u.RawFragment) + 8
	if u.User != nil {
		n += len(u.User.String())
	}
	return n
}

// attributesSize is about the size of ec's attributes and extensions as
// they are published; it stops counting above limit.
func attributesSize(ec *event.EventContextV1, limit int) int {
	const perAttribute = 6                                                         // quotes, colon, comma
	n := len(ec.ID) + len(ec.Type) + urlSize(&ec.Source.URL) + 5*perAttribute + 40 // specversion, time
	if ec.Subject != nil {
		n += len(*ec.Subject) + perAttribute
	}
	if ec.DataContentType != nil {
		n += len(*ec.DataContentType) + perAttribute
	}
	if ec.DataSchema != nil {
		n += urlSize(&ec.DataSchema.URL) + perAttribute
	}
	for k, v := range ec.Extensions {
		if n > limit {
			break
		}
		n += len(k) + perAttribute
		switch v := v.(type) {
		case string:
			n += len(v)
		case []byte:
			n += base64.StdEncoding.EncodedLen(len(v))
		default:
			s, _ := types.Format(v)
			n += len(s)
		}
	}
	return n
}

// completeOutput fills an output's defaults (id derived from the input's
// id (idBase: outputIDBase, a hash of a long id) and source, so a
// redelivery yields the same ids and two inputs with one id from two
// sources do not; source naming the worker), drops the
// control extensions the worker wrote (ControlExtension) and sets its
// correlation id: the input's, copied when present and absent when absent.
func (d *Dispatcher) completeOutput(w *worker, m *message, o *event.Event, i int, idBase string) error {
	if o.Context == nil {
		return fmt.Errorf("%w: %w: output %d is empty", engines.ErrWorkerFailed, engines.ErrInvalidOutput, i)
	}
	oc, ok := o.Context.(*event.EventContextV1)
	if !ok {
		oc = o.Context.AsV1()
		o.Context = oc
	}
	if oc.Type == "" {
		return fmt.Errorf("%w: %w: output %d has no type", engines.ErrWorkerFailed, engines.ErrInvalidOutput, i)
	}
	if oc.ID == "" {
		oc.ID = idBase + "/" + w.ID + "/" + strconv.Itoa(i) + "/" + m.srcTag
	}
	if oc.Source.URL == (url.URL{}) {
		oc.Source = w.source
	}
	for k := range oc.Extensions {
		if ControlExtension(k) { // only the node sets them (fencingtoken, below)
			delete(oc.Extensions, k)
		}
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

// workerError logs a failed attempt and publishes one error lifecycle
// event for it.
func (d *Dispatcher) workerError(ctx context.Context, w *worker, m *message, r *result, attempt, limit int) {
	msg := d.publicText(fmt.Sprint(r.err))
	w.stats.Failed(msg, m.id, time.Now())
	tb := d.publicTraceback(engines.Traceback(r.err))
	attrs := []any{"worker_id", w.ID, "worker_name", w.Name, "topic", w.Topic, "event_id", m.id, "error_type", r.reason,
		"attempt", attempt, "max_attempts", limit, "err", msg}
	if tb != "" {
		attrs = append(attrs, "traceback", tb)
	}
	d.log.Warn("worker attempt failed", append(attrs, logAttrs(m, r.trace)...)...)
	if d.Events == nil {
		return
	}
	data := lifecycleevents.Data{WorkerID: w.ID, WorkerName: w.Name, Group: w.Group, Topic: w.Topic, ErrorType: r.reason, ErrorMessage: msg,
		Traceback: tb, EventID: m.id, Attempt: attempt, MaxAttempts: limit}
	if err := d.Events.Emit(ctx, "", lifecycleevents.Error, data); err != nil {
		d.log.Warn("publishing worker.error failed", "worker_id", w.ID, "err", err)
	}
}

// deadLetter stores m for ReplayDeadLetters, then publishes it, intact
// plus the dead-letter extensions, to "<topic>-dead" for worker w.
// tid is the trace of the attempt that gave up (zero: none or not traced).
func (d *Dispatcher) deadLetter(ctx context.Context, m *message, w Worker, reason string, attempts int, cause error, tid trace.TraceID) error {
	original, err := m.ev.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encode dead letter: %w", err)
	}
	ev := m.ev.Clone()
	ev.SetExtension(DeadLetterReasonExtension, reason)
	ev.SetExtension(DeadLetterAttemptsExtension, int32(attempts))
	ev.SetExtension(DeadLetterErrorExtension, d.publicText(fmt.Sprint(cause)))
	ev.SetExtension(DeadLetterWorkerExtension, w.ID)
	tb := d.publicTraceback(engines.Traceback(cause))
	// Stored before it is published: whoever sees it on "<topic>-dead" can
	// list and replay it. Add is idempotent (one entry per worker and
	// event), so a publish that fails and is redone on the redelivery
	// leaves one entry.
	if err := d.DeadLetters.Add(ctx, deadletter.Entry{Worker: w.ID, Topic: m.t.name, Reason: reason, Attempts: attempts,
		Error: d.publicText(fmt.Sprint(cause)), Traceback: tb, EventID: m.id, Source: m.req.GetSource(), Event: json.RawMessage(original),
		AtMS: time.Now().UnixMilli()}); err != nil {
		return err
	}
	if err := d.Pub.Publish(ctx, m.t.name+DeadLetterSuffix, &ev); err != nil {
		return err
	}
	d.stats.deadLettered.Add(1)
	d.WorkerStats.Worker(w.ID).DeadLettered(d.publicText(fmt.Sprint(cause)), m.id, time.Now())
	attrs := []any{"worker_id", w.ID, "worker_name", w.Name, "topic", m.t.name, "event_id", m.id, "reason", reason,
		"attempts", attempts, "err", d.publicText(fmt.Sprint(cause))}
	if tb != "" {
		attrs = append(attrs, "traceback", tb)
	}
	d.log.Warn("message dead-lettered", append(attrs, logAttrs(m, tid)...)...)
	if d.Events != nil {
		data := lifecycleevents.Data{WorkerID: w.ID, WorkerName: w.Name, Group: w.Group, Topic: w.Topic, EventID: m.id, Reason: reason,
			Attempt: attempts, MaxAttempts: d.maxAttempts(w), ErrorMessage: d.publicText(fmt.Sprint(cause)), Traceback: tb}
		if err := d.Events.Emit(ctx, "", lifecycleevents.DeadLettered, data); err != nil {
			d.log.Warn("publishing worker.dead_lettered failed", "worker_id", w.ID, "err", err)
		}
	}
	return nil
}

// deadLetterRaw stores and publishes a message that could not be decoded
// (or was too large) to "<topic>-dead" with its bytes kept as they came.
func (d *Dispatcher) deadLetterRaw(ctx context.Context, m *message, reason string, cause error) error {
	req := m.req
	ev := event.New(event.CloudEventsVersionV1)
	// Attributes over the input bounds (checkInputAttributes) are not
	// carried: an id by its hash, a source or type by the node's, an
	// extension when it would not fit.
	ev.SetID(req.GetId())
	if ev.ID() == "" {
		ev.SetID("undecodable-" + uuid.NewString())
	} else if len(ev.ID()) > MaxInputIDBytes {
		ev.SetID("too-large-" + outputIDBase(ev.ID()))
	}
	ev.SetSource("workmanager/nodes/" + d.cfg.NodeID)
	if src := req.GetSource(); src != "" && len(src) <= MaxInputAttributeBytes/2 && types.ParseURIRef(src) != nil {
		ev.SetSource(src)
	}
	ev.SetType(req.GetType())
	if ev.Type() == "" || len(ev.Type()) > MaxInputAttributeBytes/4 {
		ev.SetType("com.virtufin.workmanager.deadletter.raw")
	}
	data := req.GetData()
	if reason == reasonTooLarge && len(data) > d.cfg.MaxEventBytes {
		// Kept whole, it might not fit through daprd or the broker (its
		// base64 is a third larger): the dead letter could never be
		// published, and the event would come back for ever. Its first
		// MAX_EVENT_BYTES are kept, and its size says it was cut.
		ev.SetExtension(DeadLetterTruncatedExtension, int32(min(len(data), 1<<31-1)))
		data = data[:d.cfg.MaxEventBytes]
	}
	_ = ev.SetData("application/octet-stream", data)
	fields := req.GetExtensions().GetFields()
	room := MaxInputAttributeBytes
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if s := fields[k].GetStringValue(); s != "" && validExtensionName(k) && !isSpecAttribute(k) && len(k)+len(s) <= room {
			ev.SetExtension(k, s)
			room -= len(k) + len(s)
		}
	}
	ev.SetExtension(DeadLetterReasonExtension, reason)
	ev.SetExtension(DeadLetterAttemptsExtension, int32(0))
	ev.SetExtension(DeadLetterErrorExtension, d.publicText(cause.Error()))
	if ct := req.GetDataContentType(); ct != "" && len(ct) <= 256 {
		ev.SetExtension("deadlettercontenttype", ct)
	}
	// Stored first, as in deadLetter.
	entry := deadletter.Entry{Topic: m.t.name, Reason: reason, Error: d.publicText(cause.Error()), EventID: ev.ID(),
		Source: ev.Source(), AtMS: time.Now().UnixMilli()}
	if reason != reasonTooLarge {
		entry.Raw = req.GetData()
	}
	if err := d.DeadLetters.Add(ctx, entry); err != nil {
		return err
	}
	if err := d.Pub.Publish(ctx, m.t.name+DeadLetterSuffix, &ev); err != nil {
		return err
	}
	d.stats.deadLettered.Add(1)
	return nil
}
