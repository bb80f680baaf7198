package python

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
)

// Instance is one loaded worker: Config.Processes runner subprocesses with the
// same code (up to Config.MaxProcesses on demand), each serving one call at
// a time, or, for an async def worker, one runner running up to
// Config.MaxConcurrency calls at once on its event loop (mux.go).
type Instance struct {
	e       *Engine
	spec    engines.Spec
	interp  string
	code    []byte
	timeout time.Duration
	pool    *procpool.Pool[*proc]

	mu      sync.Mutex
	waiting []*call // calls waiting for a process, oldest first (batch.go)
	batched atomic.Int64
	// lastEvent is how long the last answered event took (batch.go).
	lastEvent atomic.Int64
	// fullBatches counts the batches in a row that took MaxBatch calls
	// (batch.go): a backlog that outlasts a burst (saturated).
	fullBatches atomic.Int64
	started     atomic.Bool // the pool's first Start happened (takes a parked runner)

	// async: the runners run events concurrently (set when one starts;
	// the code decides); mux serves the calls then.
	async    atomic.Bool
	mux      *asyncMux
	maxProcs int
}

var (
	_ engines.Instance   = (*Instance)(nil)
	_ engines.Batcher    = (*Instance)(nil)
	_ engines.Concurrent = (*Instance)(nil)
)

// MaxCalls implements engines.Concurrent: an async def worker's
// MaxConcurrency, a plain worker's most processes.
func (in *Instance) MaxCalls() int {
	if in.async.Load() {
		return cap(in.mux.sem)
	}
	return in.maxProcs
}

// CallsToFill implements engines.Batcher: one full batch per process in
// the runners, one more waiting to go (0 with batches off).
func (in *Instance) CallsToFill() int {
	if in.e.cfg.MaxBatch <= 1 {
		return 0
	}
	return 2 * in.e.cfg.MaxBatch * in.e.cfg.Processes
}

func newInstance(e *Engine, spec engines.Spec, interp string, code []byte) *Instance {
	in := &Instance{
		e:        e,
		spec:     spec,
		interp:   interp,
		code:     append([]byte(nil), code...),
		timeout:  spec.Timeout,
		maxProcs: e.maxProcesses(spec),
	}
	in.mux = newAsyncMux(in, e.maxConcurrency(spec))
	// Until an event has shown it slow, a worker counts as fast: a fast
	// worker's first burst goes in batches on its warm processes instead
	// of starting up to MaxProcesses runners (8.7 MiB each) it does not
	// need; the first slow event lets the waiting calls grow the pool.
	in.lastEvent.Store(0)
	in.pool = procpool.New(procpool.Config[*proc]{
		Size: in.maxProcs,
		// Processes beyond Config.Processes start when every one is busy
		// and a call waits, for slow events, or for fast ones once full
		// batches have come SaturatedBatches times in a row (a backlog a
		// burst does not make: a fast worker's burst goes in batches on
		// its warm processes); they are retired when idle.
		Warm:       e.cfg.Processes,
		IdleRetire: e.cfg.IdleRetire,
		ParkIdle:   e.cfg.ParkAfter,
		Grow: func() bool {
			return !in.async.Load() && (time.Duration(in.lastEvent.Load()) > e.cfg.SlowEvent ||
				in.fullBatches.Load() >= SaturatedBatches)
		},
		Start: func(ctx context.Context) (*proc, error) {
			if !in.started.Swap(true) {
				// The first start of a Load: the runner its Check parked.
				if p, ok := e.parking.TakeFor(procpool.KeyOf(spec, in.code), in.pool, (*proc).idle); ok {
					in.async.Store(p.async)
					return p, nil
				}
			}
			p, err := e.startLoaded(ctx, spec, interp, in.code, in.pool)
			if err == nil {
				in.async.Store(p.async)
			}
			return p, err
		},
		Grace:     closeGrace,
		Logger:    spec.Logger,
		Name:      "python worker process",
		LogAttrs:  []any{"worker_id", spec.WorkerID},
		OnRestart: e.cfg.OnRestart,
	})
	return in
}

// Process implements engines.Instance. The call waits for a free process
// (bounded by ctx); the worker then gets at most the Spec timeout, or less if
// ctx ends earlier. A timed-out or crashed process is killed and restarted in
// the background with the same code.
func (in *Instance) Process(ctx context.Context, ev *event.Event) ([]event.Event, error) {
	if ev == nil {
		return nil, errors.New("python engine: nil event")
	}
	if in.async.Load() {
		return in.mux.process(ctx, ev)
	}
	if in.e.cfg.MaxBatch > 1 {
		return in.processBatched(ctx, ev)
	}
	s, err := in.pool.AcquireUnless(ctx, nil, engines.GiveBack(ctx))
	if errors.Is(err, procpool.ErrStopped) {
		return nil, fmt.Errorf("python engine: %w", engines.ErrGivenBack)
	}
	if err != nil {
		return nil, acquireError(ctx, err)
	}
	return in.run(ctx, s, ev)
}

