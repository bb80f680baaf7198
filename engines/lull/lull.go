// Package lull tells a node's background work — spares being started
// again, kept compilers staging their next compile — when the node's
// control-plane calls (a check, an apply, a removal) have paused, so
// that work runs between calls instead of beside them. Calls back to
// back (a script's create, reload, stop, start) come 20–50 ms apart on
// two cores; work that one call leaves behind (a spare .NET host's start
// is about 90 ms of CPU, a kept compiler's staging about 200 ms) would
// otherwise take the CPU the next call needs. A Gate never holds work
// back for longer than its caller's bound: under calls that never pause,
// the work runs late, not never.
package lull

import (
	"sync"
	"time"
)

// Gate tracks the calls in flight and when the last one ended. Its zero
// value is ready to use and quiet.
type Gate struct {
	mu       sync.Mutex
	inFlight int
	last     time.Time // when the last call ended (or began, while one runs)
}

// Node is the gate of the process's node: internal/node marks its
// calls on it and the engines' background work waits on it.
var Node = &Gate{}

// Begin marks a call in flight until the returned function is called
// (once).
func (g *Gate) Begin() func() {
	g.mu.Lock()
	g.inFlight++
	g.last = time.Now()
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.inFlight--
			g.last = time.Now()
			g.mu.Unlock()
		})
	}
}

// InFlight is how many calls are in flight now.
func (g *Gate) InFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight
}

// quietAt is when the gate will have been quiet for d, judged now: the
// zero time when it is already, never while a call runs (ok false).
func (g *Gate) quietAt(now time.Time, d time.Duration) (at time.Time, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inFlight > 0 {
		return time.Time{}, false
	}
	if at = g.last.Add(d); !at.After(now) {
		return time.Time{}, true
	}
	return at, true
}

// Timer is work waiting for a lull (Gate.After).
type Timer struct {
	g        *Gate
	quiet    time.Duration
	deadline time.Time
	f        func()

	mu   sync.Mutex
	t    *time.Timer
	done bool // f ran, or the timer was stopped
}

// pollWhileBusy is how often a Timer looks again while a call runs.
const pollWhileBusy = 10 * time.Millisecond

// After runs f in its own goroutine once no call has run on g for quiet
// and at least quiet from now — or at the latest bound from now (quiet
// when bound is shorter), calls or not. A nil g waits quiet from now only.
func (g *Gate) After(quiet, bound time.Duration, f func()) *Timer {
	t := &Timer{g: g, quiet: quiet, deadline: time.Now().Add(max(quiet, bound)), f: f}
	t.mu.Lock()
	t.t = time.AfterFunc(quiet, t.check)
	t.mu.Unlock()
	return t
}

// check runs f when its time has come, or waits again.
func (t *Timer) check() {
	now := time.Now()
	var at time.Time
	ok := true
	if t.g != nil {
		at, ok = t.g.quietAt(now, t.quiet)
	}
	t.mu.Lock()
	if t.done {
		t.mu.Unlock()
		return
	}
	var wait time.Duration
	switch {
	case !now.Before(t.deadline):
	case !ok:
		wait = pollWhileBusy
	case !at.IsZero():
		wait = at.Sub(now)
	}
	if wait > 0 {
		t.t.Reset(min(wait, t.deadline.Sub(now)))
		t.mu.Unlock()
		return
	}
	t.done = true
	t.mu.Unlock()
	t.f()
}

// Stop keeps f from running, reporting whether it had not run yet.
func (t *Timer) Stop() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return false
	}
	t.done = true
	t.t.Stop()
	return true
}
