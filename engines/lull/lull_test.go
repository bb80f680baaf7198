package lull

import (
	"sync/atomic"
	"testing"
	"time"
)

// waitFor waits until cond holds (at most 10 s).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 10 s", what)
		}
	}
}

// Work waits while a call runs and until the gate has been quiet for its
// settle; it runs at its bound under calls that never pause; a stopped
// timer never runs; a nil gate waits the settle only.
func TestAfterWaitsForALull(t *testing.T) {
	t.Run("a call in flight holds it", func(t *testing.T) {
		g := &Gate{}
		end := g.Begin()
		var ran atomic.Bool
		g.After(time.Millisecond, time.Hour, func() { ran.Store(true) })
		// Many times its settle with the call still running: it waits.
		for range 20 {
			time.Sleep(2 * time.Millisecond)
			if ran.Load() {
				t.Fatal("ran while a call was in flight")
			}
		}
		end()
		end() // once only
		waitFor(t, "run after the call ended", ran.Load)
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.inFlight != 0 {
			t.Fatalf("%d calls in flight after the one ended twice, want 0", g.inFlight)
		}
	})
	t.Run("it runs no sooner than settle after the last call", func(t *testing.T) {
		g := &Gate{}
		var ranAt atomic.Int64
		g.Begin()()
		ended := time.Now()
		start := time.Now()
		g.After(30*time.Millisecond, time.Hour, func() { ranAt.Store(time.Now().UnixNano()) })
		waitFor(t, "run", func() bool { return ranAt.Load() != 0 })
		if at := time.Unix(0, ranAt.Load()); at.Before(ended.Add(30*time.Millisecond)) || at.Before(start.Add(30*time.Millisecond)) {
			t.Fatalf("ran %v after the last call, %v after After, want both ≥ 30ms", at.Sub(ended), at.Sub(start))
		}
	})
	t.Run("calls that never pause hold it until its bound", func(t *testing.T) {
		g := &Gate{}
		end := g.Begin()
		defer end()
		var ran atomic.Bool
		start := time.Now()
		g.After(time.Millisecond, 50*time.Millisecond, func() { ran.Store(true) })
		waitFor(t, "run at its bound", ran.Load)
		if since := time.Since(start); since < 50*time.Millisecond {
			t.Fatalf("ran %v after After with a call in flight, want its bound (50ms) first", since)
		}
	})
	t.Run("a stopped timer never runs", func(t *testing.T) {
		g := &Gate{}
		var ran atomic.Bool
		tm := g.After(5*time.Millisecond, 10*time.Millisecond, func() { ran.Store(true) })
		if !tm.Stop() {
			t.Fatal("Stop reported it had run")
		}
		done := g.After(20*time.Millisecond, 20*time.Millisecond, func() {})
		waitFor(t, "a later timer run", func() bool { return !done.Stop() })
		if ran.Load() || tm.Stop() {
			t.Fatal("a stopped timer ran, or stopped twice")
		}
	})
	t.Run("nil gate", func(t *testing.T) {
		var g *Gate
		var ran atomic.Bool
		g.After(time.Millisecond, time.Hour, func() { ran.Store(true) })
		waitFor(t, "run", ran.Load)
	})
}
