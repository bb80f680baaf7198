// Package procpool owns a pool of child processes that serve one call at a
// time each: it hands a free slot (a place for one process) to each call,
// restarts a slot's process in the background after the call that found it
// crashed or killed it (a timeout), kills every process when Close gives up
// waiting for the calls in flight, and reaps every process before Close
// returns.
//
// What a process is, how it is started and how a call talks to it belongs to
// the user (the Python and native engines): the process type implements
// Process, and Config.Start starts one.
package procpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"
)

// Process is one child process as the pool sees it. Its methods other than
// Retire may be called from any goroutine at any time, also concurrently
// with a call that uses the process.
type Process interface {
	comparable
	// Kill kills the process (and what it started) unless it is gone
	// already. It does not wait.
	Kill()
	// CloseRequests closes the parent's end of the request pipe: an idle
	// process sees EOF and exits on its own.
	CloseRequests()
	// Done is closed once the process has exited and been reaped.
	Done() <-chan struct{}
	// Retire ends the process the way its engine does that, waits until it
	// has been reaped and releases what the parent holds for it. It is
	// called by whoever owns the process, with no call in progress, also
	// after Done is closed.
	Retire()
}

// Config configures a Pool.
type Config[P Process] struct {
	// Size is the number of slots, i.e. of calls served in parallel.
	Size int
	// Start starts one process, ready for calls, bounded by ctx. It is
	// used by Fill, by the restart after a crash or a timeout and by Proc.
	// A process it starts should be registered with Track as soon as it
	// can be killed, so that Close can kill it.
	Start func(ctx context.Context) (P, error)
	// Grace is how long Close lets idle processes exit on their own after
	// CloseRequests before it kills them.
	Grace time.Duration
	// GraceOutlastsCtx makes Close let Grace run out even after its ctx has
	// ended; by default an ended ctx kills the remaining processes at once.
	GraceOutlastsCtx bool
	// Cleanup, if set, runs once at the end of the first Close, after every
	// process has been reaped and before any Close returns.
	Cleanup func()
	// Logger receives a line for each restart; Name says what a process
	// is in it ("python worker process"), LogAttrs come first in its
	// attributes.
	Logger   *slog.Logger
	Name     string
	LogAttrs []any
	// OnRestart, when set, learns of each restart after a crash or a
	// timeout, once it is over: reason is Replace's (a short fixed text such
	// as "timeout" or "process exited"), err the start's error (nil: the
	// new process runs). Restarts aborted by Close are not reported. It is
	// called from the restart's goroutine; keep it cheap.
	OnRestart func(reason string, err error)
	// RestartBackoff is how long a slot whose process failed to start
	// waits before the next start is tried; it doubles with each further
	// failure up to MaxRestartBackoff. Meanwhile Proc fails at once with
	// an error wrapping ErrCannotStart and the last start's error, instead
	// of making every call wait for (and pay) a start that fails. 0:
	// DefaultRestartBackoff; negative: no backoff.
	RestartBackoff time.Duration
	// MaxRestartBackoff caps RestartBackoff's doubling. 0:
	// DefaultMaxRestartBackoff.
	MaxRestartBackoff time.Duration
	// Warm is how many slots Fill starts (0 or more than Size: all). The
	// others stay cold (no process) until a call finds every other slot
	// busy: it then takes a cold slot, whose process starts for it
	// (ProcBy). With IdleRetire > 0, the process of a slot beyond Warm
	// that no call used for IdleRetire is retired and its slot is cold
	// again, so the pool grows with its queue and shrinks back to Warm.
	Warm       int
	IdleRetire time.Duration
	// ParkIdle, when above 0, retires every process, the warm ones
	// included, that no call used for ParkIdle: an idle pool then holds
	// no process at all (it is parked), and the next call starts one (it
	// waits for a process start; Grow is not asked while no slot is
	// live). 0: the warm processes stay for as long as the pool.
	ParkIdle time.Duration
	// Grow, when set, is asked before a call takes a cold slot: false
	// keeps the call waiting for a live one, until Wake asks again.
	Grow func() bool
}

