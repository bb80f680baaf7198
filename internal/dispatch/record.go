package dispatch

// Stage 2 of a message: its delivery record. The record says which of the
// topic's workers still owe the message an answer, and whether their
// attempts are used up or their retry is not due yet; the message is
// queued to each worker that owes it one (its turn then starts in
// lock.go). The record is written back when every worker is done with it
// (settle.go).

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/grouplock"
)

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
	reason  deadletter.Reason
	err     error
	// exhausted: not attempted, its attempts were already used up.
	exhausted bool
	// queued is when the message was offered to w's queue (mono; queue
	// wait).
	queued int64
	// trace is the trace of the attempt's span (zero: tracing off).
	trace trace.TraceID
	// answered: the worker answered with an error (engines.ErrorAnswer),
	// announced when the attempt is settled.
	answered *engines.ErrorAnswer
}

// job hands one message to one worker, and carries the attempt from one
// stage to the next: the group lock's lease (lock.go), the span and the
// outputs published (outputs.go), all let go of in settle.go.
type job struct {
	m *message
	r *result

	lease    *grouplock.Lease // nil: no group, or not taken
	span     trace.Span       // nil: tracing off
	outputs  int
	started  time.Time // when the attempt began (after the lock: its processing)
	finished bool      // settle.go's finish ran
}

// record takes one message to the workers that still owe it an answer:
// read its delivery record and queue the message to each of them. The
// record stage holds the message until every offer is made; the last of
// its workers to finish settles it (settle.go). Two state round trips on
// the success path, however many workers the topic has.
func (d *Dispatcher) record(m *message) {
	m.started = mono()
	m.pending.Store(1) // this stage's hold
	defer func() {
		if p := recover(); p != nil {
			d.stats.panics.Add(1)
			d.log.Error("panic on the hot path; the message will be redelivered", "topic", m.t.name, "event_id", m.id, "panic", p, "stack", string(debug.Stack()))
			m.abort = true
		}
		d.leave(m)
	}()
	if !d.serving() {
		// Not a cluster member, or not reconciled since it became one
		// again: given back (RETRY) for a node that serves the current
		// state.
		m.abort = true
		return
	}
	ctx := d.ctx
	// A grouped worker's lock is fetched (its hold handed over by the
	// node that has it, or taken in the store) while the record is read:
	// the turn (lock.go) then finds it here instead of starting then.
	for _, w := range *m.t.workers.Load() {
		if w.lock != "" && m.isFor(w.ID) {
			if lock := w.lockFor(m); d.forwardsTo(m, lock) == "" { // else its turn goes to the lock (forward.go)
				d.Locks.Warm(ctx, lock, d.cfg.NodeID+"/"+w.ID)
			}
		}
	}
	rec, err := d.Records.Load(ctx, m.key)
	now := time.Now()
	m.rec, m.now = rec, now
	m.t.m.RecordLoad.Observe(seconds(m.started, monoOf(now)))
	if err != nil {
		m.t.m.RecordLoadError.Inc()
		d.log.Warn("delivery record unavailable; the message will be redelivered", "topic", m.t.name, "event_id", m.id, "err", err)
		m.abort = true
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
			m.abort = true
			return
		}
		if !ok {
			d.log.Warn("replay marker without a valid signature ignored: the event goes to every worker of its topic", "topic", m.t.name,
				"event_id", logID(m.id), "source", logID(m.req.GetSource()), "marker", logID(m.replayFor))
			m.replayFor = ""
		}
	}
	if m.replayFor != "" && !m.t.runs(m.replayFor) {
		// A replay for a worker no longer running (stopped or deleted
		// since): back to the dead letters rather than bouncing forever
		// (settle.go, with no record to write).
		m.replayGone = fmt.Errorf("replayed for worker %s, which is not running on topic %s", m.replayFor, m.t.name)
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
			results = append(results, result{w: w, outcome: outcomeFailed, reason: deadletter.ReasonCrashed, exhausted: true,
				err: fmt.Errorf("event was in flight in worker %s when the node crashed, at least twice (crash journal): not run again; "+
					"replay it once the worker is fixed (LoadCode)", w.ID)})
			continue
		case s.Attempts >= d.maxAttempts(w.Worker):
			// Its attempts are used up but the dead letter was not recorded
			// (saving it failed, or the node stopped in between):
			// dead-letter it now, with the last attempt's reason and error.
			reason, cause := deadletter.Reason(s.Reason), "attempts exhausted"
			if reason == "" { // a record from before Reason was kept
				reason = deadletter.ReasonWorkerFailed
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
	m.results = results
	for i := range results {
		r := &results[i]
		if r.outcome != outcomeNone || r.w.offer(m, r, 0) {
			continue
		}
		// A full queue: wait for room on its own, so that one slow worker
		// does not delay the offers to the others. The wait holds the
		// message like a queued job.
		m.pending.Add(1)
		go func() {
			defer d.leave(m)
			if !r.w.offer(m, r, d.cfg.QueueWait) {
				r.outcome = outcomeDeferred
				r.w.m.QueueRejection.Inc()
			}
		}()
	}
}

// offer queues m for w, waiting at most wait for room; false when w's
// queue stayed full (the message comes back later for w). A queued job
// holds the message until its turn is finished (settle.go).
//
// A queue that stayed full for a whole wait and has not moved since (no
// job taken: a hung worker, or one whose calls outlast the wait) gives
// the next messages back at once: waiting again would most likely end the
// same, and each wait holds one of daprd's concurrency slots, which the
// topic's other workers need (a hung worker beside a fast one, 2,000
// events at once: the fast one's answers took 14 s, each event's first
// delivery waiting for the hung one's queue).
func (w *worker) offer(m *message, r *result, wait time.Duration) bool {
	w.mu.RLock() // held while waiting: Detach waits at most wait for it
	defer w.mu.RUnlock()
	if w.closed {
		r.outcome = outcomeCut
		return true
	}
	m.pending.Add(1)
	j := job{m: m, r: r}
	select {
	case w.queue <- j:
		return true
	default:
	}
	if s, taken := w.stalledAt.Load(), w.taken.Load(); wait > 0 && (s == 0 || s-1 != taken) {
		t := time.NewTimer(wait)
		defer t.Stop()
		w.waiting.Add(1)
		defer w.waiting.Add(-1)
		select {
		case w.queue <- j:
			return true
		case <-t.C:
			// Stalled as of the count taken when the wait began: a job
			// taken during the wait (or since) is not a stall, and the
			// next offer waits again.
			w.stalledAt.Store(taken + 1)
		}
	}
	m.pending.Add(-1) // never queued; the caller still holds m
	return false
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
