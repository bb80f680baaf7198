package procpool

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// With Warm below Size, Fill starts Warm processes; a call that finds them
// busy takes a cold slot (its process starts for it) when Grow says so,
// and waits when it does not until Wake; idle extra processes are retired
// after IdleRetire, never below Warm.
func TestColdSlotsGrowAndRetire(t *testing.T) {
	f := &fakes{}
	var grow atomic.Bool
	pl, _ := newPool(t, 3, f, func(c *Config[*fakeProc]) {
		c.Warm, c.IdleRetire = 1, 20*time.Millisecond
		c.Grow = grow.Load
	})
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	if n := len(f.all()); n != 1 || pl.Live() != 1 {
		t.Fatalf("Fill started %d processes, %d live slots; want 1", n, pl.Live())
	}
	s1, _ := acquire(t, pl)

	// Busy, and Grow says no: the call waits, until Wake with Grow yes.
	got := make(chan *Slot[*fakeProc], 1)
	go func() {
		s, err := pl.Acquire(ctxFor(t, 5*time.Second))
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		got <- s
	}()
	select {
	case <-got:
		t.Fatal("a call took a cold slot while Grow said no")
	case <-time.After(50 * time.Millisecond):
	}
	grow.Store(true)
	pl.Wake()
	s2 := within(t, 5*time.Second, "the woken call", func() *Slot[*fakeProc] { return <-got })
	if _, err := pl.Proc(ctxFor(t, 5*time.Second), s2); err != nil {
		t.Fatalf("Proc of the cold slot: %v", err)
	}
	s3, _ := acquire(t, pl) // the third slot, cold too
	if n := len(f.all()); n != 3 || pl.Live() != 3 {
		t.Fatalf("%d processes, %d live slots after growing; want 3", n, pl.Live())
	}
	// Full: a fourth call waits for a slot.
	if _, err := pl.Acquire(ctxFor(t, 50*time.Millisecond)); err == nil {
		t.Fatal("a fourth call got a slot of a full pool")
	}
	pl.Release(s1)
	pl.Release(s2)
	pl.Release(s3)
	within(t, 5*time.Second, "retiring the idle extra processes", func() bool {
		for pl.Live() != 1 {
			<-time.After(5 * time.Millisecond)
		}
		return true
	})
	retired := 0
	for _, p := range f.all() {
		retired += int(p.retires.Load())
	}
	if retired != 2 {
		t.Fatalf("%d processes retired, want 2", retired)
	}
	// The one left serves, and the pool grows again.
	s, p := acquire(t, pl)
	if p.exited() {
		t.Fatal("the warm process was retired")
	}
	s4, _ := acquire(t, pl)
	if n := len(f.all()); n != 4 {
		t.Fatalf("%d processes started after growing again, want 4", n)
	}
	pl.Release(s)
	pl.Release(s4)
}

// With ParkIdle, an idle pool retires every process, the warm one too; the
// next call starts one for itself even though Grow says no (no slot is
// live), and the pool parks again once idle.
func TestIdlePoolParks(t *testing.T) {
	f := &fakes{}
	pl, _ := newPool(t, 2, f, func(c *Config[*fakeProc]) {
		c.Warm, c.IdleRetire, c.ParkIdle = 1, time.Hour, 30*time.Millisecond
		c.Grow = func() bool { return false }
	})
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	parked := func(what string) {
		t.Helper()
		within(t, 5*time.Second, what, func() bool {
			for pl.Live() != 0 {
				<-time.After(5 * time.Millisecond)
			}
			return true
		})
	}
	parked("parking the idle pool")
	if p := f.all()[0]; !p.exited() || p.retires.Load() != 1 {
		t.Fatalf("the warm process: exited %v, retired %d times; want retired once", p.exited(), p.retires.Load())
	}
	s, p := acquire(t, pl)
	if p.exited() || len(f.all()) != 2 {
		t.Fatalf("the call after parking: process exited %v, %d started; want a fresh one, 2 started", p.exited(), len(f.all()))
	}
	pl.Release(s)
	parked("parking again")
}