// Backoff defaults (Config.RestartBackoff, Config.MaxRestartBackoff).
const (
	DefaultRestartBackoff    = time.Second
	DefaultMaxRestartBackoff = 30 * time.Second
)

var (
	// ErrClosed is returned by Acquire once Close has started.
	ErrClosed = errors.New("pool closed")
	// ErrInFlight is wrapped (with ctx's error) by a Close whose ctx ended
	// while calls were in flight: their processes were killed.
	ErrInFlight = errors.New("closed with calls in flight")
	// ErrCannotStart is wrapped by Proc while a slot backs off after its
	// process failed to start (Config.RestartBackoff).
	ErrCannotStart = errors.New("the process cannot be started")
)

// Slot is the place of one process. It belongs to the call that acquired
// it until that call gives it back with Release or Replace.
type Slot[P Process] struct {
	p P // the zero P when the process could not be (re)started

	// After failed starts: how many in a row, the last one's error and
	// when the next may be tried. Owned like p.
	failures int
	lastErr  error
	nextTry  time.Time
	// starting delivers the result of a start that a call gave up
	// waiting for (ProcBy's deadline); the next call takes it.
	// startReason is why that start was made ("exited while idle"; ""
	// for an empty slot's), for the log and OnRestart once it is over.
	starting    chan startResult[P]
	startReason string
	// lastUsed is when a call last gave the slot back (Config.IdleRetire).
	lastUsed time.Time
}

type startResult[P Process] struct {
	p   P
	err error
}

// Pool is a fixed set of slots with their processes. Its methods are safe
// for concurrent use.
type Pool[P Process] struct {
	cfg Config[P]

	slots []*Slot[P]
	// free holds the slots no call is using; its capacity is len(slots), so
	// giving a slot back never blocks.
	free chan *Slot[P]

	ctx       context.Context // cancelled by Close: aborts restarts
	cancel    context.CancelFunc
	closed    chan struct{} // closed when Close starts
	closeDone chan struct{} // closed when Close has finished

	mu      sync.Mutex
	closing bool
	killAll bool           // Close gave up waiting: kill every process
	procs   map[P]struct{} // live processes, for Close
	cold    []*Slot[P]     // slots without a process beyond Config.Warm
	wake    chan struct{}  // closed by Wake and when a slot parks: waiting calls look at cold slots again
	wg      sync.WaitGroup // calls in flight and restarts

	now func() time.Time // the backoff's clock (time.Now; tests set their own)
}

// New returns a pool with cfg.Size empty slots; Fill starts their processes.
func New[P Process](cfg Config[P]) *Pool[P] {
	pl := &Pool[P]{
		cfg:       cfg,
		slots:     make([]*Slot[P], cfg.Size),
		free:      make(chan *Slot[P], cfg.Size),
		closed:    make(chan struct{}),
		closeDone: make(chan struct{}),
		procs:     map[P]struct{}{},
		wake:      make(chan struct{}),
		now:       time.Now,
	}
	if pl.cfg.RestartBackoff == 0 {
		pl.cfg.RestartBackoff = DefaultRestartBackoff
	}
	if pl.cfg.MaxRestartBackoff <= 0 {
		pl.cfg.MaxRestartBackoff = DefaultMaxRestartBackoff
	}
	pl.ctx, pl.cancel = context.WithCancel(context.Background())
	for i := range pl.slots {
		pl.slots[i] = &Slot[P]{}
	}
	return pl
}

