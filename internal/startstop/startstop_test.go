package startstop

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// journal records what the services of a test did, in order.
type journal struct {
	mu    sync.Mutex
	lines []string
}

func (j *journal) add(s string) { j.mu.Lock(); j.lines = append(j.lines, s); j.mu.Unlock() }

func (j *journal) get() []string { j.mu.Lock(); defer j.mu.Unlock(); return slices.Clone(j.lines) }

// recorded is a service that notes its start and stop in j.
func recorded(j *journal, name string) *Func {
	return Funcs(name, func(context.Context) error { j.add("start " + name); return nil }, func() { j.add("stop " + name) })
}

func testLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// wait fails the test unless ch closes within a few seconds.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestGroupStartsInOrderAndStopsInReverse(t *testing.T) {
	j := &journal{}
	g := NewGroup(testLog(), recorded(j, "a"), recorded(j, "b"), recorded(j, "c"))
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait(t, g.Started(), "the group to start")
	g.Stop()
	want := []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestLoopStopWaitsForTheLoopToReturn(t *testing.T) {
	running := make(chan struct{})
	var returned bool
	l := Loop("loop", func(ctx context.Context) {
		close(running)
		<-ctx.Done()
		returned = true // read after Stop: Stop must wait for this
	})
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	wait(t, l.Started(), "the loop to start")
	wait(t, running, "the loop to run")
	l.Stop()
	if !returned {
		t.Fatal("Stop returned before the loop did")
	}
}

func TestLoopEndsWithStartContextUnlessDetached(t *testing.T) {
	for _, detached := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		l := Loop("loop", func(ctx context.Context) { <-ctx.Done(); close(ended) })
		if detached {
			l.Detached()
		}
		if err := l.Start(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		if !detached {
			wait(t, ended, "the loop to end with its context")
		}
		select {
		case <-ended:
			if detached {
				t.Fatal("a detached loop ended with the context Start was given")
			}
		default:
		}
		l.Stop()
		wait(t, ended, "the loop to end on Stop")
	}
}

func TestFailingStartStopsTheStartedOnes(t *testing.T) {
	j := &journal{}
	loopEnded := make(chan struct{})
	boom := errors.New("boom")
	g := NewGroup(testLog(),
		recorded(j, "a"),
		Loop("loop", func(ctx context.Context) { <-ctx.Done(); close(loopEnded) }),
		Funcs("bad", func(context.Context) error { return boom }, func() { j.add("stop bad") }),
		recorded(j, "never"))
	err := g.Start(context.Background())
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("Start: got %v, want boom naming the service", err)
	}
	wait(t, loopEnded, "the started loop to be stopped")
	want := []string{"start a", "stop a"} // "bad" did not start: its stop does not run
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	select {
	case <-g.Started():
		t.Fatal("a group that failed to start says it started")
	default:
	}
	g.Stop() // not running: nothing happens
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("Stop after a failed Start: got %v, want %v", got, want)
	}
}

func TestStopOfANeverStartedServiceDoesNothing(t *testing.T) {
	j := &journal{}
	f := recorded(j, "a")
	f.Stop()
	NewGroup(testLog(), recorded(j, "b")).Stop()
	Loop("loop", func(context.Context) { j.add("ran") }).Stop()
	if got := j.get(); len(got) != 0 {
		t.Fatalf("got %v, want nothing", got)
	}
}

func TestServiceRestartsAfterStop(t *testing.T) {
	j := &journal{}
	f := recorded(j, "a")
	for range 2 {
		if err := f.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := f.Start(context.Background()); err == nil {
			t.Fatal("a running service started again")
		}
		f.Stop()
		f.Stop() // second Stop: nothing
	}
	want := []string{"start a", "stop a", "start a", "stop a"}
	if got := j.get(); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestGroupStopIsBounded(t *testing.T) {
	j := &journal{}
	release := make(chan struct{})
	defer close(release)
	g := NewGroup(testLog(), recorded(j, "a"), OnStop("stuck", func() { <-release }).StopWithin(10*time.Millisecond))
	g.StopTimeout = time.Hour // the service's own bound applies
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { g.Stop(); close(done) }()
	wait(t, done, "Stop to give up on the stuck service")
	if got := j.get(); !slices.Equal(got, []string{"start a", "stop a"}) {
		t.Fatalf("got %v: the services before the stuck one were not stopped", got)
	}
}
