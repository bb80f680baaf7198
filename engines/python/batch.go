package python

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
)

// Batches. Under load several calls of one Instance wait for its process.
// Sending each event in its own round trip wakes the runner and the node
// once per event each way, and on small VMs a wake-up costs more than a
// small event's work. So the first waiting caller to get a process (the
// leader) takes the other waiting calls along: it writes all their events
// in one write, as consecutive 'E' frames, and reads one reply per event
// in order. The runner holds back a reply while the next request is
// already in its buffer and writes the held replies together (runner.py,
// _send), so a batch costs about one wake-up each way.
//
// Semantics stay those of single calls: each event gets the worker's whole
// timeout, measured from the previous reply (it cannot have started
// earlier); each caller gets its own outputs or error and returns as soon
// as its reply is in; a gateway call answers for the event it belongs to,
// under that call's ctx (its fence). Only calls with the same cancellation
// (ctx.Done()) share a batch, so one cancellation ends exactly its calls,
// and a stop (engines.GiveBack) gives back the calls a leader took along
// but has not sent yet. An event's time starts when the reply before it is
// in, before that reply is decoded.
//
// When a batch fails half-way (a timeout or a crash), which of the
// unanswered events caused it is unknown: the runner may have finished one
// whose reply it still held. If only one event was unanswered, the failure
// is its own. Otherwise none of them is blamed: each runs again alone on
// the restarted process, and the one that fails alone gets the error. An
// event that hangs inside a batch therefore takes up to twice the timeout
// before it fails, and an event finished just before a crash may run a
// second time (delivery is at least once anyway).

// maxBatchBytes bounds the request bytes of one batch: below the pipe's
// capacity (64 KiB), the batch's write never waits for the runner, which
// may meanwhile write replies the node reads only after the write. A bigger
// event goes alone.
const maxBatchBytes = 60 << 10

// call is one Process call that may run in another caller's batch.
type call struct {
	ev       *event.Event
	ctx      context.Context
	giveBack <-chan struct{} // engines.GiveBack(ctx)
	// taken is closed when a leader takes the call over; done is then set
	// (under Instance.mu) and closed once out and err are final.
	taken    chan struct{}
	done     chan struct{}
	out      []event.Event
	err      error
	finished bool
}

func (c *call) finish(out []event.Event, err error) {
	c.out, c.err, c.finished = out, err, true
	if c.done != nil {
		close(c.done)
	}
}

// processBatched is Process with batching: the call waits for a process or
// for another caller to take it over, whichever comes first.
func (in *Instance) processBatched(ctx context.Context, ev *event.Event) ([]event.Event, error) {
	c := &call{ev: ev, ctx: ctx, giveBack: engines.GiveBack(ctx), taken: make(chan struct{})}
	in.mu.Lock()
	in.waiting = append(in.waiting, c)
	in.mu.Unlock()
	s, err := in.pool.AcquireUnless(ctx, c.taken, c.giveBack)
	in.mu.Lock()
	if c.done != nil {
		// Taken over by a leader; a slot won meanwhile goes back.
		in.mu.Unlock()
		if err == nil {
			in.pool.Release(s)
		}
		<-c.done
		return c.out, c.err
	}
	in.unwait(c)
	if errors.Is(err, procpool.ErrStopped) {
		in.mu.Unlock()
		return nil, fmt.Errorf("python engine: %w", engines.ErrGivenBack)
	}
	if err != nil {
		in.mu.Unlock()
		return nil, acquireError(ctx, err)
	}
	calls := in.takeWaiting(c)
	in.mu.Unlock()
	in.runCalls(ctx, s, calls)
	return c.out, c.err
}

// unwait removes c from the waiting list; in.mu is held.
func (in *Instance) unwait(c *call) {
	for i, w := range in.waiting {
		if w == c {
			in.waiting = append(in.waiting[:i], in.waiting[i+1:]...)
			return
		}
	}
}

