package procpool

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestProcReplacesAProcessThatDiedIdle is issue 34's item 5: a process
// that exited while no call used it is replaced before the next call gets
// it, instead of failing that call ("exited during the call").
func TestProcReplacesAProcessThatDiedIdle(t *testing.T) {
	f := &fakes{}
	var rs restarts
	pl, logs := newPool(t, 1, f, func(c *Config[*fakeProc]) { c.OnRestart = rs.record })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s, first := acquire(t, pl)
	pl.Release(s)
	first.exit() // dies while idle (OOM killer, a crash in a worker thread, ...)

	s, p := acquire(t, pl)
	defer pl.Release(s)
	if p == first || p.exited() {
		t.Fatalf("Proc handed out the dead process (%d)", p.id)
	}
	if first.retires.Load() == 0 {
		t.Error("the dead process was not retired")
	}
	if got := rs.all(); !slices.Equal(got, []string{"exited while idle: <nil>"}) {
		t.Errorf("OnRestart saw %q", got)
	}
	if !strings.Contains(logs.String(), `reason="exited while idle"`) {
		t.Errorf("log = %q", logs.String())
	}
}

// TestFailedStartsBackOff is issue 34's item 6: while a worker cannot
// start, calls fail at once with the start's error instead of each
// waiting for (and paying) another start; the backoff doubles, and a
// start that works again ends it.
func TestFailedStartsBackOff(t *testing.T) {
	errStart := errors.New("interpreter missing")
	var failing atomic.Bool
	f := &fakes{}
	f.fail = func(int) error {
		if failing.Load() {
			return errStart
		}
		return nil
	}
	pl, _ := newPool(t, 1, f, func(c *Config[*fakeProc]) {
		c.RestartBackoff = 100 * time.Millisecond
		c.MaxRestartBackoff = 300 * time.Millisecond
	})
	// The backoff runs on a clock the test moves: a busy machine cannot
	// make the 20 calls below outlast it (CI run of stop 36 did).
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	pl.now = func() time.Time { return time.Unix(0, clock.Load()) }
	advance := func(d time.Duration) { clock.Add(int64(d)) }
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s, _ := acquire(t, pl)
	failing.Store(true)
	pl.Replace(s, "process exited") // its restart fails: backoff 100ms

	starts := func() int { return len(f.all()) }
	try := func() error {
		s, err := pl.Acquire(ctxFor(t, 5*time.Second))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		defer pl.Release(s)
		_, err = pl.Proc(ctxFor(t, 5*time.Second), s)
		return err
	}
	_ = try() // waits for the background restart to give the slot back
	before := starts()
	for range 20 {
		err := try()
		if !errors.Is(err, ErrCannotStart) || !errors.Is(err, errStart) {
			t.Fatalf("Proc while backing off: %v", err)
		}
	}
	if n := starts() - before; n != 0 {
		t.Fatalf("%d starts were tried while backing off", n)
	}
	advance(350 * time.Millisecond)
	if err := try(); !errors.Is(err, errStart) || errors.Is(err, ErrCannotStart) {
		t.Fatalf("Proc after the backoff: %v, want a new start's error", err)
	}
	if err := try(); !errors.Is(err, ErrCannotStart) || !strings.Contains(err.Error(), "in a row") {
		t.Fatalf("Proc right after another failure: %v", err)
	}
	failing.Store(false)
	advance(350 * time.Millisecond)
	if err := try(); err != nil {
		t.Fatalf("Proc once starts work: %v", err)
	}
	if err := try(); err != nil {
		t.Fatalf("Proc after a good start: %v", err)
	}
}

// TestHangingStartCostsACallOnlyItsDeadline is issue 34's item 6: the
// start of an empty slot (its restart failed) that hangs costs each call
// only its own deadline (it used to run under the load timeout, 60 s for
// Python, for every message); the start goes on in the background and its
// process serves the slot's next call once it is up.
func TestHangingStartCostsACallOnlyItsDeadline(t *testing.T) {
	var failing atomic.Bool
	f := &fakes{fail: func(int) error {
		if failing.Load() {
			return errors.New("cannot start")
		}
		return nil
	}}
	pl, _ := newPool(t, 1, f, func(c *Config[*fakeProc]) { c.RestartBackoff = -1 })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	release := make(chan struct{})
	fill := pl.cfg.Start
	pl.cfg.Start = func(ctx context.Context) (*fakeProc, error) {
		if failing.Load() {
			return fill(ctx)
		}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return f.start(ctx)
	}
	s, _ := acquire(t, pl)
	failing.Store(true)
	pl.Replace(s, "timeout") // its restart fails: the slot is empty
	if s, err := pl.Acquire(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	} else {
		pl.Release(s)
	}
	failing.Store(false) // the next start hangs

	for i := range 3 {
		start := time.Now()
		s, err := pl.Acquire(ctxFor(t, 5*time.Second))
		if err != nil {
			t.Fatalf("call %d: Acquire: %v (the slot is held by the restart)", i, err)
		}
		_, err = pl.ProcBy(context.Background(), s, time.Now().Add(100*time.Millisecond))
		pl.Release(s)
		if !errors.Is(err, ErrCannotStart) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d: ProcBy = %v, want ErrCannotStart at the deadline", i, err)
		}
		// The start never ends on its own: any bound proves the call did
		// not wait for it; a generous one keeps a busy machine green.
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("call %d took %v against a 100ms deadline", i, took)
		}
	}
	close(release)
	s, err := pl.Acquire(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Release(s)
	p, err := pl.ProcBy(context.Background(), s, time.Now().Add(time.Second))
	if err != nil || p == nil || p.exited() {
		t.Fatalf("after the start finished: %v, %v", p, err)
	}
}

