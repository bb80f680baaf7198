package spares

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/lull"
)

type fake struct {
	id      int
	mu      sync.Mutex
	exited  bool
	retired bool
}

func (f *fake) Exited() bool  { f.mu.Lock(); defer f.mu.Unlock(); return f.exited }
func (f *fake) Healthy() bool { return true }
func (f *fake) Retire()       { f.mu.Lock(); f.retired, f.exited = true, true; f.mu.Unlock() }

func waitReady(t *testing.T, s *Set[*fake], n int) []*fake {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if r := s.Ready(); len(r) == n {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d ready, want %d", len(s.Ready()), n)
		}
	}
}

// Each process is handed out once; a dead one is retired, not handed out;
// a failing Start stops the refill until the next Take; Close retires
// what waits.
func TestSetHandsEachOutOnce(t *testing.T) {
	var started atomic.Int32
	var fail atomic.Bool
	var failures atomic.Int32
	s := &Set[*fake]{Want: 2,
		Start: func() (*fake, error) {
			if fail.Load() {
				return nil, errors.New("no")
			}
			return &fake{id: int(started.Add(1))}, nil
		},
		OnError: func(error) { failures.Add(1) }}
	if _, ok := s.Take(); ok {
		t.Fatal("a spare before any started")
	}
	ready := waitReady(t, s, 2)
	a, ok := s.Take()
	if !ok || a != ready[0] {
		t.Fatalf("took %v %v, want the first ready", a, ok)
	}
	ready = waitReady(t, s, 2)
	ready[0].mu.Lock()
	ready[0].exited = true // died while it waited
	ready[0].mu.Unlock()
	fail.Store(true) // the refill after this Take fails
	b, ok := s.Take()
	if !ok || b == ready[0] || b == a || !ready[0].retired {
		t.Fatalf("took %+v; the dead one %+v", b, ready[0])
	}
	for deadline := time.Now().Add(5 * time.Second); failures.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the failed start was not reported")
		}
	}
	fail.Store(false)
	if _, ok := s.Take(); ok {
		t.Fatal("a spare after the failed start")
	}
	last := waitReady(t, s, 2)
	s.Close()
	if !last[0].retired || !last[1].retired || len(s.Ready()) != 0 {
		t.Fatal("Close left spares running")
	}
	if _, ok := s.Take(); ok {
		t.Fatal("a spare after Close")
	}
}

// TakeDeferred starts the next spare only when its caller says so, once
// however often it says it.
func TestTakeDeferredStartsTheNextOnlyWhenAsked(t *testing.T) {
	var started atomic.Int32
	s := &Set[*fake]{Want: 1, Start: func() (*fake, error) { return &fake{id: int(started.Add(1))}, nil }}
	defer s.Close()
	if _, ok, refill := s.TakeDeferred(); ok {
		t.Fatal("a spare before any started")
	} else {
		time.Sleep(20 * time.Millisecond) // nothing may start meanwhile
		if n := started.Load(); n != 0 {
			t.Fatalf("%d started before refill", n)
		}
		refill()
		refill()
	}
	first := waitReady(t, s, 1)[0]
	p, ok, refill := s.TakeDeferred()
	if !ok || p != first {
		t.Fatalf("took %v %v, want the ready one", p, ok)
	}
	time.Sleep(20 * time.Millisecond)
	if n := started.Load(); n != 1 || len(s.Ready()) != 0 {
		t.Fatalf("%d started, %d ready before refill; want 1 and 0", n, len(s.Ready()))
	}
	refill()
	if next := waitReady(t, s, 1)[0]; next == first || started.Load() != 2 {
		t.Fatalf("the next spare: %+v, %d started", next, started.Load())
	}
}

// TakeAwaiting waits for a process being started when none is ready (one
// caller at a time: a second gets none at once), gets none when nothing
// is starting, gives up at its bound and when the start fails.
func TestTakeAwaitingWaitsForTheOneStarting(t *testing.T) {
	gate := make(chan error)
	var started atomic.Int32
	s := &Set[*fake]{Want: 1, Start: func() (*fake, error) {
		if err := <-gate; err != nil {
			return nil, err
		}
		return &fake{id: int(started.Add(1))}, nil
	}}
	ctx := t.Context()
	if _, ok, refill := s.TakeAwaiting(ctx, time.Second); ok {
		t.Fatal("a spare before any started")
	} else {
		refill() // the first start begins, held at the gate
	}
	type took struct {
		p  *fake
		ok bool
	}
	first := make(chan took, 1)
	go func() {
		p, ok, refill := s.TakeAwaiting(ctx, 10*time.Second)
		refill()
		first <- took{p, ok}
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		waiting := s.awaiting
		s.mu.Unlock()
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first caller does not wait for the spare being started")
		}
	}
	// A second caller meanwhile does not queue behind the first.
	if _, ok, _ := s.TakeAwaiting(ctx, 10*time.Second); ok {
		t.Fatal("a second caller got a spare while one was starting for the first")
	}
	gate <- nil // the spare is ready: the waiting caller gets it
	if got := <-first; !got.ok || got.p.id != 1 {
		t.Fatalf("the waiting caller got %+v, want the spare that was starting", got)
	}
	// The next start (the waiter's refill) fails: a caller waiting for it
	// is told at once.
	failed := make(chan bool, 1)
	go func() {
		_, ok, _ := s.TakeAwaiting(ctx, 10*time.Second)
		failed <- ok
	}()
	time.Sleep(20 * time.Millisecond)
	gate <- errors.New("no")
	select {
	case ok := <-failed:
		if ok {
			t.Fatal("a spare from a failed start")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller still waits after the start failed")
	}
	// Nothing starting: none at once, whatever the bound.
	start := time.Now()
	if _, ok, _ := s.TakeAwaiting(ctx, 10*time.Second); ok || time.Since(start) > 2*time.Second {
		t.Fatalf("nothing starting: ok %v after %v, want none at once", ok, time.Since(start))
	}
	// A start that takes longer than the bound: none after the bound.
	s.refill()
	if _, ok, _ := s.TakeAwaiting(ctx, 30*time.Millisecond); ok {
		t.Fatal("a spare from a start still held")
	}
	gate <- nil
	waitReady(t, s, 1)
	s.Close()
}