// Fill starts the process of every slot (of the first Config.Warm slots
// when set; the others stay cold) in parallel, bounded by ctx, and makes
// the slots available to Acquire. If any start fails it retires the
// processes that did start, gives the pool up (it is not to be used any
// more) and returns the errors, one per started slot (nil for those that
// started); it returns nil when every process started.
func (pl *Pool[P]) Fill(ctx context.Context) []error {
	warm := pl.slots
	if w := pl.cfg.Warm; w > 0 && w < len(pl.slots) {
		warm = pl.slots[:w]
	}
	errs := make([]error, len(warm))
	var wg sync.WaitGroup
	for i, s := range warm {
		wg.Go(func() {
			s.p, errs[i] = pl.cfg.Start(ctx)
		})
	}
	wg.Wait()
	if errors.Join(errs...) != nil {
		var zero P
		for _, s := range warm {
			if s.p != zero {
				s.p.Retire()
				s.p = zero
			}
		}
		pl.cancel()
		return errs
	}
	now := pl.now()
	for _, s := range warm {
		s.lastUsed = now
		pl.free <- s
	}
	pl.mu.Lock()
	pl.cold = append(pl.cold, pl.slots[len(warm):]...)
	pl.mu.Unlock()
	if len(warm) < len(pl.slots) && pl.cfg.IdleRetire > 0 || pl.cfg.ParkIdle > 0 {
		go pl.retireIdle()
	}
	return nil
}

// FillParked makes the slots available to Acquire with no process started:
// the pool is as Config.ParkIdle leaves it, and the first call starts one.
// Only with ParkIdle (otherwise it is Fill's to start the warm slots).
func (pl *Pool[P]) FillParked() {
	pl.mu.Lock()
	pl.cold = append(pl.cold, pl.slots...)
	pl.mu.Unlock()
	go pl.retireIdle()
}

// takeCold returns a cold slot whose process may be started now (not
// backing off after failed starts), or nil.
func (pl *Pool[P]) takeCold() *Slot[P] {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	parked := len(pl.cold) == len(pl.slots) // no live slot: the call needs one
	if len(pl.cold) == 0 || !parked && pl.cfg.Grow != nil && !pl.cfg.Grow() {
		return nil
	}
	now := pl.now()
	for i, s := range pl.cold {
		if s.failures == 0 || !now.Before(s.nextTry) {
			pl.cold = append(pl.cold[:i], pl.cold[i+1:]...)
			return s
		}
	}
	return nil
}

// grow starts the process of the cold slot s in the background: s joins
// the free slots once it started, or, failed, goes back to the cold ones
// (backing off, Config.RestartBackoff), and the calls waiting are woken
// when the backoff ends, to start it again. Close waits for it (and
// aborts it).
func (pl *Pool[P]) grow(s *Slot[P]) {
	pl.wg.Add(1)
	go func() {
		defer pl.wg.Done()
		var p P
		err := pl.ctx.Err()
		if err == nil {
			p, err = pl.cfg.Start(pl.ctx)
		}
		if err != nil {
			pl.mu.Lock()
			var retry time.Duration
			if pl.ctx.Err() == nil {
				pl.startFailed(s, err)
				retry = max(s.nextTry.Sub(pl.now()), 0)
			}
			pl.cold = append(pl.cold, s)
			pl.mu.Unlock()
			if pl.ctx.Err() == nil {
				pl.cfg.Logger.Warn(pl.cfg.Name+" not started for the calls waiting", slices.Concat(pl.cfg.LogAttrs, []any{"error", err})...)
				// The calls still waiting try again once the slot's
				// backoff ends, rather than wait for their deadline
				// (without a backoff they would start it in a loop).
				if pl.cfg.RestartBackoff >= 0 {
					time.AfterFunc(retry, func() {
						if pl.ctx.Err() == nil {
							pl.Wake()
						}
					})
				}
			}
			return
		}
		s.p, s.failures, s.lastErr = p, 0, nil
		s.lastUsed = pl.now()
		pl.free <- s
	}()
}

// Wake makes the calls waiting for a slot ask Config.Grow again (it now
// says yes) and take a cold slot if there is one.
func (pl *Pool[P]) Wake() {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if len(pl.cold) > 0 {
		pl.wakeLocked()
	}
}

// wakeLocked wakes the calls waiting for a slot (pl.mu held).
func (pl *Pool[P]) wakeLocked() {
	close(pl.wake)
	pl.wake = make(chan struct{})
}

