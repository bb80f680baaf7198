package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/state"
)

// message is one received event on its way through the workers of a topic.
type message struct {
	t      *topic
	id     string
	req    *runtimev1.TopicEventRequest
	stream Stream // where its answer goes: a redelivery on a newer stream moves it there (guarded by t.mu)
	ev     event.Event
	ec     event.EventContextV1
	key    string // delivery record
	srcTag string // sourceTag
	// replayFor, when set, is the only worker this event is for (a replayed
	// dead letter); replaySig signs it (deadletter.ReplaySignatureExtension).
	// run honours the marker only with a valid signature.
	replayFor, replaySig string
	// correlation is the input's correlation id (hasCorrelation: present).
	correlation    any
	hasCorrelation bool

	dups int            // further deliveries of it while in flight (guarded by t.mu)
	wg   sync.WaitGroup // the workers running it on this delivery
	// next is another event with the same id (another source) delivered
	// while this one was in flight, held until this one is settled; and
	// superseded says that daprd, whose streaming subscription keys its
	// pending answers by event id, now waits for next's answer under this
	// id, not for this one's: this one's answer must not be sent (it would
	// settle next unrun); the broker redelivers it after its processing
	// timeout, and its delivery record answers that redelivery. Both
	// guarded by t.mu.
	next       *message
	superseded bool

	// started is when the node began handling it, decoded (mono); ended,
	// when set, when its record was written, i.e. its handling ended
	// (mono; one clock read less for the ack).
	started, ended int64
}

// monoBase anchors mono: the hot path keeps its timestamps as int64
// nanoseconds of the monotonic clock, 8 bytes where a time.Time takes 24
// (message and result stay in their allocation size classes).
var monoBase = time.Now()

// mono is now as nanoseconds since monoBase; monoOf is t's.
func mono() int64 { return int64(time.Since(monoBase)) }

func monoOf(t time.Time) int64 { return int64(t.Sub(monoBase)) }

// seconds is the time between two mono readings, in seconds.
func seconds(from, to int64) float64 { return float64(to-from) / 1e9 }

// isFor reports whether the message is for worker id (every worker, unless
// it is a replay for one).
func (m *message) isFor(id string) bool { return m.replayFor == "" || m.replayFor == id }

// outcome of one worker's attempt at one message.
type outcome uint8

const (
	outcomeNone     outcome = iota // not run on this delivery (skipped)
	outcomeDone                    // processed, outputs published
	outcomeFailed                  // a failed attempt
	outcomeCut                     // stopped or reloaded before or while running: not an attempt
	outcomeDeferred                // queue full or backoff pending: not an attempt
)

type result struct {
	w       *worker
	outcome outcome
	attempt int32 // the attempt's number, counting from 1
	reason  string
	err     error
	// exhausted: not attempted, its attempts were already used up.
	exhausted bool
	// queued is when the message was offered to w's queue (mono; queue
	// wait).
	queued int64
	// trace is the trace of the attempt's span (zero: tracing off).
	trace trace.TraceID
}

// job hands one message to one worker.
type job struct {
	m *message
	r *result
}

