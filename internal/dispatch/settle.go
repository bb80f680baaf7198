package dispatch

// Stage 6 of a message: settle. Each worker's attempt ends here (finish:
// its lease released, its span ended); when the last one has, the
// outcomes go into the delivery record, a worker whose attempts are used
// up gets its dead letter (internal/deadletter), and the broker gets its
// answer. A message that cannot be processed at all comes here from
// receive.go (reject).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/state"
)

// finish ends w's attempt at j's message: the group lock's lease is
// released (the hold passes on to the group's next message here, or back
// to the store), the span ended, and the job lets go of the message.
func (d *Dispatcher) finish(w *worker, j *job) {
	if j.finished {
		return
	}
	j.finished = true
	defer d.leave(j.m) // whatever happens below, the message is settled
	if !j.started.IsZero() {
		w.m.InFlight.Dec()
	}
	if j.span != nil {
		d.endSpan(j.span, j.r, j.outputs)
	}
	if j.lease != nil {
		if err := j.lease.Release(context.WithoutCancel(d.ctx)); err != nil {
			d.log.Warn("group lock not released after retries; this node takes it back on its next message of the group, other nodes once it leaves the cluster membership or after 10 × GROUP_LOCK_MAX_AGE_MS (GROUP_LOCK_MAX_AGE_MS if nothing was published under it)",
				append([]any{"group", w.Group, "worker_id", w.ID, "err", err}, logAttrs(j.m, j.r.trace)...)...)
		}
	}
}

// leave lets go of m for one stage (record.go's offers, or one job); the
// last to let go settles it, on a goroutine of its own when that is a
// worker's (whose next message should not wait for m's record).
func (d *Dispatcher) leave(m *message) {
	if m.pending.Add(-1) != 0 {
		return
	}
	if m.remote != nil {
		close(m.remote) // its peer settles it (forward.go)
		return
	}
	go d.settle(m)
}

// settle writes every worker's outcome into m's delivery record and
// answers the broker: SUCCESS when every worker the message is for is
// done with it or dead-lettered it, RETRY otherwise.
func (d *Dispatcher) settle(m *message) {
	status := AckRetry
	defer func() {
		if p := recover(); p != nil {
			d.stats.panics.Add(1)
			d.log.Error("panic on the hot path; the message will be redelivered", "topic", m.t.name, "event_id", m.id, "panic", p, "stack", string(debug.Stack()))
			status = AckRetry
		}
		d.ack(m, status)
	}()
	if m.abort {
		return
	}
	ctx := d.ctx
	if m.replayGone != nil {
		// A replay for a worker no longer running: back to the dead
		// letters, with no record to write.
		if d.deadLetter(ctx, m, Worker{ID: m.replayFor, Topic: m.t.name}, deadletter.ReasonNotRunning, 0, m.replayGone, trace.TraceID{}) == nil {
			m.t.m.DeadLettered(string(deadletter.ReasonNotRunning))
			status = AckSuccess
		}
		return
	}
	rec := m.rec
	updates := map[string]delivery.Worker{}
	for i := range m.results {
		d.settleOne(ctx, m, rec, &m.results[i], updates)
	}
	d.notRunnable(ctx, m, rec, m.now, updates)
	if len(updates) > 0 {
		updating := mono()
		var err error
		rec, err = d.saveRecord(ctx, m, rec, func(r *delivery.Record) {
			for id, u := range updates {
				cur := r.Get(id)
				if cur.Terminal() { // another node finished it meanwhile
					continue
				}
				u.Attempts = max(u.Attempts, cur.Attempts)
				r.Set(id, u)
			}
		})
		m.ended = mono()
		m.t.m.RecordUpdate.Observe(seconds(updating, m.ended))
		if err != nil {
			m.t.m.RecordUpdateError.Inc()
			d.log.Warn("delivery record not saved; the message will be redelivered", "topic", m.t.name, "event_id", m.id, "err", err)
			return
		}
	}
	if d.complete(m, rec) {
		status = AckSuccess
	}
}