// wakeCh is the channel the next Wake closes, or the next slot parked
// (retireIdle): a call that found no slot free and none cold waits on it
// too, since the slot of a process being parked turns cold only after the
// process is gone.
func (pl *Pool[P]) wakeCh() <-chan struct{} {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.wake
}

// Live is the number of slots that are not cold: those with a process,
// starting one, or in use.
func (pl *Pool[P]) Live() int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return len(pl.slots) - len(pl.cold)
}

// retireIdle makes the slots beyond Config.Warm whose process no call used
// for Config.IdleRetire cold again, and every slot whose process no call
// used for Config.ParkIdle, until Close.
func (pl *Pool[P]) retireIdle() {
	every := pl.cfg.IdleRetire
	if p := pl.cfg.ParkIdle; p > 0 && (every <= 0 || p < every) {
		every = p
	}
	tick := time.NewTicker(max(every/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-pl.closed:
			return
		case <-tick.C:
		}
		// Each free slot is looked at once; the idle ones beyond Warm lose
		// their process.
		for range len(pl.free) {
			if !pl.enter() {
				return
			}
			var s *Slot[P]
			select {
			case s = <-pl.free:
			default:
			}
			if s == nil {
				pl.wg.Done()
				break
			}
			pl.mu.Lock()
			idle := pl.now().Sub(s.lastUsed)
			retire := s.starting == nil &&
				(pl.cfg.IdleRetire > 0 && len(pl.slots)-len(pl.cold) > max(pl.cfg.Warm, 1) && idle >= pl.cfg.IdleRetire ||
					pl.cfg.ParkIdle > 0 && idle >= pl.cfg.ParkIdle)
			pl.mu.Unlock()
			if !retire {
				pl.free <- s
				pl.wg.Done()
				continue
			}
			var zero P
			if old := s.p; old != zero {
				s.p = zero
				old.CloseRequests()
				old.Retire()
				pl.Untrack(old)
			}
			pl.mu.Lock()
			pl.cold = append(pl.cold, s)
			// A call that came while the process was being retired waits
			// for a slot: this one may start its process now.
			pl.wakeLocked()
			pl.mu.Unlock()
			pl.wg.Done()
		}
	}
}

// FirstError returns the first non-nil error of errs, preferring one that
// wraps prefer (it says more about what is wrong than, say, a start-up
// failure next to it).
func FirstError(errs []error, prefer error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, prefer) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// Context is cancelled when Close starts: work done for a call that should
// end then (a restart, a request the process makes) can be bound to it.
func (pl *Pool[P]) Context() context.Context { return pl.ctx }

// Acquire starts a call: it waits for a free slot, bounded by ctx. It fails
// with ErrClosed once Close has started, or with ctx's error. A slot it
// returns must be given back with exactly one Release or Replace, which ends
// the call; Close waits for calls until its own ctx ends.
func (pl *Pool[P]) Acquire(ctx context.Context) (*Slot[P], error) {
	return pl.AcquireUnless(ctx, nil, nil)
}

// ErrStopped is returned by AcquireUnless when its stop channel closed first.
var ErrStopped = errors.New("stopped waiting for a slot")

// AcquireUnless is Acquire that also gives up, with ErrStopped, once stop
// or stop2 is closed (a nil channel never closes): a caller whose work
// another caller took over, or whose call is given back, stops waiting.
func (pl *Pool[P]) AcquireUnless(ctx context.Context, stop, stop2 <-chan struct{}) (*Slot[P], error) {
	if !pl.enter() {
		return nil, ErrClosed
	}
	select {
	case s := <-pl.free:
		return s, nil
	default:
	}
	for {
		// Every live slot is busy: a cold one starts its process for this
		// call.
		wake := pl.wakeCh()
		if s := pl.takeCold(); s != nil {
			// Started in the background, for whichever call comes first:
			// this call goes on waiting for it or for a busy slot that
			// frees up sooner (bound to the start, a call failed at its
			// deadline whenever a start outlasted it on a loaded machine,
			// while the busy process was free long before).
			pl.grow(s)
		}
		select {
		case s := <-pl.free:
			return s, nil
		case <-wake:
		case <-ctx.Done():
			pl.wg.Done()
			return nil, ctx.Err()
		case <-stop:
			pl.wg.Done()
			return nil, ErrStopped
		case <-stop2:
			pl.wg.Done()
			return nil, ErrStopped
		case <-pl.closed:
			pl.wg.Done()
			return nil, ErrClosed
		}
	}
}