// receive takes one message off the stream (the topic's stream goroutine):
// it recognises deliveries of an event already in flight, dead-letters
// what cannot be processed at all, and hands the rest to run.
//
// daprd answers a streaming subscription's events by id: a delivery of an
// id in flight here replaces the one daprd waits for. A redelivery of the
// same event (same source and id) is answered together with it (never run
// twice at once). Another event with the same id (another source: a
// different CloudEvent) is held until the one in flight is settled, then
// runs and is the one answered; see message.next. An event without an id
// (undecodable: dead-lettered) is never matched with another.
func (d *Dispatcher) receive(t *topic, st Stream, req *runtimev1.TopicEventRequest) {
	id := req.GetId()
	// Counted before draining is checked, and Drain sets draining before it
	// reads the count: a message is either given back or waited for. The
	// same holds for a topic whose last worker left (closeTopic).
	d.flight(t, 1)
	if d.draining.Load() || t.closing.Load() {
		d.flight(t, -1)
		d.ackRaw(st, id, AckRetry) // shutting down, or the topic left this node: another node takes it
		return
	}
	m := &message{t: t, id: id, req: req, stream: st}
	t.mu.Lock()
	if cur := t.inflight[id]; cur != nil && id != "" {
		last := cur
		if cur.next != nil {
			last = cur.next
		}
		if last.req.GetSource() == req.GetSource() {
			// The same event again: answer this delivery together with
			// the one in flight instead of running the event twice at once.
			// A delivery on another stream (the subscription reconnected)
			// is answered there: the old stream is closed, and daprd forgot
			// what it delivered on it.
			if last.stream != st {
				last.stream, last.dups = st, 0
			} else {
				last.dups++
			}
			t.mu.Unlock()
			d.flight(t, -1)
			d.stats.duplicates.Add(1)
			d.log.Info("event delivered again while in flight; both deliveries are answered together", "topic", t.name, "event_id", logID(id))
			return
		}
		// Another event with this id: daprd now waits for its answer
		// only. It runs once the one in flight is settled.
		cur.superseded = true
		dropped := cur.next // never started, and no longer awaited by daprd: redelivered later
		cur.next = m
		t.mu.Unlock()
		if dropped != nil {
			d.flight(t, -1)
		}
		d.log.Info("another event with the id of one in flight (other source): held until that one is settled", "topic", t.name,
			"event_id", logID(id), "source", logID(req.GetSource()), "in_flight_source", logID(cur.req.GetSource()))
		return
	}
	if id != "" {
		t.inflight[id] = m
	}
	t.mu.Unlock()
	d.start(m, &t.sources)
}

// start dead-letters m when it is too large or cannot be decoded, and runs
// it otherwise. sources is the topic's source cache when called on its
// stream goroutine, nil elsewhere.
func (d *Dispatcher) start(m *message, sources *sourceCache) {
	if n := len(m.req.GetData()); n > d.cfg.MaxEventBytes {
		go d.rejectRaw(m, reasonTooLarge, fmt.Errorf("event data is %d bytes, more than MAX_EVENT_BYTES %d", n, d.cfg.MaxEventBytes))
		return
	}
	if err := checkInputAttributes(m.req); err != nil {
		go d.rejectRaw(m, reasonTooLarge, err)
		return
	}
	if err := d.decode(m, sources); err != nil {
		go d.rejectRaw(m, reasonUndecodable, err)
		return
	}
	go d.run(m)
}

