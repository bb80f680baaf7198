package python

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
)

// Concurrent calls of async def workers. A runner whose worker defines
// `async def process` (and whose MaxConcurrency is above 1) answers the
// load with asyncOK and from then on runs each event as a task on its event
// loop: it accepts the next event while others await. Every frame after
// the load then starts with a 4-byte little-endian tag naming its call:
//
//	E  node -> runner  tag, event             one call
//	C  node -> runner  tag                    cancel the call's task
//	R  runner -> node  tag, result            its outputs
//	X  runner -> node  tag, error             its error
//	G  runner -> node  tag, gwid, request     a gateway call of the call
//	g  node -> runner  gwid, answer           its answer
//
// Replies come in any order. One reader goroutine per runner reads them
// and hands each to its call. A call that passes its deadline (or whose
// ctx ends) returns ErrTimeout (or ctx's error) at once and its task is
// cancelled; the runner answers the cancellation like any end of the call.
// If it has not within Config.CancelGrace (a task that ignores the
// cancellation, an event loop blocked by a synchronous call), the runner
// is killed and every call in it fails, as a crash fails them. The
// Instance keeps one runner for such a worker, holding its pool slot while
// any call is in it, so that Close waits for them as for other calls.

// asyncOK is the load reply's payload of a runner that runs events
// concurrently.
const asyncOK = "async"

// kindCancel asks the runner to cancel a call's task.
const kindCancel = 'C'

// tagSize is the size of a call's tag (and of a gateway call's id).
const tagSize = 4

// asyncMux runs an Instance's calls on one runner at once.
type asyncMux struct {
	in  *Instance
	sem chan struct{} // bounds the calls in the runner (MaxConcurrency)
	acq chan struct{} // held by the call that acquires the slot

	mu    sync.Mutex
	slot  *procpool.Slot[*proc] // held while calls is not empty
	p     *proc
	calls map[uint32]*asyncCall
	next  uint32
	// failed is the restart reason once the runner failed under its calls:
	// the slot is then replaced, not released; gone is closed then.
	failed string
	gone   chan struct{}
}

// asyncCall is one call in the runner.
type asyncCall struct {
	ctx      context.Context
	deadline time.Time
	reply    chan asyncReply // buffered: the reader never waits
	// abandoned: the caller returned (timeout, cancellation); the runner's
	// answer is awaited only to know the task ended. kill then fires
	// after Config.CancelGrace.
	abandoned bool
	kill      *time.Timer
}

type asyncReply struct {
	out []event.Event
	err error
}

func newAsyncMux(in *Instance, maxConcurrency int) *asyncMux {
	return &asyncMux{
		in:    in,
		sem:   make(chan struct{}, max(maxConcurrency, 1)),
		acq:   make(chan struct{}, 1),
		calls: map[uint32]*asyncCall{},
	}
}

// process runs one call on the runner, waiting (bounded by ctx, a stop and
// Close) while MaxConcurrency calls run.
func (m *asyncMux) process(ctx context.Context, ev *event.Event) ([]event.Event, error) {
	giveBack := engines.GiveBack(ctx)
	select {
	case m.sem <- struct{}{}:
	default:
		select {
		case m.sem <- struct{}{}:
		case <-ctx.Done():
			return nil, engines.ContextError(ctx, "python", "waiting for a free worker process")
		case <-giveBack:
			return nil, fmt.Errorf("python engine: %w", engines.ErrGivenBack)
		case <-m.in.pool.Context().Done():
			return nil, ErrClosed
		}
	}
	defer func() { <-m.sem }()

	var frame frameBuf
	frame.reset(kindEvent)
	frame.b = append(frame.b, 0, 0, 0, 0) // the tag, below
	if err := event.WriteJson(ev, &frame); err != nil {
		return nil, fmt.Errorf("python engine: encoding the input event: %w", err)
	}
	tag, c, p, err := m.join(ctx, giveBack)
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(frame.b[headerSize:], tag)
	binary.LittleEndian.PutUint32(frame.b, uint32(len(frame.b)-headerSize))
	if err := p.writeLocked(frame.b); err != nil {
		// The runner is gone: its reader fails the call (below).
		_ = err
	}
	t := time.NewTimer(time.Until(c.deadline))
	defer t.Stop()
	select {
	case r := <-c.reply:
		return r.out, r.err
	case <-t.C:
		if m.abandon(p, tag, c) {
			return nil, fmt.Errorf("%w after %v", engines.ErrTimeout, m.in.timeout.Round(time.Millisecond))
		}
	case <-ctx.Done():
		if m.abandon(p, tag, c) {
			return nil, engines.ContextError(ctx, "python", "the call was cancelled")
		}
	}
	r := <-c.reply // answered just before it was abandoned
	return r.out, r.err
}