// Proc returns the slot's process, ready for a call. A process that
// exited while it was idle is retired and replaced now (the call does not
// fail as if the process had died under it). A slot whose last restart
// failed has none: then Proc starts one now. Either start is bounded by
// ctx and by Close, unless the slot is backing off after failed starts
// (Config.RestartBackoff): then it fails at once with an error wrapping
// ErrCannotStart and the last start's error. On an error the slot stays
// empty and still has to be given back.
func (pl *Pool[P]) Proc(ctx context.Context, s *Slot[P]) (P, error) {
	return pl.ProcBy(ctx, s, time.Time{})
}

// ProcBy is Proc for a call that must be answered by deadline (zero:
// none): a start it makes (an empty slot's, or the replacement of a
// process that died idle), or finds in progress, is waited for only until
// then; the start goes on in the background (bounded by Close and by
// Config.Start's own limit) and the slot's next call takes its process,
// unless it has exited by then: it is then replaced like one that died idle.
// A worker whose start hangs thus costs each call at most its own
// deadline, not the start's timeout; one whose start fails makes the
// slot back off like a failed restart.
func (pl *Pool[P]) ProcBy(ctx context.Context, s *Slot[P], deadline time.Time) (P, error) {
	var zero P
	reason := ""
	if s.starting != nil {
		reason = s.startReason
		r, err := pl.waitStart(ctx, s, s.starting, deadline)
		if err != nil {
			return zero, err
		}
		s.startReason = ""
		p, err := pl.started(s, r, reason)
		if err != nil {
			return zero, err
		}
		select {
		case <-p.Done():
			// It died after its start, before this call: replaced below,
			// not handed out.
		default:
			return p, nil
		}
	}
	if s.p != zero {
		select {
		case <-s.p.Done():
			old := s.p
			s.p = zero
			old.Retire()
			pl.Untrack(old)
			reason = "exited while idle"
		default:
			return s.p, nil
		}
	}
	if s.failures > 0 {
		if wait := s.nextTry.Sub(pl.now()); wait > 0 {
			return zero, fmt.Errorf("%w: %d start(s) failed in a row, the last with: %w (next try in %v)",
				ErrCannotStart, s.failures, s.lastErr, wait.Round(time.Millisecond))
		}
	}
	if deadline.IsZero() {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(pl.ctx, cancel)
		defer stop()
		p, err := pl.cfg.Start(ctx)
		return pl.started(s, startResult[P]{p, err}, reason)
	}
	// The start runs on the pool's context; the call waits for it until
	// its deadline at most.
	ch := make(chan startResult[P], 1)
	pl.wg.Add(1) // the call holds the group open: no race with Close's Wait
	go func() {
		defer pl.wg.Done()
		p, err := pl.cfg.Start(pl.ctx)
		ch <- startResult[P]{p, err}
	}()
	r, err := pl.waitStart(ctx, s, ch, deadline)
	if err != nil {
		s.startReason = reason
		return zero, err
	}
	return pl.started(s, r, reason)
}

// waitStart waits for the start delivering to ch until ctx or deadline
// end; then it leaves ch to the slot's next call and fails.
func (pl *Pool[P]) waitStart(ctx context.Context, s *Slot[P], ch chan startResult[P], deadline time.Time) (startResult[P], error) {
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case r := <-ch:
		s.starting = nil
		return r, nil
	case <-ctx.Done():
		s.starting = ch
		return startResult[P]{}, fmt.Errorf("%w: still starting when the call was cancelled (the start goes on): %w", ErrCannotStart, ctx.Err())
	case <-timeout:
		s.starting = ch
		return startResult[P]{}, fmt.Errorf("%w: still starting at the call's deadline (the start goes on): %w", ErrCannotStart, context.DeadlineExceeded)
	}
}