// takeWaiting returns the leader's call and the waiting calls it can take
// along (same cancellation, not given back, up to MaxBatch in all; none
// after a slow event), oldest first, and marks those taken; in.mu is held.
func (in *Instance) takeWaiting(leader *call) []*call {
	calls := []*call{leader}
	if time.Duration(in.lastEvent.Load()) > in.e.cfg.SlowEvent {
		return calls
	}
	done := leader.ctx.Done()
	kept := in.waiting[:0]
	for _, w := range in.waiting {
		if len(calls) < in.e.cfg.MaxBatch && w.ctx.Done() == done && !isClosed(w.giveBack) {
			w.done = make(chan struct{})
			close(w.taken)
			calls = append(calls, w)
			continue
		}
		kept = append(kept, w)
	}
	clear(in.waiting[len(kept):])
	in.waiting = kept
	if in.e.cfg.MaxBatch > 1 && len(calls) >= in.e.cfg.MaxBatch {
		if in.fullBatches.Add(1) == SaturatedBatches {
			// The calls already waiting for a process ask Grow again.
			// (in.mu is held here; Wake takes only the pool's lock, and
			// the pool never takes in.mu: Grow reads atomics.)
			defer in.pool.Wake()
		}
	} else {
		in.fullBatches.Store(0)
	}
	return calls
}

// SaturatedBatches is how many full batches in a row make a fast worker
// saturated: its calls then may start a process beyond Config.Processes
// (up to its maximum), as a slow event's do, so that a worker with more
// traffic than one runner keeps up uses another core; the process is
// retired once idle (Config.IdleRetire). A burst of a few batches does not
// start one.
const SaturatedBatches = 4

// isClosed reports whether ch is closed (false for nil).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// runCalls runs calls (the leader's first) on the slot's process and on the
// processes it acquires after, and finishes every one of them.
func (in *Instance) runCalls(ctx context.Context, s *procpool.Slot[*proc], calls []*call) {
	defer func() {
		// The callers waiting for a panicking leader are not left waiting.
		if r := recover(); r != nil {
			for _, c := range calls {
				if !c.finished {
					c.finish(nil, fmt.Errorf("%w: panic in the python engine: %v", engines.ErrWorkerFailed, r))
				}
			}
			panic(r)
		}
	}()
	alone := false // after a failed batch its unanswered calls run one by one
	for {
		var rest []*call
		if len(calls) == 1 || alone {
			out, err := in.run(calls[0].ctx, s, calls[0].ev)
			calls[0].finish(out, err)
			rest = calls[1:]
		} else {
			var failed bool
			rest, failed = in.runBatch(ctx, s, calls)
			alone = alone || failed
		}
		// The calls not sent yet wait for a process again; those given back
		// meanwhile (a stop) come back now instead of running after it.
		calls = givenBack(rest)
		var err error
		for len(calls) > 0 {
			s, err = in.pool.AcquireUnless(ctx, nil, calls[0].giveBack)
			if !errors.Is(err, procpool.ErrStopped) {
				break
			}
			calls = givenBack(calls)
		}
		if len(calls) == 0 {
			return
		}
		if err != nil {
			err = acquireError(ctx, err)
			for _, c := range calls {
				c.finish(nil, err)
			}
			return
		}
		if calls = givenBack(calls); len(calls) == 0 {
			in.pool.Release(s)
			return
		}
	}
}

// givenBack finishes the calls whose give-back channel closed (they have
// not started, or start again from the beginning) with ErrGivenBack and
// returns the others, in order, in the same backing array.
func givenBack(calls []*call) []*call {
	kept := calls[:0]
	for _, c := range calls {
		if isClosed(c.giveBack) {
			c.finish(nil, fmt.Errorf("python engine: %w", engines.ErrGivenBack))
			continue
		}
		kept = append(kept, c)
	}
	return kept
}

