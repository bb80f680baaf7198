package dotnet

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/childproc"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
)

// Instance is one loaded worker: Config.Processes host processes with the
// same code, each serving one call at a time, and up to its maxProcs while
// its events are slow (started on demand, retired when idle).
type Instance struct {
	e       *Engine
	spec    engines.Spec
	pool    *procpool.Pool[*proc]
	started atomic.Bool // the pool's first Start happened (takes a parked host)
	// maxProcs bounds its hosts (Engine.maxProcesses); lastEvent is how
	// long its last event took (ns): a slow one lets a waiting call start
	// another host.
	maxProcs  int
	lastEvent atomic.Int64
}

var (
	_ engines.Instance   = (*Instance)(nil)
	_ engines.Concurrent = (*Instance)(nil)
)

// MaxCalls implements engines.Concurrent: the most hosts it may have, so
// the dispatcher hands it enough calls to start them (a grouped worker
// still gets one at a time).
func (in *Instance) MaxCalls() int { return in.maxProcs }

// noteEvent records how long an event took: a slow one lets the calls
// waiting for a busy host start another (Config.MaxProcesses).
func (in *Instance) noteEvent(d time.Duration) {
	in.lastEvent.Store(int64(d))
	if d > in.e.cfg.SlowEvent {
		in.pool.Wake()
	}
}

func newInstance(e *Engine, spec engines.Spec, w *workerCode, key procpool.Key) *Instance {
	in := &Instance{e: e, spec: spec, maxProcs: e.maxProcesses(spec)}
	in.pool = procpool.New(procpool.Config[*proc]{
		Size: in.maxProcs,
		// Hosts beyond Config.Processes start when every one is busy and a
		// call waits, for slow events only; they are retired when idle.
		Warm:       e.cfg.Processes,
		IdleRetire: e.cfg.IdleRetire,
		ParkIdle:   e.cfg.ParkAfter,
		Grow:       func() bool { return time.Duration(in.lastEvent.Load()) > e.cfg.SlowEvent },
		Start: func(ctx context.Context) (*proc, error) {
			if !in.started.Swap(true) {
				// The first start of a Load: the host its Check parked.
				if p, ok := e.parking.TakeFor(key, in.pool, (*proc).Healthy); ok {
					return p, nil
				}
			}
			return e.startLoaded(ctx, spec, w, in.pool)
		},
		Grace:     closeGrace,
		Logger:    spec.Logger,
		Name:      ".NET worker host",
		LogAttrs:  []any{"worker_id", spec.WorkerID},
		OnRestart: e.cfg.OnRestart,
	})
	return in
}

// Process implements engines.Instance: the call waits for a free host
// (bounded by ctx), which gets at most the Spec timeout. A timed-out or
// crashed host is killed and restarted in the background.
func (in *Instance) Process(ctx context.Context, ev *event.Event) ([]event.Event, error) {
	if ev == nil {
		return nil, errors.New("dotnet engine: nil event")
	}
	s, err := in.pool.Acquire(ctx)
	if err != nil {
		if errors.Is(err, procpool.ErrClosed) {
			return nil, ErrClosed
		}
		return nil, engines.ContextError(ctx, "dotnet", "waiting for a free worker host")
	}
	start := time.Now()
	deadline := start.Add(in.spec.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	p, err := in.pool.ProcBy(ctx, s, deadline)
	if err != nil {
		in.pool.Release(s)
		return nil, fmt.Errorf("%w: the worker host could not be restarted: %w", engines.ErrWorkerFailed, err)
	}
	// The call's own time starts now (a host replaced meanwhile is not
	// charged to it).
	start = time.Now()
	deadline = start.Add(in.spec.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	p.startFrame(kindEvent)
	if err := event.WriteJson(ev, frameWriter{p}); err != nil {
		in.pool.Release(s)
		return nil, fmt.Errorf("dotnet engine: encoding the input event: %w", err)
	}
	if !p.Arm(ctx, deadline) {
		in.pool.Release(s)
		return nil, fmt.Errorf("%w: the deadline passed before the call started", engines.ErrTimeout)
	}
	var kind byte
	var payload []byte
	err = p.sendFrame()
	if err == nil {
		kind, payload, err = p.readFrame()
	}
	for err == nil && kind == kindGateway {
		// The call's deadline and Close end the gateway call too.
		var reply []byte
		if reply, err = in.serveGateway(ctx, p, deadline, payload); err != nil {
			break
		}
		if err = p.writeFrame(kindGatewayReply, reply); err == nil {
			kind, payload, err = p.readFrame()
		}
	}
	p.Disarm()
	if err == nil && (kind == kindResult || kind == kindError) {
		var out []event.Event
		var werr error
		if kind == kindResult {
			out, werr = wire.DecodeOutputs(payload, p.maxReply)
		} else {
			werr = wire.DecodeError(engines.ErrWorkerFailed, payload)
		}
		in.noteEvent(time.Since(start))
		if p.Healthy() {
			in.pool.Release(s)
		} else {
			in.pool.Replace(s, "killed at the deadline")
		}
		return out, werr
	}
	reason, cerr := p.CallFailure(ctx, names, in.pool.Killed(), kind, err, deadline.Sub(start))
	in.pool.Replace(s, reason)
	return nil, cerr
}

// serveGateway serves one gateway call of p's worker for the call made
// with ctx, on a context that also ends at the call's deadline and when
// the instance is closed: a backend call cannot outlive the call (its
// timeout, its retry) or Close. When the deadline ended it, the call is a
// timeout (whichever of the gateway and the timer saw it first): the host
// is marked and killed, and the error ends the round trip.
func (in *Instance) serveGateway(ctx context.Context, p *proc, deadline time.Time, payload []byte) ([]byte, error) {
	reply, expired := wire.ServeGatewayUntil(ctx, in.pool.Context(), deadline, in.e.cfg.Gateway, in.spec.GatewayTargets, payload)
	if expired {
		p.MarkTimedOut()
		p.Kill()
		return nil, childproc.ErrGone
	}
	return reply, nil
}

// Close implements engines.Instance: it waits for calls in flight until
// ctx ends, then kills their hosts; idle hosts get EOF and a short grace
// period. Every process is reaped before Close returns.
func (in *Instance) Close(ctx context.Context) error {
	err := in.pool.Close(ctx)
	if errors.Is(err, procpool.ErrInFlight) {
		return fmt.Errorf("dotnet engine: %w", err)
	}
	return err
}