// settleOne turns one worker's result into its next record state,
// publishing its dead letter when its attempts are used up.
func (d *Dispatcher) settleOne(ctx context.Context, m *message, rec delivery.Record, r *result, updates map[string]delivery.Worker) {
	switch r.outcome {
	case outcomeDone:
		r.w.m.Succeeded.Inc()
		r.w.stats.Processed()
		if r.answered != nil {
			d.errorAnswered(ctx, r.w, m, r)
		}
		updates[r.w.ID] = delivery.Worker{Outcome: delivery.Done, Attempts: rec.Get(r.w.ID).Attempts + 1}
		return
	case outcomeDeferred:
		d.stats.deferred.Add(1)
		return
	case outcomeFailed:
	default:
		return
	}
	s := rec.Get(r.w.ID)
	limit := d.maxAttempts(r.w.Worker)
	if !r.exhausted && r.reason.RetryCannotFix() {
		limit = s.Attempts + 1 // this attempt is the last
	}
	if r.reason == deadletter.ReasonCrashed {
		limit = s.Attempts // not run: dead-lettered now
	}
	if !r.exhausted {
		s.Attempts++
		r.w.m.Failed(string(r.reason))
		d.workerError(ctx, r.w, m, r, s.Attempts, limit)
	}
	if s.Attempts >= limit {
		if err := d.deadLetter(ctx, m, r.w.Worker, r.reason, s.Attempts, r.err, r.trace); err != nil {
			d.log.Warn("dead letter not published; the message will be redelivered", append([]any{"worker_id", r.w.ID, "event_id", m.id, "err", err}, logAttrs(m, r.trace)...)...)
			// Attempts are used up: the next delivery dead-letters it, with
			// the reason and error of the last attempt (an exhausted
			// result carries the record's already).
			if !r.exhausted {
				s.Reason, s.Error = string(r.reason), d.publicText(fmt.Sprint(r.err))
			}
			updates[r.w.ID] = s
			return
		}
		r.w.m.DeadLettered(string(r.reason))
		s.Outcome = delivery.Dead
	} else {
		s.NextMS = time.Now().Add(d.backoff(r.w.Worker, s.Attempts)).UnixMilli()
	}
	updates[r.w.ID] = s
}

// notRunnable counts a delivery against each worker the catalog runs on
// the topic but this node cannot, and dead-letters the message for it once
// it has waited MaxAttempts deliveries and NotRunnableGrace.
func (d *Dispatcher) notRunnable(ctx context.Context, m *message, rec delivery.Record, now time.Time, updates map[string]delivery.Worker) {
	p := m.t.unrunnable.Load()
	if p == nil {
		return
	}
	for _, w := range *p {
		if !m.isFor(w.ID) {
			continue
		}
		if _, ran := updates[w.ID]; ran {
			continue // it ran here on this delivery (parked since)
		}
		s := rec.Get(w.ID)
		if s.Terminal() {
			continue
		}
		s.NotRunnable++
		if s.FirstNotRunnableMS == 0 {
			s.FirstNotRunnableMS = now.UnixMilli()
		}
		if s.NotRunnable >= d.maxAttempts(w) && now.Sub(time.UnixMilli(s.FirstNotRunnableMS)) >= d.cfg.NotRunnableGrace {
			err := fmt.Errorf("no node could run worker %s for %s (%d deliveries)", w.ID, now.Sub(time.UnixMilli(s.FirstNotRunnableMS)).Round(time.Second), s.NotRunnable)
			if d.deadLetter(ctx, m, w, deadletter.ReasonNotRunnable, s.NotRunnable, err, trace.TraceID{}) == nil {
				m.t.m.DeadLettered(string(deadletter.ReasonNotRunnable))
				s.Outcome = delivery.Dead
			}
		}
		updates[w.ID] = s
	}
}