// decode fills m from its request; a panic while decoding is an error.
func (d *Dispatcher) decode(m *message, sources *sourceCache) (err error) {
	defer func() {
		if p := recover(); p != nil {
			d.stats.panics.Add(1)
			d.log.Error("panic while decoding an event", "topic", m.t.name, "event_id", m.id, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("decoding panicked: %v", p)
		}
	}()
	if err := decode(m.req, &m.ev, &m.ec, sources); err != nil {
		return err
	}
	ext := m.ec.Extensions
	m.correlation, m.hasCorrelation = ext[CorrelationExtension]
	if r, ok := ext[deadletter.ReplayExtension].(string); ok {
		m.replayFor = r
		m.replaySig, _ = ext[deadletter.ReplaySignatureExtension].(string)
	}
	// Workers see the event as first published.
	delete(ext, deadletter.ReplayExtension)
	delete(ext, deadletter.ReplaySignatureExtension)
	m.key = delivery.Key(m.req.GetSource(), m.id)
	m.srcTag = sourceTag(m.req.GetSource())
	return nil
}

// run takes one message through the workers that still owe it an answer:
// read its delivery record, queue it to each of them, wait, write the
// record back, and ack. Two state round trips on the success path, however
// many workers the topic has.
func (d *Dispatcher) run(m *message) {
	m.started = mono()
	status := AckRetry
	defer func() {
		if p := recover(); p != nil {
			d.stats.panics.Add(1)
			d.log.Error("panic on the hot path; the message will be redelivered", "topic", m.t.name, "event_id", m.id, "panic", p, "stack", string(debug.Stack()))
			status = AckRetry
		}
		d.ack(m, status)
	}()
	if !d.serving() {
		// Not a cluster member, or not reconciled since it became one
		// again: given back (RETRY) for a node that serves the current
		// state.
		return
	}
	ctx := d.ctx
	rec, err := d.Records.Load(ctx, m.key)
	now := time.Now()
	m.t.m.RecordLoad.Observe(seconds(m.started, monoOf(now)))
	if err != nil {
		m.t.m.RecordLoadError.Inc()
		d.log.Warn("delivery record unavailable; the message will be redelivered", "topic", m.t.name, "event_id", m.id, "err", err)
		return
	}
	if m.replayFor != "" {
		// Only the replay path (ReplayDeadLetters) may narrow an event to
		// one worker, or file it under one: a marker a producer set without
		// the signature (or signed for another event, worker or topic) is
		// ignored, and the event is an ordinary one.
		ok, err := d.DeadLetters.VerifyReplay(ctx, m.req.GetSource(), m.id, m.replayFor, m.t.name, m.replaySig)
		if err != nil {
			d.log.Warn("replay marker not checked (replay key unavailable); the message will be redelivered", "topic", m.t.name, "event_id", m.id, "err", err)
			return
		}
		if !ok {
			d.log.Warn("replay marker without a valid signature ignored: the event goes to every worker of its topic", "topic", m.t.name,
				"event_id", logID(m.id), "source", logID(m.req.GetSource()), "marker", logID(m.replayFor))
			m.replayFor = ""
		}
	}
	if m.replayFor != "" && !m.t.runs(m.replayFor) {
		// A replay for a worker no longer running (stopped or deleted since):
		// back to the dead letters rather than bouncing forever.
		err := fmt.Errorf("replayed for worker %s, which is not running on topic %s", m.replayFor, m.t.name)
		if d.deadLetter(ctx, m, Worker{ID: m.replayFor, Topic: m.t.name}, reasonNotRunning, 0, err, trace.TraceID{}) == nil {
			m.t.m.DeadLettered(reasonNotRunning)
			status = AckSuccess
		}
		return
	}
	workers := *m.t.workers.Load()
	results := make([]result, 0, len(workers))
	for _, w := range workers {
		if !m.isFor(w.ID) {
			continue
		}
		s := rec.Get(w.ID)
		switch {
		case s.Terminal():
			continue
		case d.cfg.Suspect != nil && d.cfg.Suspect(w.ID, m.ev.Source(), m.ev.ID()):
			// It crashed the node while this worker ran it: not run again.
			results = append(results, result{w: w, outcome: outcomeFailed, reason: reasonCrashed, exhausted: true,
				err: fmt.Errorf("event was in flight in worker %s when the node crashed, at least twice (crash journal): not run again; "+
					"replay it once the worker is fixed (LoadCode)", w.ID)})
			continue
		case s.Attempts >= d.maxAttempts(w.Worker):
			// Its attempts are used up but the dead letter was not recorded
			// (saving it failed, or the node stopped in between):
			// dead-letter it now, with the last attempt's reason and error.
			reason, cause := s.Reason, "attempts exhausted"
			if reason == "" { // a record from before Reason was kept
				reason = reasonWorkerFailed
			}
			if s.Error != "" {
				cause = "attempts exhausted: " + s.Error
			}
			results = append(results, result{w: w, outcome: outcomeFailed, reason: reason, err: errors.New(cause), exhausted: true})
			continue
		case s.NextMS > now.UnixMilli():
			results = append(results, result{w: w, outcome: outcomeDeferred})
			continue
		}
		results = append(results, result{w: w, queued: monoOf(now), attempt: int32(s.Attempts + 1)})
	}
	var full []*result
	for i := range results {
		r := &results[i]
		if r.outcome == outcomeNone && !r.w.offer(m, r, 0) {
			full = append(full, r)
		}
	}
	// Full queues: wait for room, each on its own, so that one slow worker
	// does not delay the offers to the others.
	var offers sync.WaitGroup
	for _, r := range full {
		offers.Add(1)
		go func() {
			defer offers.Done()
			if !r.w.offer(m, r, d.cfg.QueueWait) {
				r.outcome = outcomeDeferred
				r.w.m.QueueRejection.Inc()
			}
		}()
	}
	offers.Wait()
	m.wg.Wait()

	updates := map[string]delivery.Worker{}
	for i := range results {
		d.settle(ctx, m, rec, &results[i], updates)
	}
	d.notRunnable(ctx, m, rec, now, updates)
	if len(updates) > 0 {
		updating := mono()
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

// runs reports whether worker id is one the catalog runs on the topic, here
// or on another node.
func (t *topic) runs(id string) bool {
	for _, w := range *t.workers.Load() {
		if w.ID == id {
			return true
		}
	}
	if p := t.unrunnable.Load(); p != nil {
		for _, w := range *p {
			if w.ID == id {
				return true
			}
		}
	}
	return false
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

// settle turns one worker's result into its next record state, publishing
// its dead letter when its attempts are used up.
func (d *Dispatcher) settle(ctx context.Context, m *message, rec delivery.Record, r *result, updates map[string]delivery.Worker) {
	switch r.outcome {
	case outcomeDone:
		r.w.m.Succeeded.Inc()
		r.w.stats.Processed()
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
	if !r.exhausted && retryCannotFix(r.reason) {
		limit = s.Attempts + 1 // this attempt is the last
	}
	if r.reason == reasonCrashed {
		limit = s.Attempts // not run: dead-lettered now
	}
	if !r.exhausted {
		s.Attempts++
		r.w.m.Failed(r.reason)
		d.workerError(ctx, r.w, m, r, s.Attempts, limit)
	}
	if s.Attempts >= limit {
		if err := d.deadLetter(ctx, m, r.w.Worker, r.reason, s.Attempts, r.err, r.trace); err != nil {
			d.log.Warn("dead letter not published; the message will be redelivered", append([]any{"worker_id", r.w.ID, "event_id", m.id, "err", err}, logAttrs(m, r.trace)...)...)
			// Attempts are used up: the next delivery dead-letters it, with
			// the reason and error of the last attempt (an exhausted
			// result carries the record's already).
			if !r.exhausted {
				s.Reason, s.Error = r.reason, d.publicText(fmt.Sprint(r.err))
			}
			updates[r.w.ID] = s
			return
		}
		r.w.m.DeadLettered(r.reason)
		s.Outcome = delivery.Dead
	} else {
		s.NextMS = time.Now().Add(d.backoff(r.w.Worker, s.Attempts)).UnixMilli()
	}
	updates[r.w.ID] = s
}

// retryCannotFix reports whether a failure of this reason comes back on
// every retry of the same input, so that retrying only delays the dead
// letter: outputs the worker's policy refuses (a reserved topic, its own
// input topic, one outside allowed_output_topics), outputs over the
// node's limits and outputs that cannot be published at all (no "type",
// not encodable: engines.ErrInvalidOutput). Such a failure is
// dead-lettered on its first attempt.
func retryCannotFix(reason string) bool {
	return reason == reasonOutputPolicy || reason == reasonOutputLimit || reason == reasonOutputInvalid
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
			if d.deadLetter(ctx, m, w, reasonNotRunnable, s.NotRunnable, err, trace.TraceID{}) == nil {
				m.t.m.DeadLettered(reasonNotRunnable)
				s.Outcome = delivery.Dead
			}
		}
		updates[w.ID] = s
	}
}

func (d *Dispatcher) maxAttempts(w Worker) int {
	if w.MaxAttempts > 0 {
		return w.MaxAttempts
	}
	return d.cfg.MaxAttempts
}

// backoff is the wait after the attempts-th failed attempt.
func (d *Dispatcher) backoff(w Worker, attempts int) time.Duration {
	b := d.cfg.RetryBackoff
	if w.RetryBackoff > 0 {
		b = w.RetryBackoff
	}
	for i := 1; i < attempts && b < time.Hour; i++ {
		b *= 2
	}
	return b
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

// rejectRaw dead-letters a message that no worker can take (undecodable or
// too large) and acks it; when the dead letter cannot be published the
// message is given back instead.
func (d *Dispatcher) rejectRaw(m *message, reason string, cause error) {
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
	m.t.m.DeadLettered(reason)
	status = AckSuccess
}

// sourceTag returns the part of an output's default id that tells inputs
// with one id from two sources apart (CloudEvents: source+id is the
// identity): the first 8 hex digits of the SHA-256 of the input's source.
// Without it their outputs would share source and id, and a downstream
// worker would run only one of them.
func sourceTag(source string) string {
	sum := sha256.Sum256([]byte(source))
	return hex.EncodeToString(sum[:4])
}