// A call that comes while the pool parks its last process (the process
// gone, its slot not yet cold) starts the next one once the slot is cold,
// rather than wait for its deadline (seen in `make test`: a parked Python
// worker's next event waited 30 s).
func TestACallDuringParkingStartsTheNextProcess(t *testing.T) {
	f := &fakes{firstRetiring: make(chan struct{}), firstGate: make(chan struct{})}
	pl, _ := newPool(t, 1, f, func(c *Config[*fakeProc]) {
		c.Warm, c.IdleRetire, c.ParkIdle = 1, time.Hour, 30*time.Millisecond
	})
	if errs := pl.Fill(ctxFor(t, 5*time.Second)); errs != nil {
		t.Fatalf("Fill: %v", errs)
	}
	within(t, 5*time.Second, "parking the idle process", func() bool { <-f.firstRetiring; return true })
	got := make(chan error, 1)
	go func() {
		s, err := pl.Acquire(ctxFor(t, 5*time.Second))
		if err == nil {
			pl.Release(s)
		}
		got <- err
	}()
	// The call waits (no free slot, none cold) before the slot goes cold:
	// give it the time to get there. Without that, the test passes
	// without testing anything; it never fails because of it.
	time.Sleep(50 * time.Millisecond)
	close(f.firstGate)
	if err := within(t, 3*time.Second, "the call made during parking", func() error { return <-got }); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if n := len(f.all()); n != 2 {
		t.Fatalf("%d processes started, want 2 (the parked one and the call's)", n)
	}
}

// FillParked starts nothing; the first call starts a process, which parks
// again when idle.
func TestFillParkedStartsOnTheFirstCall(t *testing.T) {
	f := &fakes{}
	pl, _ := newPool(t, 2, f, func(c *Config[*fakeProc]) {
		c.Warm, c.IdleRetire, c.ParkIdle = 1, time.Hour, 30*time.Millisecond
		c.Grow = func() bool { return false }
	})
	pl.FillParked()
	if n := len(f.all()); n != 0 || pl.Live() != 0 {
		t.Fatalf("FillParked started %d processes (%d live), want none", n, pl.Live())
	}
	s, p := acquire(t, pl)
	if p.exited() || len(f.all()) != 1 {
		t.Fatalf("the first call: process exited %v, %d started; want one fresh", p.exited(), len(f.all()))
	}
	pl.Release(s)
	within(t, 5*time.Second, "parking the idle pool", func() bool {
		for pl.Live() != 0 {
			<-time.After(5 * time.Millisecond)
		}
		return true
	})
}

// A call waiting for a parked pool whose process failed to start is
// woken when the slot's backoff ends and tries again, rather than wait
// for its deadline.
func TestACallWaitingOnAFailedStartTriesAgainAfterTheBackoff(t *testing.T) {
	f := &fakes{fail: func(n int) error {
		if n == 1 {
			return errors.New("the first start fails")
		}
		return nil
	}}
	pl, _ := newPool(t, 1, f, func(c *Config[*fakeProc]) {
		c.Warm, c.IdleRetire, c.ParkIdle = 1, time.Hour, time.Hour
		c.RestartBackoff = 50 * time.Millisecond
	})
	pl.FillParked()
	err := within(t, 3*time.Second, "the call after a failed start", func() error {
		s, err := pl.Acquire(ctxFor(t, 5*time.Second))
		if err != nil {
			return err
		}
		defer pl.Release(s)
		_, err = pl.Proc(ctxFor(t, 5*time.Second), s)
		return err
	})
	if err != nil {
		t.Fatalf("the call after a failed start: %v", err)
	}
	if n := len(f.all()); n != 2 {
		t.Fatalf("%d starts, want 2 (the failed one and the retry)", n)
	}
}
