// Package spares owns the worker processes an engine starts ahead of
// need, for no worker yet (the Python engine's spare runners, the .NET
// engine's spare hosts): a create, start or reload takes a ready one
// instead of waiting for a runtime to start. A spare is handed out once
// and never taken back; one that died while it waited is retired, never
// handed out. The next ones start in the background, one at a time,
// after a short settle while another is still ready (Set.Settle), once
// the node's lifecycle calls pause (Set.Lull, engines/lull); a
// caller may wait for the one being started instead of starting a
// process of its own (Set.TakeAwaiting).
package spares

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/virtufin/workmanager/engines/lull"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// Proc is what a Set needs of a process.
type Proc interface {
	// Exited reports whether the process has exited.
	Exited() bool
	// Healthy reports whether it can serve (no deadline or cancellation
	// killed it).
	Healthy() bool
	// Retire kills and reaps it.
	Retire()
}

// Set keeps Want processes ready. Its zero value with Want 0 keeps none.
type Set[P Proc] struct {
	// Want is how many to keep ready (0: none).
	Want int
	// Start starts one, ready to be handed out (called in the background,
	// one at a time).
	Start func() (P, error)
	// OnError, when set, learns of a Start that failed: no more start
	// until the next Take.
	OnError func(error)
	// Settle, when positive, delays the next start after a take while
	// another process is still ready: the caller's call goes on (a
	// create's host load, its workflow's round trips) without a start
	// beside it taking the CPU it needs. With none ready the next starts
	// at once, as without Settle.
	Settle time.Duration
	// Lull, when set, makes a settling start wait, besides Settle from
	// the take, until no call has run on the gate for Settle (the node's
	// calls back to back: a create, then the reload right behind it), at
	// most SettleMax from the take (default: settleMax).
	Lull      *lull.Gate
	SettleMax time.Duration

	mu       sync.Mutex
	idle     []P
	starting bool // a process is being started
	closed   bool
	// changed is closed (and replaced) when a started process joins idle
	// or a start ends without one; awaiting counts the callers of
	// TakeAwaiting waiting for it.
	changed  chan struct{}
	awaiting int
	// settling is the pending delayed start (Settle).
	settling *lull.Timer
}

// settleMax is how long at most a settling start waits for a lull.
const settleMax = time.Second

// SettleAfterTake is the Settle of the Sets New makes (and of the .NET
// engine's spare compilers): measured in BenchmarkControlPlane, a spare's
// start beside the create that took one slowed that create on two cores
// (a spare native check host's, through the sandbox's chain, 3-5 ms; a C#
// compiler's far more), and 50 ms takes it off the call's engine step and
// most of its round trips (docs/performance.md, "Where a .NET create's
// check goes" and "Spares that settle").
const SettleAfterTake = 50 * time.Millisecond

// New keeps want processes (the engine's setting) ready, started by
// start, settling SettleAfterTake after a take while one is still ready,
// and logs the starts that fail; what names them ("python engine: a
// spare runner"). None when sb shares writable paths: a spare runs
// under a user id of its own, so a worker's files there would not be
// writable by all its processes.
func New[P Proc](want int, sb *sandbox.Sandbox, start func() (P, error), log *slog.Logger, what string) *Set[P] {
	if want > 0 && sb != nil && sb.SharesPaths() {
		log.Info(what + ": none kept, as worker sandboxes share writable paths (SANDBOX_WRITABLE_PATHS)")
		want = 0
	}
	return &Set[P]{Want: want, Start: start, Settle: SettleAfterTake, Lull: lull.Node, OnError: func(err error) {
		log.Warn(what+" did not start; creates and starts start their own", "error", err)
	}}
}

// Take hands out a ready process, or reports false when none is ready;
// either way it starts the next ones in the background.
func (s *Set[P]) Take() (P, bool) {
	p, ok, refill := s.TakeDeferred()
	refill()
	return p, ok
}

// TakeDeferred is Take, except that the next ones start only when the
// caller calls the returned function (once, when what it took the spare
// for is done: a spare that starts meanwhile takes the CPU it needs —
// measured, a warm C# compile 60–87 ms with the next spare starting later
// against 83–98 ms beside it, two cores).
func (s *Set[P]) TakeDeferred() (P, bool, func()) {
	var zero P
	if s.Want <= 0 {
		return zero, false, func() {}
	}
	p, ok := s.take()
	var once sync.Once
	return p, ok, func() { once.Do(s.refill) }
}