// started installs a start's result in s (reason: why it was started by
// a call, for OnRestart).
func (pl *Pool[P]) started(s *Slot[P], r startResult[P], reason string) (P, error) {
	var zero P
	p, err := r.p, r.err
	if err != nil {
		if pl.ctx.Err() == nil {
			pl.startFailed(s, err)
			if reason != "" {
				pl.restarted(reason, err)
			}
		}
		return zero, err
	}
	s.p, s.failures, s.lastErr = p, 0, nil
	if reason != "" {
		pl.cfg.Logger.Warn(pl.cfg.Name+" restarted",
			slices.Concat(pl.cfg.LogAttrs, []any{"reason", reason})...)
		pl.restarted(reason, nil)
	}
	return p, nil
}

// startFailed records a failed start of s's process: the slot backs off.
func (pl *Pool[P]) startFailed(s *Slot[P], err error) {
	s.failures++
	s.lastErr = err
	if pl.cfg.RestartBackoff < 0 {
		return
	}
	d := pl.cfg.MaxRestartBackoff
	if s.failures < 32 {
		d = min(pl.cfg.RestartBackoff<<(s.failures-1), d)
	}
	s.nextTry = pl.now().Add(d)
}

// Release gives the slot back with its process as it is, and ends the call.
func (pl *Pool[P]) Release(s *Slot[P]) {
	s.lastUsed = pl.now()
	pl.free <- s
	pl.wg.Done()
}

// Replace ends the call and retires the slot's process (killing it first),
// then starts a new one in the background; the slot is available again
// once that is done, or failed (then Proc tries again for the next call).
// reason is logged with the restart.
func (pl *Pool[P]) Replace(s *Slot[P], reason string) {
	var zero P
	old := s.p
	s.p = zero
	pl.wg.Add(1) // the call holds the group open until below: no race with Wait
	go func() {
		defer pl.wg.Done()
		if old != zero {
			old.Kill()
			old.Retire()
			pl.Untrack(old)
		}
		if pl.ctx.Err() != nil {
			pl.free <- s
			return
		}
		p, err := pl.cfg.Start(pl.ctx)
		if err != nil {
			if pl.ctx.Err() == nil {
				pl.startFailed(s, err)
				pl.cfg.Logger.Error(pl.cfg.Name+" could not be restarted",
					slices.Concat(pl.cfg.LogAttrs, []any{"reason", reason, "error", err})...)
				pl.restarted(reason, err)
			}
		} else {
			s.p, s.failures, s.lastErr = p, 0, nil
			pl.cfg.Logger.Warn(pl.cfg.Name+" restarted",
				slices.Concat(pl.cfg.LogAttrs, []any{"reason", reason})...)
			pl.restarted(reason, nil)
		}
		s.lastUsed = pl.now()
		pl.free <- s
	}()
	pl.wg.Done()
}

func (pl *Pool[P]) restarted(reason string, err error) {
	if pl.cfg.OnRestart != nil {
		pl.cfg.OnRestart(reason, err)
	}
}

// Killed reports whether Close gave up waiting and killed every process: a
// call that fails now was cut off by Close.
func (pl *Pool[P]) Killed() bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return pl.killAll
}

// Track registers a process that Start is starting, for Close. It refuses
// (false) once Close has started killing everything: then Start must end the
// process and fail.
func (pl *Pool[P]) Track(p P) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.killAll {
		return false
	}
	pl.procs[p] = struct{}{}
	return true
}

// Tracked returns the processes the pool holds (started, not yet
// retired): for tests that wait on one's exit.
func (pl *Pool[P]) Tracked() []P {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return slices.Collect(maps.Keys(pl.procs))
}