// TestHangingReplacementCostsACallOnlyItsDeadline is issue 34's item 6 on
// item 5's path: the replacement of a process that died while idle
// follows the rule of an empty slot's start. When it hangs, each call
// waits for it only until its own deadline (it used to wait, with the
// slot, for as long as ctx allowed: the whole load timeout, as no
// production ctx has a deadline); the start goes on in the background,
// its process serves the slot's next call once it is up, and its restart
// is reported then.
func TestHangingReplacementCostsACallOnlyItsDeadline(t *testing.T) {
	f := &fakes{}
	var rs restarts
	pl, logs := newPool(t, 1, f, func(c *Config[*fakeProc]) { c.OnRestart = rs.record })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	release := make(chan struct{})
	var starts atomic.Int32
	pl.cfg.Start = func(ctx context.Context) (*fakeProc, error) {
		starts.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return f.start(ctx)
	}
	s, first := acquire(t, pl)
	pl.Release(s)
	first.exit() // dies while idle; its replacement's start hangs

	for i := range 3 {
		start := time.Now()
		s, err := pl.Acquire(ctxFor(t, 5*time.Second))
		if err != nil {
			t.Fatalf("call %d: Acquire: %v (the slot is held by the replacement)", i, err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := pl.ProcBy(context.Background(), s, time.Now().Add(100*time.Millisecond))
			done <- err
		}()
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			close(release) // the start ends: the slot can be given back
			<-done
			pl.Release(s)
			t.Fatalf("call %d: ProcBy with a 100ms deadline still waited for the hanging start after 10s", i)
		}
		pl.Release(s)
		if !errors.Is(err, ErrCannotStart) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d: ProcBy = %v, want ErrCannotStart at the deadline", i, err)
		}
		// The start never ends on its own: any bound proves the call did
		// not wait for it; a generous one keeps a busy machine green.
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("call %d took %v against a 100ms deadline", i, took)
		}
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("%d starts for one replacement, want 1 (the calls wait for the one in progress)", n)
	}
	if got := rs.all(); len(got) != 0 {
		t.Errorf("OnRestart saw %q before the replacement was up", got)
	}
	close(release)
	s, err := pl.Acquire(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Release(s)
	p, err := pl.ProcBy(context.Background(), s, time.Now().Add(time.Second))
	if err != nil || p == nil || p == first || p.exited() {
		t.Fatalf("after the start finished: %v, %v", p, err)
	}
	if got := rs.all(); !slices.Equal(got, []string{"exited while idle: <nil>"}) {
		t.Errorf("OnRestart saw %q", got)
	}
	if !strings.Contains(logs.String(), `reason="exited while idle"`) {
		t.Errorf("log = %q", logs.String())
	}
}

// TestBackgroundStartThatDiedIsNotHandedOut is issue 43's item 12: a
// process started in the background after a call gave up waiting for it,
// and that exited before the slot's next call, is not handed to that call
// (which would fail as if the process had died under it): it is retired
// and replaced, as a process that died while idle.
func TestBackgroundStartThatDiedIsNotHandedOut(t *testing.T) {
	f := &fakes{}
	var rs restarts
	pl, _ := newPool(t, 1, f, func(c *Config[*fakeProc]) { c.OnRestart = rs.record })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	release := make(chan struct{})
	started := make(chan *fakeProc, 4)
	pl.cfg.Start = func(ctx context.Context) (*fakeProc, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		p, err := f.start(ctx)
		started <- p
		return p, err
	}
	s, first := acquire(t, pl)
	pl.Release(s)
	first.exit() // dies while idle; its replacement's start hangs

	s, err := pl.Acquire(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pl.ProcBy(context.Background(), s, time.Now().Add(50*time.Millisecond)); !errors.Is(err, ErrCannotStart) {
		t.Fatalf("ProcBy = %v, want ErrCannotStart at the deadline", err)
	}
	pl.Release(s)
	close(release) // the start finishes in the background...
	bg := <-started
	bg.exit() // ... and its process dies before the next call

	s, err = pl.Acquire(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Release(s)
	p, err := pl.ProcBy(context.Background(), s, time.Now().Add(5*time.Second))
	if err != nil || p == nil || p == bg || p.exited() {
		t.Fatalf("the next call got %v (dead background start %v), %v: want a live process", p, bg, err)
	}
	if bg.retires.Load() == 0 {
		t.Error("the dead background start was not retired")
	}
}
