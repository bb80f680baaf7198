package procpool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeProc is a process that exists only as state: it "exits" when killed,
// or on CloseRequests when exitOnEOF is set.
type fakeProc struct {
	id        int
	exitOnEOF bool

	kills, eofs, retires atomic.Int32
	done                 chan struct{}
	once                 sync.Once
	// retiring, when set, is closed as Retire begins, and Retire then
	// returns only once gate is closed (a retirement that takes a while:
	// a sandbox letting go of a process).
	retiring, gate chan struct{}
}

func (p *fakeProc) exit()                 { p.once.Do(func() { close(p.done) }) }
func (p *fakeProc) Kill()                 { p.kills.Add(1); p.exit() }
func (p *fakeProc) Done() <-chan struct{} { return p.done }
func (p *fakeProc) Retire() {
	p.retires.Add(1)
	p.Kill()
	<-p.done
	if p.retiring != nil {
		close(p.retiring)
		<-p.gate
	}
}

func (p *fakeProc) CloseRequests() {
	p.eofs.Add(1)
	if p.exitOnEOF {
		p.exit()
	}
}

func (p *fakeProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// fakes starts fakeProcs and remembers them. fail, when set, decides
// whether start number n (from 1) fails.
type fakes struct {
	mu        sync.Mutex
	procs     []*fakeProc
	exitOnEOF bool
	fail      func(n int) error
	pool      *Pool[*fakeProc]
	// firstRetiring and firstGate, when set, are the first process's
	// retiring and gate (fakeProc).
	firstRetiring, firstGate chan struct{}
}

func (f *fakes) start(ctx context.Context) (*fakeProc, error) {
	f.mu.Lock()
	n := len(f.procs) + 1
	fail := f.fail
	p := &fakeProc{id: n, exitOnEOF: f.exitOnEOF, done: make(chan struct{})}
	if n == 1 {
		p.retiring, p.gate = f.firstRetiring, f.firstGate
	}
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	if fail != nil {
		if err := fail(n); err != nil {
			p.exit()
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		p.exit()
		return nil, err
	}
	if !f.pool.Track(p) {
		p.Retire()
		return nil, ErrClosed
	}
	return p, nil
}

func (f *fakes) all() []*fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeProc(nil), f.procs...)
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func newPool(t *testing.T, size int, f *fakes, adjust func(*Config[*fakeProc])) (*Pool[*fakeProc], *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	cfg := Config[*fakeProc]{
		Size:     size,
		Start:    f.start,
		Grace:    100 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(logs, nil)),
		Name:     "fake process",
		LogAttrs: []any{"worker_id", "w1"},
	}
	if adjust != nil {
		adjust(&cfg)
	}
	f.pool = New(cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.pool.Close(ctx)
	})
	return f.pool, logs
}