// runBatch sends as many of calls as fit in one batch to the slot's process
// and gives the slot back. It finishes the calls it has answers for and
// returns the others (not sent, or unanswered after a failure that may not
// be theirs; failed is then true).
func (in *Instance) runBatch(ctx context.Context, s *procpool.Slot[*proc], calls []*call) (rest []*call, failed bool) {
	// An event's deadline: the worker's timeout from when it can start
	// (from, the previous reply), or ctx's deadline if that is earlier.
	deadline := func(from time.Time) time.Time {
		d := from.Add(in.timeout)
		if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
			d = cd
		}
		return d
	}
	// A start of the slot's process is waited for until the first
	// event's deadline at most, as in run.
	p, err := in.pool.ProcBy(ctx, s, deadline(time.Now()))
	if err != nil {
		in.pool.Release(s)
		err = fmt.Errorf("%w: the worker process could not be restarted: %w", engines.ErrWorkerFailed, err)
		for _, c := range calls {
			c.finish(nil, err)
		}
		return nil, false
	}

	// Calls given back while the process started are not sent.
	calls = givenBack(calls)
	// Encode: one frame per event, until the batch is full.
	sent := make([]*call, 0, len(calls))
	p.wbuf.reset(kindEvent)
	p.wbuf.b = p.wbuf.b[:0]
	for i, c := range calls {
		off := len(p.wbuf.b)
		p.wbuf.b = append(p.wbuf.b, 0, 0, 0, 0, kindEvent)
		if err := event.WriteJson(c.ev, &p.wbuf); err != nil {
			p.wbuf.b = p.wbuf.b[:off]
			c.finish(nil, fmt.Errorf("python engine: encoding the input event: %w", err))
			continue
		}
		if len(sent) > 0 && len(p.wbuf.b) > maxBatchBytes {
			p.wbuf.b = p.wbuf.b[:off]
			rest = calls[i:]
			break
		}
		binary.LittleEndian.PutUint32(p.wbuf.b[off:], uint32(len(p.wbuf.b)-off-headerSize))
		sent = append(sent, c)
	}
	if len(sent) == 0 {
		in.pool.Release(s)
		return rest, false
	}

	if len(sent) > 1 {
		in.batched.Add(int64(len(sent)))
	}
	// Each event gets the whole timeout from the previous reply on.
	start := time.Now()
	if !p.Arm(ctx, deadline(start)) {
		in.pool.Release(s)
		err := fmt.Errorf("%w: the deadline passed before the call started", engines.ErrTimeout)
		for _, c := range sent {
			c.finish(nil, err)
		}
		return rest, false
	}
	err = p.writeAll()
	var kind byte
	var payload []byte
	answered := 0
	for err == nil && answered < len(sent) {
		if kind, payload, err = p.readFrame(); err != nil {
			break
		}
		c := sent[answered]
		switch kind {
		case kindGateway:
			if p.pending() {
				err = errProtocol
				continue
			}
			var reply []byte
			if reply, err = in.serveGateway(c.ctx, p, deadline(start), payload); err != nil {
				continue
			}
			p.wbuf.reset(kindGatewayReply)
			p.wbuf.Write(reply)
			err = p.writeFrame()
			continue
		case kindResult, kindError:
		default:
			err = errProtocol
			continue
		}
		// The next event runs from now on: its deadline moves before this
		// reply is decoded (a slow decode is not charged to it), and after
		// the last reply the deadline ends.
		answered++
		now := time.Now()
		in.noteEvent(now.Sub(start))
		start = now
		if answered < len(sent) {
			p.Rearm(deadline(start))
		} else {
			p.Disarm()
		}
		if kind == kindResult {
			c.finish(decodeOutputs(payload, p.maxReply))
		} else {
			c.finish(nil, wire.DecodeError(engines.ErrWorkerFailed, payload))
		}
	}
	p.Disarm()

	switch {
	case err == nil && !p.pending() && p.Healthy():
		in.pool.Release(s)
		return rest, false
	case err == nil && !p.pending():
		// The deadline or ctx fired just as the last reply came in.
		in.pool.Replace(s, "killed at the deadline")
		return rest, false
	}
	if errors.Is(err, errProtocol) {
		err = nil // failure reports the unexpected frame
	}
	reason, cerr := in.failure(ctx, p, kind, err, deadline(start).Sub(start))
	in.pool.Replace(s, reason)
	unanswered := sent[answered:]
	if len(unanswered) == 1 {
		unanswered[0].finish(nil, cerr)
		return rest, false
	}
	return append(unanswered, rest...), true
}

// decodeOutputs decodes a batched event's reply (a variable so that a test
// can make it slow).
var decodeOutputs = wire.DecodeOutputs

// errProtocol marks an unexpected frame in a batch's replies.
var errProtocol = errors.New("protocol error")

// writeAll writes the frames prepared in p.wbuf as they are.
func (p *proc) writeAll() error {
	_, err := p.ReqW.Write(p.wbuf.b)
	if errors.Is(err, syscall.EPIPE) {
		return errProcessGone
	}
	return err
}