// acquireError is the call's error when no process could be had.
func acquireError(ctx context.Context, err error) error {
	if errors.Is(err, procpool.ErrClosed) {
		return ErrClosed
	}
	return engines.ContextError(ctx, "python", "waiting for a free worker process")
}

// run makes one call on the slot's process; it gives the slot back (possibly
// after a restart) before it returns.
func (in *Instance) run(ctx context.Context, s *procpool.Slot[*proc], ev *event.Event) ([]event.Event, error) {
	start := time.Now()
	deadline := start.Add(in.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	p, err := in.pool.ProcBy(ctx, s, deadline)
	if err != nil {
		in.pool.Release(s)
		return nil, fmt.Errorf("%w: the worker process could not be restarted: %w", engines.ErrWorkerFailed, err)
	}
	// The call's own time starts now (a process replaced meanwhile is
	// not charged to it).
	start = time.Now()
	deadline = start.Add(in.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}

	p.wbuf.reset(kindEvent)
	if err := event.WriteJson(ev, &p.wbuf); err != nil {
		in.pool.Release(s)
		return nil, fmt.Errorf("python engine: encoding the input event: %w", err)
	}
	if !p.Arm(ctx, deadline) {
		in.pool.Release(s)
		return nil, fmt.Errorf("%w: the deadline passed before the call started", engines.ErrTimeout)
	}
	spun := p.startSpin(in.e.cfg.SpinWait)
	err = p.writeFrame()
	var kind byte
	var payload []byte
	if err == nil {
		kind, payload, err = p.readFrame()
	}
	for err == nil && kind == kindGateway && !p.pending() {
		// The worker calls a backend through the node, until the call's
		// deadline at the latest (the armed timer bounds the event).
		var reply []byte
		if reply, err = in.serveGateway(ctx, p, deadline, payload); err != nil {
			break
		}
		p.wbuf.reset(kindGatewayReply)
		p.wbuf.Write(reply)
		if err = p.writeFrame(); err == nil {
			kind, payload, err = p.readFrame()
		}
	}
	p.endSpin(spun)
	p.Disarm()

	if err == nil && (kind == kindResult || kind == kindError) && !p.pending() {
		var out []event.Event
		var werr error
		if kind == kindResult {
			out, werr = wire.DecodeOutputs(payload, p.maxReply)
		} else {
			werr = wire.DecodeError(engines.ErrWorkerFailed, payload)
		}
		// Before the slot goes back: the next caller decides on batching.
		in.noteEvent(time.Since(start))
		if p.Healthy() {
			in.pool.Release(s)
		} else {
			// The deadline or ctx fired just as the reply came in: the reply
			// is good, the process is being killed.
			in.pool.Replace(s, "killed at the deadline")
		}
		return out, werr
	}

	// The process is unusable: say why, and replace it.
	in.noteEvent(time.Since(start))
	reason, cerr := in.failure(ctx, p, kind, err, deadline.Sub(start))
	in.pool.Replace(s, reason)
	return nil, cerr
}

// noteEvent records how long an event took: a slow one lets the calls
// waiting for a busy process start another (Config.MaxProcesses).
func (in *Instance) noteEvent(d time.Duration) {
	in.lastEvent.Store(int64(d))
	if d > in.e.cfg.SlowEvent {
		in.pool.Wake()
	}
}

// serveGateway serves one gateway call of p's worker for the call made
// with ctx: on a context that also ends at the call's deadline and when
// the instance is closed, so that a backend call cannot outlive the call
// (its timeout, its retry) or Close. When the deadline ended it, the call
// is a timeout (whichever of the gateway and the timer saw it first): the
// process is marked and killed, and the error ends the round trip.
func (in *Instance) serveGateway(ctx context.Context, p *proc, deadline time.Time, payload []byte) ([]byte, error) {
	reply, expired := wire.ServeGatewayUntil(ctx, in.pool.Context(), deadline, in.e.cfg.Gateway, in.spec.GatewayTargets, payload)
	if expired {
		p.MarkTimedOut()
		p.Kill()
		return nil, errProcessGone
	}
	return reply, nil
}

// failure says why a round trip on p failed (err from the pipes, or nil
// after an unexpected frame of kind) as a restart reason and the call's
// error; budget is how long the call was given.
func (in *Instance) failure(ctx context.Context, p *proc, kind byte, err error, budget time.Duration) (string, error) {
	return p.CallFailure(ctx, names, in.pool.Killed(), kind, err, budget)
}

// Close implements engines.Instance. It waits for calls in flight until ctx
// ends, then kills their processes; idle runners get EOF on their request
// pipe and a short grace period to exit before they are killed. Every process
// is reaped before Close returns.
func (in *Instance) Close(ctx context.Context) error {
	err := in.pool.Close(ctx)
	if errors.Is(err, procpool.ErrInFlight) {
		return fmt.Errorf("python engine: %w", err)
	}
	return err
}
