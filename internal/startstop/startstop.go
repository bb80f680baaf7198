// Package startstop gives everything that runs in a node one shape, after
// riverqueue/river's startstop: a Service starts, says it started, and
// stops. Func turns a loop or a start/stop pair into one, and Group starts
// a list of them in order and stops them in reverse, so that a command's
// main reads as that list.
package startstop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Service is something that runs in a node.
//
// Start begins it on ctx (a loop ends when ctx ends, unless it is
// Detached) and returns once it runs. Started is closed once Start
// succeeded. Stop ends it and returns once it has ended; Stop on a service
// that is not running does nothing.
type Service interface {
	Start(ctx context.Context) error
	Started() <-chan struct{}
	Stop()
}

// Compile-time checks: both shapes are Services.
var (
	_ Service = (*Func)(nil)
	_ Service = (*Group)(nil)
)

// Func is a Service made of functions: an optional start, an optional loop
// run on its own context, and an optional stop. Build one with Loop, Funcs
// or OnStop.
type Func struct {
	name     string
	start    func(context.Context) error
	run      func(context.Context)
	stop     func()
	detached bool
	within   time.Duration

	mu      sync.Mutex
	running bool
	started chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
}

// Loop is a Service that runs run on a context of its own: Start launches
// it, Stop cancels that context and waits for run to return.
func Loop(name string, run func(ctx context.Context)) *Func {
	return &Func{name: name, run: run, started: make(chan struct{})}
}

// Funcs is a Service that calls start on Start and, once Start succeeded,
// stop on Stop. Either may be nil.
func Funcs(name string, start func(ctx context.Context) error, stop func()) *Func {
	return &Func{name: name, start: start, stop: stop, started: make(chan struct{})}
}

// WithStart adds a start function, run by Start before the loop (on the
// context Start is given, even when the loop is Detached).
func (f *Func) WithStart(start func(ctx context.Context) error) *Func { f.start = start; return f }

// OnStop is a Service with nothing to start and stop to do at its place in
// a Group's stop order.
func OnStop(name string, stop func()) *Func { return Funcs(name, nil, stop) }

// Detached makes the loop outlive the context Start is given: only Stop
// ends it (for loops that must run on after the shutdown signal, such as a
// node's membership heartbeat).
func (f *Func) Detached() *Func { f.detached = true; return f }

// StopWithin sets how long a Group waits for this service's Stop, in
// place of the Group's StopTimeout (for a stop with a bound of its own,
// such as a drain with its grace period).
func (f *Func) StopWithin(d time.Duration) *Func { f.within = d; return f }

// Name is the name the service was built with.
func (f *Func) Name() string { return f.name }

// StopTimeout is the bound StopWithin set (0: the Group's).
func (f *Func) StopTimeout() time.Duration { return f.within }

// Start runs the start function, then launches the loop.
func (f *Func) Start(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running {
		return fmt.Errorf("%s: started twice (Stop it first)", f.name)
	}
	if f.start != nil {
		if err := f.start(ctx); err != nil {
			return err
		}
	}
	if f.detached {
		ctx = context.WithoutCancel(ctx)
	}
	if f.run != nil {
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		f.cancel, f.done = cancel, done
		go func() { defer close(done); f.run(lctx) }()
	}
	f.running = true
	close(f.started)
	return nil
}

// Started is closed once Start succeeded.
func (f *Func) Started() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started
}

// Stop cancels the loop and waits for it, then runs the stop function. It
// does nothing unless the service runs; afterwards it may be started again.
func (f *Func) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running {
		return
	}
	if f.cancel != nil {
		f.cancel()
		<-f.done
		f.cancel, f.done = nil, nil
	}
	if f.stop != nil {
		f.stop()
	}
	f.running = false
	f.started = make(chan struct{})
}

// DefaultStopTimeout bounds each Stop of a Group whose StopTimeout is 0.
const DefaultStopTimeout = 30 * time.Second

// Group runs services as one: it starts them in order and stops them in
// reverse order, each Stop bounded. A Group is itself a Service.
type Group struct {
	// StopTimeout bounds each service's Stop (0: DefaultStopTimeout); a
	// service with a StopTimeout() of its own gets that. A Stop that
	// overruns is logged and left behind, and the next one begins.
	StopTimeout time.Duration

	log      *slog.Logger
	services []Service

	mu      sync.Mutex
	running []Service // started, in start order
	started chan struct{}
}

// NewGroup groups services, started in the order given.
func NewGroup(log *slog.Logger, services ...Service) *Group {
	return &Group{log: log, services: services, started: make(chan struct{})}
}

// Start starts each service in order. When one fails, those already
// started are stopped (in reverse) and the error names the failing one.
func (g *Group) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running != nil {
		return errors.New("service group started twice (Stop it first)")
	}
	g.running = make([]Service, 0, len(g.services))
	for _, s := range g.services {
		if err := s.Start(ctx); err != nil {
			g.stopLocked()
			return fmt.Errorf("start %s: %w", name(s), err)
		}
		g.running = append(g.running, s)
	}
	close(g.started)
	return nil
}

// Started is closed once every service started.
func (g *Group) Started() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.started
}

// Stop stops the started services in reverse start order, waiting for
// each (within its bound) before the next. It does nothing when the group
// is not running.
func (g *Group) Stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running == nil {
		return
	}
	g.stopLocked()
	g.started = make(chan struct{})
}

func (g *Group) stopLocked() {
	for i := len(g.running) - 1; i >= 0; i-- {
		s := g.running[i]
		within := g.StopTimeout
		if within <= 0 {
			within = DefaultStopTimeout
		}
		if b, ok := s.(interface{ StopTimeout() time.Duration }); ok && b.StopTimeout() > 0 {
			within = b.StopTimeout()
		}
		done := make(chan struct{})
		go func() { defer close(done); s.Stop() }()
		t := time.NewTimer(within)
		select {
		case <-done:
		case <-t.C:
			g.log.Warn("service did not stop in time: going on with the next one", "service", name(s), "waited", within)
		}
		t.Stop()
	}
	g.running = nil
}

// name is s's Name(), or its type when it has none.
func name(s Service) string {
	if n, ok := s.(interface{ Name() string }); ok {
		return n.Name()
	}
	return fmt.Sprintf("%T", s)
}
