package spares

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