// With Settle, a take that leaves one ready starts the next only after
// Settle (not while the caller's call goes on); a take that leaves none
// starts it at once; Close cancels a start still settling.
func TestSettleDelaysTheNextStartWhileOneIsReady(t *testing.T) {
	var starts atomic.Int32
	s := &Set[*fake]{Want: 2, Settle: time.Hour,
		Start: func() (*fake, error) { return &fake{id: int(starts.Add(1))}, nil }}
	s.Take() // none ready: the first ones start at once
	waitReady(t, s, 2)
	if _, ok := s.Take(); !ok {
		t.Fatal("none ready")
	}
	time.Sleep(20 * time.Millisecond) // a start now would have begun
	if n := starts.Load(); n != 2 {
		t.Fatalf("%d starts while one was ready and the settle pending, want 2", n)
	}
	if _, ok := s.Take(); !ok { // the last one: the next start at once
		t.Fatal("none ready")
	}
	waitReady(t, s, 2)
	if n := starts.Load(); n != 4 {
		t.Fatalf("%d starts, want 4", n)
	}

	s.Settle = 10 * time.Millisecond
	s.Take()
	waitReady(t, s, 2) // started once settled
	s.Settle = time.Hour
	s.Take()
	s.Close()
	time.Sleep(20 * time.Millisecond)
	if s.settling != nil || len(s.Ready()) != 0 {
		t.Fatal("a start still settling after Close")
	}
}

// A caller that would wait for a spare being started does not wait for a
// settling one: TakeAwaiting starts it at once and takes it.
func TestTakeAwaitingStartsASettlingSpare(t *testing.T) {
	var starts atomic.Int32
	s := &Set[*fake]{Want: 2, Settle: time.Hour,
		Start: func() (*fake, error) { return &fake{id: int(starts.Add(1))}, nil }}
	t.Cleanup(s.Close)
	s.Take()
	waitReady(t, s, 2)
	s.Take()                          // one left: the next start settles
	_, ok, refill := s.TakeDeferred() // the last, its refill not called yet
	if !ok {
		t.Fatal("none ready")
	}
	defer refill()
	p, ok, r := s.TakeAwaiting(context.Background(), 5*time.Second)
	defer r()
	if !ok || p.id != 3 {
		t.Fatalf("took %+v %v, want the third start", p, ok)
	}
}

// A start that ends after Close is not reported as a failure (Close may
// take away what it needed), and a process it started is retired.
func TestAStartEndingAfterCloseIsNotReported(t *testing.T) {
	for _, failAfterClose := range []bool{true, false} {
		release := make(chan struct{})
		var started *fake
		startDone := make(chan struct{})
		var reported atomic.Int32
		s := &Set[*fake]{Want: 1,
			Start: func() (*fake, error) {
				defer close(startDone)
				<-release
				if failAfterClose {
					return nil, errors.New("its slot is gone")
				}
				started = &fake{id: 1}
				return started, nil
			},
			OnError: func(error) { reported.Add(1) }}
		if _, ok := s.Take(); ok {
			t.Fatal("a spare before any started")
		}
		s.Close()
		close(release)
		<-startDone
		// startOne goes on after Start returned: a report would come at
		// once (within 200 ms here), a retirement is waited for.
		quiet := time.Now().Add(200 * time.Millisecond)
		for reported.Load() == 0 && time.Now().Before(quiet) {
			time.Sleep(time.Millisecond)
		}
		if n := reported.Load(); n != 0 {
			t.Fatalf("fail after close %v: %d failures reported, want none", failAfterClose, n)
		}
		if !failAfterClose {
			deadline := time.Now().Add(5 * time.Second)
			for !started.Exited() {
				if time.Now().After(deadline) {
					t.Fatal("the process started after Close was not retired")
				}
				time.Sleep(time.Millisecond)
			}
		}
		if len(s.Ready()) != 0 {
			t.Fatal("a process ready after Close")
		}
	}
}

// With a Lull gate, a settling start waits, besides Settle, until no call
// has run on the gate for Settle: a call in flight holds it (up to
// SettleMax), and it starts once the call ends.
func TestASettlingStartWaitsForALull(t *testing.T) {
	var starts atomic.Int32
	g := &lull.Gate{}
	s := &Set[*fake]{Want: 2, Settle: 5 * time.Millisecond, Lull: g, SettleMax: time.Hour,
		Start: func() (*fake, error) { return &fake{id: int(starts.Add(1))}, nil }}
	t.Cleanup(s.Close)
	s.Take()
	waitReady(t, s, 2)
	end := g.Begin()
	if _, ok := s.Take(); !ok {
		t.Fatal("none ready")
	}
	for range 10 {
		time.Sleep(5 * time.Millisecond) // its settle, many times over
		if n := starts.Load(); n != 2 {
			t.Fatalf("%d starts while a call was in flight, want 2", n)
		}
	}
	end()
	waitReady(t, s, 2)
	if n := starts.Load(); n != 3 {
		t.Fatalf("%d starts, want 3", n)
	}
}