// TakeAwaiting is TakeDeferred, except that when no process is ready but
// one is being started and no other caller waits for it, it waits for
// that one — at most wait, and until ctx ends — instead of reporting none
// at once. A spare well under way is sooner than a process the caller
// would start for itself, and costs no second start's CPU (measured, a C#
// compile that found both spare compilers taken by the calls just before
// it: 135–150 ms starting mcs, while the next spare was at most 150 ms
// from ready). One caller at a time: the next ones start one after
// another, so a burst of callers must not queue behind them.
func (s *Set[P]) TakeAwaiting(ctx context.Context, wait time.Duration) (P, bool, func()) {
	var zero P
	p, ok, refill := s.TakeDeferred()
	if ok || s.Want <= 0 {
		return p, ok, refill
	}
	s.mu.Lock()
	if s.settling != nil && s.awaiting == 0 {
		// A settling start is what this caller would wait for: it begins
		// now.
		s.refillLocked(false)
	}
	if !s.starting || s.awaiting > 0 || s.closed {
		s.mu.Unlock()
		return zero, false, refill
	}
	s.awaiting++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.awaiting--
		s.mu.Unlock()
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		ch, starting := s.changedLocked(), s.starting
		s.mu.Unlock()
		if p, ok := s.take(); ok {
			return p, ok, refill
		}
		if !starting {
			return zero, false, refill
		}
		select {
		case <-ch:
		case <-timer.C:
			return zero, false, refill
		case <-ctx.Done():
			return zero, false, refill
		}
	}
}

// changedLocked is the channel the next change closes (s.mu held).
func (s *Set[P]) changedLocked() chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// signalLocked wakes the callers waiting for a change (s.mu held).
func (s *Set[P]) signalLocked() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// take hands out a ready process, retiring dead ones on the way.
func (s *Set[P]) take() (P, bool) {
	var zero P
	var dead []P
	s.mu.Lock()
	p, ok := zero, false
	for !ok && len(s.idle) > 0 {
		c := s.idle[0]
		s.idle = s.idle[1:]
		if c.Exited() || !c.Healthy() {
			dead = append(dead, c)
			continue
		}
		p, ok = c, true
	}
	s.mu.Unlock()
	for _, d := range dead {
		d.Retire()
	}
	return p, ok
}

// refill starts processes in the background, one after another, until
// Want are ready (or the Set is closed). Started at once, two spare
// compilers took the CPU the calls beside them needed (.NET back to back
// in BenchmarkControlPlane: reload→message 62–97 ms against 56–74 one
// after another).
func (s *Set[P]) refill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refillLocked(s.Settle > 0 && len(s.idle) > 0)
}

// refillLocked starts the next process unless one is starting or Want
// are ready; after Settle when settle is set (s.mu held).
func (s *Set[P]) refillLocked(settle bool) {
	if s.closed || s.starting || len(s.idle) >= s.Want {
		return
	}
	if settle {
		if s.settling == nil {
			wait := s.SettleMax
			if wait <= 0 {
				wait = settleMax
			}
			s.settling = s.Lull.After(s.Settle, wait, func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.settling = nil
				s.refillLocked(false)
			})
		}
		return
	}
	if s.settling != nil {
		s.settling.Stop()
		s.settling = nil
	}
	s.starting = true
	go s.startOne()
}

// startOne starts one process for the Set, then the next ones (refill). A
// failed start stops the refill until the next take. A start that ends
// after Close is not reported (Close may take what it needed away: an
// engine removes the spares' slots), and what it started is retired.
func (s *Set[P]) startOne() {
	p, err := s.Start()
	s.mu.Lock()
	s.starting = false
	s.signalLocked()
	switch {
	case s.closed:
		s.mu.Unlock()
		if err == nil {
			p.Retire()
		}
		return
	case err != nil:
		s.mu.Unlock()
		if s.OnError != nil {
			s.OnError(err)
		}
		return
	}
	s.idle = append(s.idle, p)
	s.refillLocked(false) // settled already
	s.mu.Unlock()
}

// Close retires the ready processes and starts no more; one starting now
// is retired once started.
func (s *Set[P]) Close() {
	s.mu.Lock()
	idle := s.idle
	s.idle, s.closed = nil, true
	if s.settling != nil {
		s.settling.Stop()
		s.settling = nil
	}
	s.mu.Unlock()
	for _, p := range idle {
		p.Retire()
	}
}

// Awaiting is how many callers of TakeAwaiting wait for the process being
// started (tests).
func (s *Set[P]) Awaiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.awaiting
}

// Ready returns the processes ready now (tests).
func (s *Set[P]) Ready() []P {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]P(nil), s.idle...)
}
