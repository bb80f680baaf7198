package procpool

import (
	"testing"
	"time"
)

func newFake(id int) *fakeProc { return &fakeProc{id: id, done: make(chan struct{})} }

// Take returns what was parked under its key, once; other keys get nothing.
func TestParkingTakesByKey(t *testing.T) {
	pk := &Parking[string, *fakeProc]{TTL: time.Minute, Max: 4}
	a, b := newFake(1), newFake(2)
	pk.Park("a", a)
	pk.Park("b", b)
	if p, ok := pk.Take("c"); ok {
		t.Fatalf("took %d under an unknown key", p.id)
	}
	if p, ok := pk.Take("a"); !ok || p != a {
		t.Fatalf("Take(a) = %v %v", p, ok)
	}
	if _, ok := pk.Take("a"); ok {
		t.Fatal("a taken twice")
	}
	if a.retires.Load() != 0 || pk.Len() != 1 {
		t.Fatalf("taken process retired %d times, %d still parked", a.retires.Load(), pk.Len())
	}
	pk.Close()
	if b.retires.Load() != 1 || pk.Len() != 0 {
		t.Fatalf("Close: b retired %d times, %d parked", b.retires.Load(), pk.Len())
	}
}

// A process not taken within TTL is retired; beyond Max the oldest goes; a
// second process under one key replaces the first; parking off retires at
// once.
func TestParkingRetires(t *testing.T) {
	pk := &Parking[string, *fakeProc]{TTL: 20 * time.Millisecond, Max: 2}
	old := newFake(1)
	pk.Park("x", old)
	select {
	case <-old.done:
	case <-time.After(5 * time.Second):
		t.Fatal("parked process not retired after its TTL")
	}
	if _, ok := pk.Take("x"); ok || pk.Len() != 0 {
		t.Fatal("expired process still parked")
	}

	pk = &Parking[string, *fakeProc]{TTL: time.Minute, Max: 2}
	p1, p2, p3, p4 := newFake(1), newFake(2), newFake(3), newFake(4)
	pk.Park("1", p1)
	pk.Park("2", p2)
	pk.Park("3", p3) // over Max: 1 goes
	if p1.retires.Load() != 1 || pk.Len() != 2 {
		t.Fatalf("oldest retired %d times, %d parked", p1.retires.Load(), pk.Len())
	}
	pk.Park("3", p4) // same key: p3 goes
	if p3.retires.Load() != 1 {
		t.Fatal("replaced process not retired")
	}
	if p, ok := pk.Take("3"); !ok || p != p4 {
		t.Fatalf("Take(3) = %v", p)
	}
	pk.Close()

	var off Parking[string, *fakeProc]
	p5 := newFake(5)
	off.Park("5", p5)
	if p5.retires.Load() != 1 || off.Len() != 0 {
		t.Fatal("zero Parking kept a process")
	}
}

// TakeFor hands over a live, usable process, registered with the pool; a
// dead or unusable one is retired instead.
func TestParkingTakeFor(t *testing.T) {
	f := &fakes{}
	pool := New(Config[*fakeProc]{Size: 1, Start: f.start})
	f.pool = pool
	pk := &Parking[string, *fakeProc]{TTL: time.Minute, Max: 4}
	dead, unusable, good := newFake(1), newFake(2), newFake(3)
	dead.exit()
	pk.Park("dead", dead)
	pk.Park("unusable", unusable)
	pk.Park("good", good)
	usable := func(p *fakeProc) bool { return p != unusable }
	for _, k := range []string{"dead", "unusable", "none"} {
		if _, ok := pk.TakeFor(k, pool, usable); ok {
			t.Fatalf("TakeFor(%s) handed a process over", k)
		}
	}
	if dead.retires.Load() != 1 || unusable.retires.Load() != 1 {
		t.Fatalf("dead retired %d, unusable %d times", dead.retires.Load(), unusable.retires.Load())
	}
	p, ok := pk.TakeFor("good", pool, usable)
	if !ok || p != good || good.retires.Load() != 0 {
		t.Fatalf("TakeFor(good) = %v %v", p, ok)
	}
	pool.mu.Lock()
	_, tracked := pool.procs[good]
	pool.mu.Unlock()
	if !tracked {
		t.Fatal("handed-over process not tracked by the pool")
	}
}

// Discard parks nothing: the process is retired in the background, and
// Close waits for it; after Close, at once.
func TestParkingDiscardRetiresAndCloseWaits(t *testing.T) {
	pk := &Parking[string, *fakeProc]{TTL: time.Minute, Max: 4}
	p := newFake(1)
	pk.Discard(p)
	if pk.Len() != 0 {
		t.Fatal("a discarded process was parked")
	}
	if _, ok := pk.Take("any"); ok {
		t.Fatal("a discarded process was handed out")
	}
	pk.Close()
	if p.retires.Load() != 1 {
		t.Fatalf("retired %d times after Close, want once", p.retires.Load())
	}
	// After Close (a check that ends during the engine's Close): retired
	// before Discard returns.
	late := newFake(2)
	pk.Discard(late)
	if late.retires.Load() != 1 {
		t.Fatalf("a process discarded after Close retired %d times, want once", late.retires.Load())
	}
}
