package dispatch

// Stage 5 for a grouped worker: its outputs go out in fencing-token order
// (the group's calls never overlap; their outputs appear in the order of
// their tokens). A call's outputs wait for the outputs of the group's
// earlier calls on this node (grouplock's Lease.Turn); whichever call gets
// its turn publishes, in one ordered request per topic, its own outputs
// and those of the later calls already waiting behind it (a group
// commit), so a busy group pays one publish round trip per batch, not one
// per call.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/publish"
)

// turnQueue holds the outputs of a hold's calls waiting for their turn,
// by token (one per hold: grouplock's Lease.Local).
type turnQueue struct {
	mu      sync.Mutex
	waiting map[int64]*turn
}

// turn is one call's outputs waiting to be published.
type turn struct {
	w      *worker
	j      *job
	outs   []event.Event
	tp, ts string
	taken  bool          // an earlier call's turn publishes them
	done   chan struct{} // closed once they went out, or failed (j.r says)
}

// publishInTurn publishes outs (w's call at j's message, under j.lease)
// after the outputs of the group's earlier calls: the next call of the
// group may start meanwhile (Lease.Yield).
func (d *Dispatcher) publishInTurn(ctx context.Context, w *worker, j *job, outs []event.Event, tp, ts string) {
	lease := j.lease
	q := lease.Local(func() any { return &turnQueue{waiting: map[int64]*turn{}} }).(*turnQueue)
	me := &turn{w: w, j: j, outs: outs, tp: tp, ts: ts, done: make(chan struct{})}
	// Queued before the next call may start, so that whoever publishes
	// finds it in token order.
	q.mu.Lock()
	q.waiting[lease.Token] = me
	q.mu.Unlock()
	lease.Yield(ctx)

	// Wait for this call's turn, or for an earlier turn to take it (and
	// close me.done once published).
	err := lease.TurnUnless(ctx, me.done)
	q.mu.Lock()
	if me.taken {
		q.mu.Unlock()
		<-me.done // published by an earlier turn: j.r says how it went
		return
	}
	delete(q.waiting, lease.Token)
	if err != nil {
		q.mu.Unlock()
		j.r.outcome = outcomeCut // shutting down: given back
		close(me.done)
		return
	}
	// This call's turn: it publishes its outputs and those of the later
	// calls queued behind it without a gap.
	batch := []*turn{me}
	me.taken = true
	for _, tok := range lease.Later() {
		t := q.waiting[tok]
		if t == nil || t.taken {
			break // still calling (or without outputs): its turn comes later
		}
		t.taken = true
		delete(q.waiting, tok)
		batch = append(batch, t)
	}
	q.mu.Unlock()
	d.publishTurns(ctx, batch)
	for _, t := range batch {
		close(t.done)
	}
}

// publishTurns publishes the outputs of batch, calls in token order, in
// one ordered request per topic (a topic's outputs in token order; the
// order between topics is not one a consumer can see); before each
// request, the lease of every call not yet fully published is checked
// (Lease.Check: still the group's lock), and the broker checks the tokens
// again as it takes the request (publish.Fenced: a node paused between
// the two is refused, as stale). When a Check or a request fails,
// the first call with an output not known to be published gets that
// outcome, and so does every call after it (each is retried under a new,
// higher token); what went out before stays, in token order per topic.
func (d *Dispatcher) publishTurns(ctx context.Context, batch []*turn) {
	type entry struct {
		call int // index in batch
		o    *event.Event
	}
	var topics []string
	byTopic := map[string][]entry{}
	for c, t := range batch {
		for i := range t.outs {
			o := &t.outs[i]
			setTraceContext(o, t.tp, t.ts)
			o.SetExtension(FencingExtension, strconv.FormatInt(t.j.lease.Token, 10))
			if _, ok := byTopic[o.Type()]; !ok {
				topics = append(topics, o.Type())
			}
			byTopic[o.Type()] = append(byTopic[o.Type()], entry{c, o})
		}
	}
	// unpublished is the first call with an output not known published,
	// over the topics from k on, with failed's entries from n on.
	unpublished := func(k, n int) int {
		first := len(batch)
		for i, topic := range topics[k:] {
			es := byTopic[topic]
			if i == 0 {
				es = es[n:]
			}
			for _, e := range es {
				first = min(first, e.call)
			}
		}
		return first
	}
	// The broker refuses a request when a later holder of the lock
	// already published to its topic (this node paused after its Check).
	lock := batch[0].j.lease.Group
	if d.cfg.UnsafeNoFencing {
		lock = ""
	}
	for k, topic := range topics {
		from := unpublished(k, 0)
		if !d.cfg.UnsafeNoFencing {
			for _, t := range batch[from:] {
				if err := t.j.lease.Check(ctx); err != nil {
					d.failTurns(batch, from, err)
					return
				}
			}
		}
		es := byTopic[topic]
		run := make([]*event.Event, len(es))
		for i, e := range es {
			run[i] = e.o
		}
		n, err := publish.Fenced(ctx, d.Pub, topic, lock, run)
		for _, e := range es[:n] {
			batch[e.call].w.m.Outputs.Inc()
			batch[e.call].j.outputs++
		}
		switch {
		case errors.Is(err, publish.ErrFenced):
			d.failTurns(batch, unpublished(k, n), fmt.Errorf("%w: %w", grouplock.ErrStale, err))
			return
		case err != nil:
			d.failTurns(batch, unpublished(k, n), fmt.Errorf("%w: %w", errPublish, err))
			return
		}
	}
	for _, t := range batch {
		t.j.r.outcome = outcomeDone
	}
}

// errPublish marks a publish that failed (not a Check).
var errPublish = errors.New("publish failed")

// failTurns gives batch[from] and every call after it the outcome of err
// (a Check's or a publish's); the calls before it are done.
func (d *Dispatcher) failTurns(batch []*turn, from int, err error) {
	for i, t := range batch {
		r := t.j.r
		switch {
		case i < from:
			r.outcome = outcomeDone
		case errors.Is(err, errPublish):
			r.outcome, r.reason, r.err = outcomeFailed, deadletter.ReasonPublishFailed, err
		case errors.Is(err, grouplock.ErrStale):
			d.stats.staleRefused.Add(1)
			t.w.m.StaleRefused.Inc()
			r.outcome, r.reason, r.err = outcomeFailed, deadletter.ReasonStaleLock, fmt.Errorf("outputs refused: %w", err)
		default:
			// A store error while checking: not an attempt, as a lock
			// not taken.
			r.outcome, r.reason, r.err = outcomeDeferred, deadletter.ReasonLockError, err
		}
	}
}
