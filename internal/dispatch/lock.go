package dispatch

// Stage 3 of a message, for one worker: its turn. One of the worker's
// goroutines takes the message off the worker's queue (record.go put it
// there) and, for a grouped worker, takes the group's lock (the key's, for
// a keyed group); the lease and its fencing token go with the call
// (call.go).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/grouplock"
)

// serve is one of a worker's MaxConcurrency goroutines.
func (d *Dispatcher) serve(w *worker) {
	defer w.wg.Done()
	for {
		select {
		case j := <-w.queue:
			w.taken.Add(1)
			// select picks at random among ready cases: a detached
			// worker must not go on taking its queue (Detach would wait
			// for every queued call), so stopped is checked again.
			select {
			case <-w.stopped:
				j.r.outcome = outcomeCut
				d.finish(w, &j)
				return
			default:
			}
			d.take(w, &j)
		case <-w.stopped:
			return
		}
	}
}

// take starts w's attempt at j's message: its span, and its group lock
// when w has a group (renewed until the attempt ends). A panic anywhere in
// the attempt is a failed attempt of w.
func (d *Dispatcher) take(w *worker, j *job) {
	m, r := j.m, j.r
	defer func() {
		if p := recover(); p != nil {
			d.stats.panics.Add(1)
			d.log.Error("panic while processing a message", append([]any{"worker_id", w.ID, "event_id", m.id, "panic", p,
				"stack", string(debug.Stack())}, logAttrs(m, r.trace)...)...)
			if !j.finished {
				r.outcome, r.reason, r.err = outcomeFailed, deadletter.ReasonPanic, fmt.Errorf("panic: %v", p)
				d.finish(w, j)
			}
		}
	}()
	if !d.serving() { // see record: given back, not an attempt
		r.outcome = outcomeCut
		d.finish(w, j)
		return
	}
	start := time.Now()
	w.m.QueueWait.Observe(seconds(r.queued, monoOf(start)))
	if m.remote == nil { // a forwarded turn is counted where it was received (forward.go)
		w.m.Received.Inc()
	}
	w.m.InFlight.Inc()
	j.started = start // from here on, finish counts it out of InFlight
	ctx := d.ctx
	if d.tracer != nil {
		ctx, j.span = d.startSpan(ctx, w, m, r)
	}
	if w.Group == "" {
		d.call(ctx, w, j, &m.ev)
		return
	}
	lock := w.lockFor(m)
	if node := d.forwardsTo(m, lock); node != "" && d.forwardTurn(ctx, w, j, lock, node) {
		return
	}
	lease, err := d.acquire(ctx, w, lock)
	if err != nil {
		r.outcome, r.reason, r.err = outcomeFailed, deadletter.ReasonLockError, err
		switch {
		case errors.Is(err, grouplock.ErrContended):
			r.reason = deadletter.ReasonLockContention
		case ctx.Err() != nil || w.isStopped():
			// Stopped (or moved away) while waiting for the lock: said
			// below, not a store error.
		default:
			// The store failed under the lock: not the worker's failure,
			// and not an attempt (a flapping store must not dead-letter
			// grouped messages); given back.
			r.outcome = outcomeDeferred
			d.log.Warn("group lock not taken: state store error; the message is given back, not counted as an attempt",
				append([]any{"group", w.Group, "worker_id", w.ID, "err", err}, logAttrs(m, r.trace)...)...)
		}
		if ctx.Err() != nil || w.isStopped() {
			r.outcome = outcomeCut // stopped while waiting: given back, not an attempt
			d.log.Debug("worker stopped while its message waited for the group lock: given back", "group", w.Group, "worker_id", w.ID)
		}
		d.finish(w, j)
		return
	}
	// Renewed while the call and its publishing run, so a call longer than
	// GROUP_LOCK_MAX_AGE keeps its lock; a renewal that finds the lock
	// taken makes every later Check (the gateway's, the outputs') refuse.
	// finish releases it, which stops the renewals.
	lease.KeepAlive(ctx)
	j.lease = lease
	in := withExtension(m, FencingExtension, strconv.FormatInt(lease.Token, 10))
	ctx = engines.WithFence(ctx, &engines.Fence{Group: lease.Group, Token: lease.Token, Check: lease.Check})
	locked := time.Now()
	w.m.LockWait.Observe(locked.Sub(start).Seconds())
	j.started = locked
	d.call(ctx, w, j, in)
}

// forwardsTo names the node m's turn under lock is sent to (forward.go):
// the one this node gave the lock to within the linger, if any. A turn a
// peer forwarded here, or a replay, runs here.
func (d *Dispatcher) forwardsTo(m *message, lock string) string {
	if d.Peers == nil || m.remote != nil || m.replayFor != "" {
		return ""
	}
	return d.Locks.HeldAt(lock)
}

// acquire takes w's group lock for one message. A stop of w ends the wait
// (for the group's local slot, held by w's other messages, or for the
// store): a stop returns within about one message's time, not one per
// message waiting for the group, and those come back later. A lock won as
// the stop comes is given back at once: after a stop no message starts.
func (d *Dispatcher) acquire(ctx context.Context, w *worker, lock string) (*grouplock.Lease, error) {
	actx, cancel := w.untilStopped(ctx)
	defer cancel()
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
// untilStopped is ctx, cancelled too when w is stopped, and its cancel:
// no goroutine waits for the stop (context.AfterFunc on w.stopCtx).
func (w *worker) untilStopped(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(w.stopCtx, cancel)
	return ctx, func() {
		unhook()
		cancel()
	}
}

func (w *worker) isStopped() bool {
	select {
	case <-w.stopped:
		return true
	default:
		return false
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
