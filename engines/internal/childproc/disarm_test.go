package childproc

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

// TestDisarmIsFinal is issue 34's item 2: a round trip that ends just as
// its deadline passes. Once Disarm has returned, Healthy must not change
// for that round trip: a caller that saw it healthy gives the process to
// the next call, which a late timeout would then kill. (On the old code
// the timer's Stop returning false only meant the timeout function had
// started, not that it had marked the process.)
func TestDisarmIsFinal(t *testing.T) {
	p := &Proc{exited: true} // Kill does nothing: no real process
	p.timer = time.AfterFunc(time.Hour, p.onTimeout)
	p.timer.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// With one P, a caller that sleeps until just past the deadline is
	// woken by the same timer run that starts the timeout function, and
	// runs first: it disarms while the timeout function has started but
	// not marked the process yet (what a busy node sees now and then).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	iterations := 2000
	if testing.Short() {
		iterations = 300
	}
	late, timedOut := 0, 0
	for i := range iterations {
		p.timedOut.Store(false)
		wait := time.Duration(50+rand.IntN(100)) * time.Microsecond
		if !p.Arm(ctx, time.Now().Add(wait)) {
			continue
		}
		time.Sleep(wait + time.Duration(i%4)*5*time.Microsecond)
		p.Disarm()
		if !p.Healthy() {
			timedOut++
			continue
		}
		// Give a timeout function that already started every chance to
		// run to its end.
		runtime.Gosched()
		time.Sleep(10 * time.Microsecond)
		if !p.Healthy() {
			late++
		}
	}
	if late > 0 {
		t.Fatalf("%d of %d round trips were marked timed out after Disarm had found them healthy (%d timed out before)", late, iterations, timedOut)
	}
	t.Logf("%d iterations, %d timed out before Disarm", iterations, timedOut)
}

// TestCancelAfterDisarmIsIgnored: a ctx cancelled after the round trip
// ended does not mark or kill the process, even if its AfterFunc had
// already started; a cancel during the next round trip of the same
// process with another ctx is that round trip's only.
func TestCancelAfterDisarmIsIgnored(t *testing.T) {
	p := &Proc{exited: true}
	p.timer = time.AfterFunc(time.Hour, p.onTimeout)
	p.timer.Stop()
	for range 500 {
		ctx, cancel := context.WithCancel(context.Background())
		p.cancelled.Store(false)
		p.Arm(ctx, time.Now().Add(time.Hour))
		go cancel()
		p.Disarm()
		healthy := p.Healthy()
		runtime.Gosched()
		time.Sleep(5 * time.Microsecond)
		if healthy && !p.Healthy() {
			t.Fatal("a cancellation after Disarm marked the process")
		}
		// The stale cancel must not hit the next round trip either.
		p.cancelled.Store(false)
		p.Arm(context.Background(), time.Now().Add(time.Hour))
		time.Sleep(5 * time.Microsecond)
		p.Disarm()
		if !p.Healthy() {
			t.Fatal("a stale cancellation marked the next round trip")
		}
	}
}