// AllExited reports whether every process the pool holds has exited (its
// Done closed): for tests that wait until a death has been seen.
func (pl *Pool[P]) AllExited() bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for p := range pl.procs {
		select {
		case <-p.Done():
		default:
			return false
		}
	}
	return true
}

// Untrack forgets a process that Start retired after all.
func (pl *Pool[P]) Untrack(p P) {
	pl.mu.Lock()
	delete(pl.procs, p)
	pl.mu.Unlock()
}

func (pl *Pool[P]) enter() bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closing {
		return false
	}
	pl.wg.Add(1)
	return true
}

// Close stops the pool: new calls fail with ErrClosed and restarts are
// aborted. It waits for the calls in flight until ctx ends, then kills every
// process (those calls return at once) and returns an error wrapping
// ErrInFlight and ctx's error. Idle processes get CloseRequests and
// Config.Grace to exit before they are killed. Every process is reaped
// (and retired) before Close returns. A second Close waits for the first
// one until its own ctx ends.
func (pl *Pool[P]) Close(ctx context.Context) error {
	pl.mu.Lock()
	if pl.closing {
		pl.mu.Unlock()
		select {
		case <-pl.closeDone:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	pl.closing = true
	close(pl.closed)
	pl.cancel()
	pl.mu.Unlock()
	defer close(pl.closeDone)

	var err error
	idle := make(chan struct{})
	go func() {
		pl.wg.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-ctx.Done():
		// With nothing in flight, idle closes as soon as its goroutine runs:
		// give it that moment so an expired ctx does not kill idle processes.
		select {
		case <-idle:
			break
		case <-time.After(10 * time.Millisecond):
		}
	}
	select {
	case <-idle:
	default:
		err = fmt.Errorf("%w: %w", ErrInFlight, ctx.Err())
		pl.mu.Lock()
		pl.killAll = true
		for p := range pl.procs {
			p.Kill()
		}
		pl.mu.Unlock()
		<-idle // killed calls return at once
	}

	pl.mu.Lock()
	procs := make([]P, 0, len(pl.procs))
	for p := range pl.procs {
		procs = append(procs, p)
	}
	pl.procs = map[P]struct{}{}
	pl.mu.Unlock()
	for _, p := range procs {
		p.CloseRequests()
	}
	grace := time.NewTimer(pl.cfg.Grace)
	defer grace.Stop()
	ctxDone := ctx.Done()
	if pl.cfg.GraceOutlastsCtx {
		ctxDone = nil
	}
	killRest := func() {
		for _, p := range procs {
			p.Kill()
		}
	}
	for _, p := range procs {
		select {
		case <-p.Done():
		case <-grace.C:
			killRest()
		case <-ctxDone:
			killRest()
		}
	}
	for _, p := range procs {
		p.Retire() // reaps the killed ones
	}
	if pl.cfg.Cleanup != nil {
		pl.cfg.Cleanup()
	}
	return err
}

// Pipes are the two protocol pipes between the parent and one child:
// requests (the parent writes ReqW, the child reads ReqR) and responses (the
// child writes RespW, the parent reads RespR).
type Pipes struct {
	ReqR, ReqW   *os.File
	RespR, RespW *os.File
}

// NewPipes creates the protocol pipes of a child.
func NewPipes() (*Pipes, error) {
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	respR, respW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, err
	}
	return &Pipes{ReqR: reqR, ReqW: reqW, RespR: respR, RespW: respW}, nil
}

// ChildEnds are the ends the child inherits, for exec.Cmd.ExtraFiles: the
// request read end (fd 3) and the response write end (fd 4).
func (p *Pipes) ChildEnds() []*os.File { return []*os.File{p.ReqR, p.RespW} }

// CloseChildEnds closes the parent's copies of the child's ends (after the
// child started, or failed to).
func (p *Pipes) CloseChildEnds() {
	p.ReqR.Close()
	p.RespW.Close()
}

// CloseParentEnds closes the parent's own ends.
func (p *Pipes) CloseParentEnds() {
	p.ReqW.Close()
	p.RespR.Close()
}