// join registers a call in the runner, acquiring the pool's slot (and its
// runner, started if need be) when no call holds it.
func (m *asyncMux) join(ctx context.Context, giveBack <-chan struct{}) (uint32, *asyncCall, *proc, error) {
	for {
		m.mu.Lock()
		if m.slot != nil && m.failed == "" {
			tag, c := m.addLocked(ctx)
			p := m.p
			m.mu.Unlock()
			return tag, c, p, nil
		}
		m.mu.Unlock()
		select {
		case m.acq <- struct{}{}:
		case <-ctx.Done():
			return 0, nil, nil, engines.ContextError(ctx, "python", "waiting for a free worker process")
		case <-giveBack:
			return 0, nil, nil, fmt.Errorf("python engine: %w", engines.ErrGivenBack)
		}
		m.mu.Lock()
		held := m.slot != nil
		m.mu.Unlock()
		if held {
			<-m.acq
			// A failed runner's slot is being given up: wait for it.
			if m.waitFailed(ctx) != nil {
				return 0, nil, nil, engines.ContextError(ctx, "python", "waiting for a free worker process")
			}
			continue
		}
		tag, c, p, err := m.acquire(ctx, giveBack)
		<-m.acq
		return tag, c, p, err
	}
}

// waitFailed waits until the slot of a failed runner is given up (its
// reader does that as soon as it sees the runner die).
func (m *asyncMux) waitFailed(ctx context.Context) error {
	m.mu.Lock()
	gone := m.gone
	busy := m.slot != nil && m.failed != ""
	m.mu.Unlock()
	if !busy || gone == nil {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-gone:
		return nil
	}
}