// saveRecord writes a delivery's outcomes into its record (change, applied
// again on each try: it must be idempotent). When the state store cannot be
// reached it tries again, backing off, for up to Config.RecordSaveRetry:
// the workers have run, and a record left unsaved makes the redelivery run
// them again (a duplicate at-least-once allows, avoidable when the outage
// is a daprd restart of a second or two). A conflict that Update could not
// settle is not retried here.
func (d *Dispatcher) saveRecord(ctx context.Context, m *message, rec delivery.Record, change func(*delivery.Record)) (delivery.Record, error) {
	deadline := time.Now().Add(d.cfg.RecordSaveRetry)
	wait := 50 * time.Millisecond
	for {
		saved, err := d.Records.Update(ctx, m.key, rec, change)
		if err == nil || errors.Is(err, state.ErrConflict) || time.Now().Add(wait).After(deadline) {
			return saved, err
		}
		d.log.Debug("delivery record not saved; trying again", "topic", m.t.name, "event_id", m.id, "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return saved, err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// complete reports whether every worker the message is for — every worker
// the catalog runs on its topic, whether this node runs it or not — is done
// with it or dead-lettered it.
func (d *Dispatcher) complete(m *message, rec delivery.Record) bool {
	n := 0
	for _, w := range *m.t.workers.Load() {
		if !m.isFor(w.ID) {
			continue
		}
		n++
		if !rec.Get(w.ID).Terminal() {
			return false
		}
	}
	if p := m.t.unrunnable.Load(); p != nil {
		for _, w := range *p {
			if !m.isFor(w.ID) {
				continue
			}
			n++
			if !rec.Get(w.ID).Terminal() {
				return false
			}
		}
	}
	return n > 0 // no worker at all: being detached, let another node answer
}

// ack answers the message (and any delivery of it that arrived while it
// was in flight) and forgets it.
func (d *Dispatcher) ack(m *message, status Ack) {
	t := m.t
	t.mu.Lock()
	next, superseded := m.next, m.superseded
	switch {
	case next != nil:
		t.inflight[m.id] = next
	case t.inflight[m.id] == m:
		delete(t.inflight, m.id)
	}
	n, st := 1+m.dups, m.stream
	if superseded {
		n = 0 // daprd awaits next's answer under this id, not this one's
	}
	t.mu.Unlock()
	if m.ended == 0 {
		m.ended = mono()
	}
	handled := seconds(m.started, m.ended)
	if status == AckSuccess {
		d.stats.processed.Add(1)
		t.m.HandledSuccess.Observe(handled)
	} else {
		d.stats.failed.Add(1)
		t.m.HandledRetry.Observe(handled)
	}
	for range n {
		d.ackRaw(st, m.id, status)
	}
	d.flight(t, -1)
	if next != nil {
		d.start(next, nil)
	}
}

// flight counts messages in flight, on the node (Drain) and on their
// topic (closeTopic): received and not answered yet.
func (d *Dispatcher) flight(t *topic, delta int64) {
	d.inflight.Add(delta)
	t.pending.Add(delta)
}

func (d *Dispatcher) ackRaw(st Stream, id string, status Ack) {
	if err := st.Ack(id, status); err != nil {
		d.log.Warn("ack failed; the broker will redeliver", "event_id", logID(id), "err", err)
	}
}

// reject dead-letters a message that no worker can take (undecodable or
// too large) and acks it; when the dead letter cannot be published the
// message is given back instead.
func (d *Dispatcher) reject(m *message, reason deadletter.Reason, cause error) {
	m.started = mono()
	status := AckRetry
	defer func() {
		if p := recover(); p != nil {
			d.stats.panics.Add(1)
			d.log.Error("panic while dead-lettering", "event_id", logID(m.id), "panic", p, "stack", string(debug.Stack()))
		}
		d.ack(m, status)
	}()
	d.log.Warn("event cannot be processed; sending it to the dead-letter topic", "topic", m.t.name, "event_id", logID(m.id), "reason", reason, "err", d.publicText(cause.Error()))
	if err := d.deadLetterRaw(d.ctx, m, reason, cause); err != nil {
		d.log.Warn("dead letter not published; the message will be redelivered", "event_id", logID(m.id), "err", err)
		return
	}
	m.t.m.DeadLettered(string(reason))
	status = AckSuccess
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
	data := lifecycleevents.Data{WorkerID: w.ID, WorkerName: w.Name, Group: w.Group, Topic: w.Topic, ErrorType: string(r.reason), ErrorMessage: msg,
		Traceback: tb, EventID: m.id, Attempt: attempt, MaxAttempts: limit}
	if err := d.Events.Emit(ctx, "", lifecycleevents.Error, data); err != nil {
		d.log.Warn("publishing worker.error failed", "worker_id", w.ID, "err", err)
	}
}

// ErrorTypeAnswer is the error_type of the worker.error event announcing
// a worker's own error answer (engines.ErrorAnswer), not a failed attempt.
const ErrorTypeAnswer = "error_response"

// errorAnswered logs and announces (worker.error) that w answered m with
// an error; its error response is published already.
func (d *Dispatcher) errorAnswered(ctx context.Context, w *worker, m *message, r *result) {
	msg := d.publicText(r.answered.Message)
	d.log.Info("worker answered with an error; its error response is published", append([]any{"worker_id", w.ID, "worker_name", w.Name,
		"topic", w.Topic, "event_id", m.id, "err", msg}, logAttrs(m, r.trace)...)...)
	if d.Events == nil {
		return
	}
	data := lifecycleevents.Data{WorkerID: w.ID, WorkerName: w.Name, Group: w.Group, Topic: w.Topic, ErrorType: ErrorTypeAnswer,
		ErrorMessage: msg, EventID: m.id, Attempt: int(r.attempt), MaxAttempts: d.maxAttempts(w.Worker)}
	if err := d.Events.Emit(ctx, "", lifecycleevents.Error, data); err != nil {
		d.log.Warn("publishing worker.error failed", "worker_id", w.ID, "err", err)
	}
}

// deadLetter gives m up for worker w (internal/deadletter stores it for
// ReplayDeadLetters, publishes it to "<topic>-dead" and announces it).
// tid is the trace of the attempt that gave up (zero: none or not traced).
func (d *Dispatcher) deadLetter(ctx context.Context, m *message, w Worker, reason deadletter.Reason, attempts int, cause error, tid trace.TraceID) error {
	msg := d.publicText(fmt.Sprint(cause))
	tb := d.publicTraceback(engines.Traceback(cause))
	if err := d.letters.Send(ctx, deadletter.Letter{Topic: m.t.name,
		Worker: lifecycleevents.Data{WorkerID: w.ID, WorkerName: w.Name, Group: w.Group, Topic: w.Topic},
		Reason: reason, Attempts: attempts, MaxAttempts: d.maxAttempts(w), Error: msg, Traceback: tb,
		Event: &m.ev, EventID: m.id, Source: m.req.GetSource()}); err != nil {
		return err
	}
	d.stats.deadLettered.Add(1)
	d.WorkerStats.Worker(w.ID).DeadLettered(msg, m.id, time.Now())
	attrs := []any{"worker_id", w.ID, "worker_name", w.Name, "topic", m.t.name, "event_id", m.id, "reason", reason,
		"attempts", attempts, "err", msg}
	if tb != "" {
		attrs = append(attrs, "traceback", tb)
	}
	d.log.Warn("message dead-lettered", append(attrs, logAttrs(m, tid)...)...)
	return nil
}

// deadLetterRaw gives up a message that could not be decoded (or was too
// large), its bytes kept as they came.
func (d *Dispatcher) deadLetterRaw(ctx context.Context, m *message, reason deadletter.Reason, cause error) error {
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
	if reason == deadletter.ReasonTooLarge && len(data) > d.cfg.MaxEventBytes {
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
	if ct := req.GetDataContentType(); ct != "" && len(ct) <= 256 {
		ev.SetExtension(deadletter.ContentTypeExtension, ct)
	}
	l := deadletter.Letter{Topic: m.t.name, Reason: reason, Error: d.publicText(cause.Error()), Event: &ev, EventID: ev.ID(), Source: ev.Source()}
	if reason != deadletter.ReasonTooLarge {
		l.Raw = req.GetData()
	}
	if err := d.letters.Send(ctx, l); err != nil {
		return err
	}
	d.stats.deadLettered.Add(1)
	return nil
}