// within runs fn and fails the test if it takes longer than d.
func within[T any](t *testing.T, d time.Duration, what string, fn func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- fn() }()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: still running after %v", what, d)
		panic("unreachable")
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func acquire(t *testing.T, pl *Pool[*fakeProc]) (*Slot[*fakeProc], *fakeProc) {
	t.Helper()
	s, err := pl.Acquire(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	p, err := pl.Proc(ctxFor(t, 5*time.Second), s)
	if err != nil {
		t.Fatalf("Proc: %v", err)
	}
	return s, p
}

func TestFillAcquireRelease(t *testing.T) {
	f := &fakes{}
	pl, _ := newPool(t, 2, f, nil)
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s1, p1 := acquire(t, pl)
	s2, p2 := acquire(t, pl)
	if p1 == p2 {
		t.Fatal("two calls got the same process")
	}
	// Both slots are taken: a third call waits until its ctx ends.
	err := within(t, 5*time.Second, "Acquire", func() error {
		_, err := pl.Acquire(ctxFor(t, 50*time.Millisecond))
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with both slots taken: %v, want a deadline error", err)
	}
	pl.Release(s1)
	s3, p3 := acquire(t, pl)
	if p3 != p1 {
		t.Fatalf("got process %d, want the released one (%d)", p3.id, p1.id)
	}
	pl.Release(s2)
	pl.Release(s3)
	if n := len(f.all()); n != 2 {
		t.Fatalf("%d processes started, want 2", n)
	}
}

func TestFillFailureRetiresTheStartedOnes(t *testing.T) {
	errStart := errors.New("start failed")
	errInvalid := errors.New("invalid code")
	f := &fakes{fail: func(n int) error {
		switch n {
		case 2:
			return errStart
		case 3:
			return errInvalid
		}
		return nil
	}}
	pl, _ := newPool(t, 3, f, nil)
	errs := pl.Fill(ctxFor(t, 5*time.Second))
	if len(errs) != 3 {
		t.Fatalf("Fill: %v, want 3 errors (nil for the started ones)", errs)
	}
	// The slots start in parallel: which one fails how is not fixed.
	got := map[error]int{}
	for _, err := range errs {
		got[err]++
	}
	if got[nil] != 1 || got[errStart] != 1 || got[errInvalid] != 1 {
		t.Fatalf("Fill: %v, want nil, %v and %v", errs, errStart, errInvalid)
	}
	if err := FirstError(errs, errInvalid); err != errInvalid {
		t.Fatalf("FirstError = %v, want the preferred error", err)
	}
	for _, p := range f.all() {
		if !p.exited() {
			t.Errorf("process %d still runs", p.id)
		}
	}
	if pl.Context().Err() == nil {
		t.Error("a failed Fill left the pool's context alive")
	}
}

func TestFirstError(t *testing.T) {
	a, b, want := errors.New("a"), errors.New("b"), errors.New("wanted")
	wrapped := fmt.Errorf("loading: %w", want)
	for _, tc := range []struct {
		errs []error
		want error
	}{
		{nil, nil},
		{[]error{nil, nil}, nil},
		{[]error{nil, a, b}, a},
		{[]error{a, b, want}, want},
		{[]error{a, nil, wrapped, want}, wrapped},
	} {
		if got := FirstError(tc.errs, want); got != tc.want {
			t.Errorf("FirstError(%v) = %v, want %v", tc.errs, got, tc.want)
		}
	}
}

// restarts records what Config.OnRestart was told.
type restarts struct {
	mu  sync.Mutex
	got []string
}

func (r *restarts) record(reason string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, fmt.Sprintf("%s: %v", reason, err))
}

func (r *restarts) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

func TestReplaceRestartsInTheBackground(t *testing.T) {
	f := &fakes{}
	var rs restarts
	pl, logs := newPool(t, 1, f, func(c *Config[*fakeProc]) { c.OnRestart = rs.record })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s, old := acquire(t, pl)
	pl.Replace(s, "timeout")
	s, p := acquire(t, pl) // waits for the restart
	if p == old {
		t.Fatal("Replace kept the old process")
	}
	if old.kills.Load() == 0 || old.retires.Load() != 1 || !old.exited() {
		t.Errorf("old process: %d kills, %d retires, exited %v; want killed and retired once",
			old.kills.Load(), old.retires.Load(), old.exited())
	}
	pl.Release(s)
	if got := logs.String(); !strings.Contains(got, `msg="fake process restarted" worker_id=w1 reason=timeout`) {
		t.Errorf("log = %q, want a restart line", got)
	}
	if got := rs.all(); !slices.Equal(got, []string{"timeout: <nil>"}) {
		t.Errorf("OnRestart saw %q, want one successful restart for timeout", got)
	}
	// Close reaps the new process, not the old (untracked) one again.
	if err := pl.Close(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if old.retires.Load() != 1 || p.retires.Load() != 1 {
		t.Errorf("retires: old %d, new %d; want 1 each", old.retires.Load(), p.retires.Load())
	}
}

func TestFailedRestartIsRetriedByTheNextCall(t *testing.T) {
	var failing atomic.Bool
	errStart := errors.New("no more processes")
	f := &fakes{fail: func(int) error {
		if failing.Load() {
			return errStart
		}
		return nil
	}}
	var rs restarts
	pl, logs := newPool(t, 1, f, func(c *Config[*fakeProc]) { c.OnRestart = rs.record; c.RestartBackoff = -1 })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s, _ := acquire(t, pl)
	failing.Store(true)
	pl.Replace(s, "process exited")

	s, err := pl.Acquire(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := pl.Proc(ctxFor(t, 5*time.Second), s); !errors.Is(err, errStart) {
		t.Fatalf("Proc with a failing start: %v, want %v", err, errStart)
	}
	pl.Release(s) // still empty
	if got := logs.String(); !strings.Contains(got, `msg="fake process could not be restarted" worker_id=w1 reason="process exited" error="no more processes"`) {
		t.Errorf("log = %q, want a failed-restart line", got)
	}
	if got := rs.all(); !slices.Equal(got, []string{"process exited: no more processes"}) {
		t.Errorf("OnRestart saw %q, want one failed restart", got)
	}

	failing.Store(false)
	s, p := acquire(t, pl)
	if p == nil || p.exited() {
		t.Fatal("Proc did not start a process for the empty slot")
	}
	pl.Release(s)
}

func TestCloseWaitsForCallsInFlight(t *testing.T) {
	f := &fakes{exitOnEOF: true}
	cleanups := atomic.Int32{}
	pl, _ := newPool(t, 2, f, func(c *Config[*fakeProc]) { c.Cleanup = func() { cleanups.Add(1) } })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s, p := acquire(t, pl)
	closed := make(chan error, 1)
	go func() { closed <- pl.Close(ctxFor(t, 10*time.Second)) }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a call in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, err := pl.Acquire(ctxFor(t, time.Second)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire during Close: %v, want ErrClosed", err)
	}
	if pl.Context().Err() == nil {
		t.Fatal("Close did not cancel the pool's context")
	}
	if p.exited() {
		t.Fatal("Close killed the process of a call it should wait for")
	}
	pl.Release(s)
	if err := within(t, 5*time.Second, "Close", func() error { return <-closed }); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, p := range f.all() {
		if p.eofs.Load() == 0 || p.kills.Load() != 1 || p.retires.Load() != 1 {
			// Retire kills once (a no-op for an exited process).
			t.Errorf("process %d: %d EOFs, %d kills, %d retires", p.id, p.eofs.Load(), p.kills.Load(), p.retires.Load())
		}
	}
	if n := cleanups.Load(); n != 1 {
		t.Errorf("Cleanup ran %d times, want 1", n)
	}
	// A second Close returns at once, and Cleanup does not run again.
	if err := within(t, time.Second, "second Close", func() error { return pl.Close(context.Background()) }); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := cleanups.Load(); n != 1 {
		t.Errorf("Cleanup ran %d times, want 1", n)
	}
}

func TestCloseKillsCallsWhenCtxEnds(t *testing.T) {
	f := &fakes{exitOnEOF: true}
	pl, _ := newPool(t, 1, f, nil)
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s, p := acquire(t, pl)
	// The "call": it ends when its process dies, as the engines' calls do.
	callDone := make(chan bool, 1)
	go func() {
		<-p.Done()
		killed := pl.Killed()
		pl.Replace(s, "instance closed")
		callDone <- killed
	}()
	err := within(t, 5*time.Second, "Close", func() error { return pl.Close(ctxFor(t, 100*time.Millisecond)) })
	if !errors.Is(err, ErrInFlight) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close: %v, want ErrInFlight and a deadline error", err)
	}
	if !<-callDone {
		t.Error("Killed() was false for a call Close cut off")
	}
	// Nothing is restarted after Close, and a late start is refused.
	if n := len(f.all()); n != 1 {
		t.Errorf("%d processes started, want 1 (no restart after Close)", n)
	}
	if late := (&fakeProc{done: make(chan struct{})}); pl.Track(late) {
		t.Error("Track accepted a process after Close killed everything")
	}
	if p.retires.Load() != 1 {
		t.Errorf("the killed process was retired %d times, want 1", p.retires.Load())
	}
}

func TestCloseBoundsRestartsOfEmptySlots(t *testing.T) {
	var failing atomic.Bool
	started := make(chan struct{}, 1)
	f := &fakes{}
	f.fail = func(n int) error {
		if failing.Load() {
			return errors.New("down")
		}
		return nil
	}
	pl, _ := newPool(t, 1, f, func(c *Config[*fakeProc]) { c.RestartBackoff = -1 })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s, _ := acquire(t, pl)
	failing.Store(true)
	pl.Replace(s, "crash")
	s, err := pl.Acquire(ctxFor(t, 5*time.Second))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// The next start blocks until its ctx ends: Close must end it.
	pl.cfg.Start = func(ctx context.Context) (*fakeProc, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	procErr := make(chan error, 1)
	go func() {
		_, err := pl.Proc(context.Background(), s)
		pl.Release(s)
		procErr <- err
	}()
	<-started
	if err := within(t, 5*time.Second, "Close", func() error { return pl.Close(ctxFor(t, 10*time.Second)) }); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-procErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Proc during Close: %v, want a cancellation", err)
	}
}

func TestAcquireWaitingIsEndedByClose(t *testing.T) {
	f := &fakes{exitOnEOF: true}
	pl, _ := newPool(t, 1, f, nil)
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	s, _ := acquire(t, pl)
	waiting := make(chan error, 1)
	go func() {
		_, err := pl.Acquire(ctxFor(t, 10*time.Second))
		waiting <- err
	}()
	time.Sleep(20 * time.Millisecond) // let it block (not needed for correctness)
	closed := make(chan error, 1)
	go func() { closed <- pl.Close(ctxFor(t, 10*time.Second)) }()
	if err := within(t, 5*time.Second, "waiting Acquire", func() error { return <-waiting }); !errors.Is(err, ErrClosed) {
		t.Fatalf("waiting Acquire: %v, want ErrClosed", err)
	}
	pl.Release(s)
	if err := within(t, 5*time.Second, "Close", func() error { return <-closed }); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestCloseGrace(t *testing.T) {
	for _, tc := range []struct {
		name        string
		exitOnEOF   bool
		outlast     bool
		ctxDur      time.Duration
		min, max    time.Duration
		wantKilled  bool
		description string
	}{
		{"exits on EOF", true, false, 10 * time.Second, 0, 2 * time.Second, false, "no kill needed"},
		{"killed after the grace", false, false, 10 * time.Second, 200 * time.Millisecond, 5 * time.Second, true, "grace ran out"},
		{"ctx ends the grace", false, false, 50 * time.Millisecond, 0, 2 * time.Second, true, "ctx ended first"},
		{"grace outlasts ctx", false, true, 50 * time.Millisecond, 200 * time.Millisecond, 5 * time.Second, true, "GraceOutlastsCtx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakes{exitOnEOF: tc.exitOnEOF}
			grace := 200 * time.Millisecond
			if tc.name == "ctx ends the grace" {
				grace = time.Minute
			}
			pl, _ := newPool(t, 2, f, func(c *Config[*fakeProc]) {
				c.Grace = grace
				c.GraceOutlastsCtx = tc.outlast
			})
			if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
				t.Fatalf("Fill: %v", errs)
			}
			ctx := ctxFor(t, tc.ctxDur) // no calls in flight: Close returns nil even when it ends
			start := time.Now()
			if err := within(t, 10*time.Second, "Close", func() error { return pl.Close(ctx) }); err != nil {
				t.Fatalf("Close: %v", err)
			}
			took := time.Since(start)
			if took < tc.min || took > tc.max {
				t.Errorf("Close took %v, want %v..%v (%s)", took, tc.min, tc.max, tc.description)
			}
			for _, p := range f.all() {
				if p.eofs.Load() == 0 {
					t.Errorf("process %d got no EOF", p.id)
				}
				// Retire counts one kill too; more is the kill after the grace.
				if killed := p.kills.Load() > 1; killed != tc.wantKilled {
					t.Errorf("process %d: killed before Retire %v, want %v", p.id, killed, tc.wantKilled)
				}
				if p.retires.Load() != 1 {
					t.Errorf("process %d retired %d times, want 1", p.id, p.retires.Load())
				}
			}
		})
	}
}

func TestSecondCloseWaitsForTheFirst(t *testing.T) {
	f := &fakes{exitOnEOF: true}
	release := make(chan struct{})
	pl, _ := newPool(t, 1, f, func(c *Config[*fakeProc]) { c.Cleanup = func() { <-release } })
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	first := make(chan error, 1)
	go func() { first <- pl.Close(ctxFor(t, 10*time.Second)) }()
	// The first Close is stuck in Cleanup: a second one gives up with its ctx.
	for pl.Context().Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if err := within(t, 5*time.Second, "second Close", func() error {
		return pl.Close(ctxFor(t, 50*time.Millisecond))
	}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Close: %v, want a deadline error", err)
	}
	second := make(chan error, 1)
	go func() { second <- pl.Close(ctxFor(t, 10*time.Second)) }()
	close(release)
	if err := within(t, 5*time.Second, "first Close", func() error { return <-first }); err != nil {
		t.Fatalf("first Close: %v", err)
	}
	if err := within(t, 5*time.Second, "third Close", func() error { return <-second }); err != nil {
		t.Fatalf("third Close: %v", err)
	}
}

func TestPipes(t *testing.T) {
	p, err := NewPipes()
	if err != nil {
		t.Fatal(err)
	}
	ends := p.ChildEnds()
	if len(ends) != 2 || ends[0] != p.ReqR || ends[1] != p.RespW {
		t.Fatalf("ChildEnds = %v, want [ReqR RespW]", ends)
	}
	if _, err := p.ReqW.Write([]byte("req")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.RespW.Write([]byte("resp")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := p.ReqR.Read(buf); err != nil || string(buf[:n]) != "req" {
		t.Fatalf("request pipe: %q, %v", buf[:n], err)
	}
	if n, err := p.RespR.Read(buf); err != nil || string(buf[:n]) != "resp" {
		t.Fatalf("response pipe: %q, %v", buf[:n], err)
	}
	p.CloseChildEnds()
	// With the child's ends closed the parent sees EOF on the responses.
	if _, err := p.RespR.Read(buf); err != io.EOF {
		t.Fatalf("response pipe after CloseChildEnds: %v, want EOF", err)
	}
	p.CloseParentEnds()
	if _, err := p.ReqW.Write([]byte("x")); err == nil {
		t.Fatal("request pipe still writable after CloseParentEnds")
	}
}