// acquire takes the pool's slot and its runner for a first call.
func (m *asyncMux) acquire(ctx context.Context, giveBack <-chan struct{}) (uint32, *asyncCall, *proc, error) {
	s, err := m.in.pool.AcquireUnless(ctx, nil, giveBack)
	if errors.Is(err, procpool.ErrStopped) {
		return 0, nil, nil, fmt.Errorf("python engine: %w", engines.ErrGivenBack)
	}
	if err != nil {
		return 0, nil, nil, acquireError(ctx, err)
	}
	deadline := time.Now().Add(m.in.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	p, err := m.in.pool.ProcBy(ctx, s, deadline)
	if err != nil {
		m.in.pool.Release(s)
		return 0, nil, nil, fmt.Errorf("%w: the worker process could not be restarted: %w", engines.ErrWorkerFailed, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p.readerGone {
		// It died idle after ProcBy looked: replaced for the next call.
		m.in.pool.Replace(s, "exited while idle")
		return 0, nil, nil, fmt.Errorf("%w: the worker process exited while idle", engines.ErrWorkerFailed)
	}
	m.slot, m.p, m.failed = s, p, ""
	if !p.readerOn {
		p.readerOn = true
		go m.read(p)
	}
	tag, c := m.addLocked(ctx)
	return tag, c, p, nil
}

// addLocked registers a call; m.mu is held.
func (m *asyncMux) addLocked(ctx context.Context) (uint32, *asyncCall) {
	m.next++
	deadline := time.Now().Add(m.in.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	c := &asyncCall{ctx: ctx, deadline: deadline, reply: make(chan asyncReply, 1)}
	m.calls[m.next] = c
	return m.next, c
}

// abandon gives up waiting for a call: its task is cancelled, and the
// runner is killed unless the task ends within CancelGrace. It returns
// false when the reply is in already (the caller takes it).
func (m *asyncMux) abandon(p *proc, tag uint32, c *asyncCall) bool {
	m.mu.Lock()
	if m.calls[tag] != c || m.p != p {
		m.mu.Unlock()
		return false
	}
	c.abandoned = true
	c.kill = time.AfterFunc(m.in.e.cfg.CancelGrace, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.calls[tag] == c && m.p == p && m.failed == "" {
			m.failed = "a cancelled call did not end"
			m.gone = make(chan struct{})
			p.Kill()
		}
	})
	m.mu.Unlock()
	var b [headerSize + tagSize]byte
	binary.LittleEndian.PutUint32(b[:], tagSize)
	b[4] = kindCancel
	binary.LittleEndian.PutUint32(b[headerSize:], tag)
	_ = p.writeLocked(b[:])
	return true
}

// finishLocked removes a call and hands it its reply; the slot goes back
// once no call is left. m.mu is held.
func (m *asyncMux) finishLocked(tag uint32, r asyncReply) {
	c := m.calls[tag]
	if c == nil {
		return
	}
	delete(m.calls, tag)
	if c.kill != nil {
		c.kill.Stop()
	}
	if !c.abandoned {
		c.reply <- r
	}
	if len(m.calls) == 0 && m.slot != nil && m.failed == "" {
		m.in.pool.Release(m.slot)
		m.slot, m.p = nil, nil
	}
}

// read reads p's replies until it exits, for as long as p lives.
func (m *asyncMux) read(p *proc) {
	for {
		kind, payload, err := p.readFrame()
		if err == nil && len(payload) < tagSize {
			err = errProtocol
		}
		if err != nil {
			m.readerDone(p, kind, err)
			return
		}
		tag := binary.LittleEndian.Uint32(payload)
		switch kind {
		case kindResult:
			out, werr := wire.DecodeOutputs(payload[tagSize:], p.maxReply)
			m.mu.Lock()
			m.finishLocked(tag, asyncReply{out, werr})
			m.mu.Unlock()
		case kindError:
			werr := wire.DecodeError(engines.ErrWorkerFailed, payload[tagSize:])
			m.mu.Lock()
			m.finishLocked(tag, asyncReply{nil, werr})
			m.mu.Unlock()
		case kindGateway:
			if len(payload) < 2*tagSize {
				m.readerDone(p, kind, errProtocol)
				return
			}
			m.gateway(p, tag, binary.LittleEndian.Uint32(payload[tagSize:]), append([]byte(nil), payload[2*tagSize:]...))
		default:
			m.readerDone(p, kind, errProtocol)
			return
		}
	}
}

// gateway serves a gateway call of call tag, under its ctx (its fence)
// until its deadline, and answers it as gwid.
func (m *asyncMux) gateway(p *proc, tag, gwid uint32, req []byte) {
	m.mu.Lock()
	c := m.calls[tag]
	m.mu.Unlock()
	answer := func(reply []byte) {
		b := make([]byte, headerSize+tagSize, headerSize+tagSize+len(reply))
		b[4] = kindGatewayReply
		binary.LittleEndian.PutUint32(b[headerSize:], gwid)
		b = append(b, reply...)
		binary.LittleEndian.PutUint32(b, uint32(len(b)-headerSize))
		_ = p.writeLocked(b)
	}
	if c == nil || c.abandoned {
		answer(append([]byte{1}, "the call this gateway call belongs to has ended"...))
		return
	}
	go func() {
		reply, expired := wire.ServeGatewayUntil(c.ctx, m.in.pool.Context(), c.deadline, m.in.e.cfg.Gateway, m.in.spec.GatewayTargets, req)
		if expired {
			reply = append([]byte{1}, "the call's deadline passed during the gateway call"...)
		}
		answer(reply)
	}()
}

// readerDone ends p's reader: p died, was killed, or broke the protocol
// (then it is killed). Every call in it fails and its slot is replaced.
func (m *asyncMux) readerDone(p *proc, kind byte, err error) {
	p.Kill()
	m.mu.Lock()
	defer m.mu.Unlock()
	p.readerGone = true
	if m.p != p {
		return // it died idle: ProcBy replaces it for the next call
	}
	reason := m.failed
	var cerr error
	if errors.Is(err, errProtocol) {
		err = nil // CallFailure names the unexpected frame
	}
	killedReason, kerr := p.CallFailure(context.Background(), names, m.in.pool.Killed(), kind, err, m.in.timeout)
	if reason == "" {
		reason, cerr = killedReason, kerr
	} else {
		cerr = fmt.Errorf("%w: the worker process was killed because a timed-out or cancelled call did not end within %v of its cancellation (a call that blocks the event loop?)",
			engines.ErrWorkerFailed, m.in.e.cfg.CancelGrace)
	}
	m.failed = reason
	for tag := range m.calls {
		m.finishLocked(tag, asyncReply{nil, cerr})
	}
	m.in.pool.Replace(m.slot, reason)
	m.slot, m.p, m.failed = nil, nil, ""
	if m.gone != nil {
		close(m.gone)
		m.gone = nil
	}
}

// writeLocked writes whole frames to p's request pipe: calls, cancellations
// and gateway answers of several calls share it.
func (p *proc) writeLocked(b []byte) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	_, err := p.ReqW.Write(b)
	if errors.Is(err, errProcessGone) {
		return errProcessGone
	}
	return err
}
