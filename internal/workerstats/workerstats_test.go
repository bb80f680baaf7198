package workerstats

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func mustRead(t *testing.T, st state.Store, id string) Totals {
	t.Helper()
	tot, ok, err := Read(context.Background(), st, id)
	if err != nil || !ok {
		t.Fatalf("Read(%s) = %v, %v", id, ok, err)
	}
	return tot
}

// Two nodes' counts are summed; a flush repeated without new counts, or a
// node restarting under the same id, counts nothing twice; the last error
// is the newest of all nodes'.
func TestNodesAreSummedAndRestartsCarryOver(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	a, b := NewRecorder(st, "a", quiet()), NewRecorder(st, "b", quiet())
	at := time.UnixMilli(1_700_000_000_000)
	for range 3 {
		a.Worker("w").Processed()
	}
	a.Worker("w").Failed("KeyError: 'price'", "o-1", at)
	b.Worker("w").Failed("KeyError: 'qty'", "o-2", at.Add(time.Second))
	b.Worker("w").DeadLettered("", "", time.Time{})
	for range 2 {
		for _, r := range []*Recorder{a, b} {
			if err := r.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	got := mustRead(t, st, "w")
	want := Totals{Counts: Counts{Processed: 3, Failed: 2, DeadLettered: 1}, Last: LastError{Text: "KeyError: 'qty'", AtMS: at.Add(time.Second).UnixMilli(), EventID: "o-2"}}
	if got != want {
		t.Fatalf("totals = %+v, want %+v", got, want)
	}
	// a restarts: a new process under the same node id starts from zero.
	a2 := NewRecorder(st, "a", quiet())
	a2.Worker("w").Processed()
	if err := a2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a2.Worker("w").Processed()
	if err := a2.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, st, "w"); got.Processed != 5 || got.Failed != 2 || got.DeadLettered != 1 {
		t.Fatalf("after a restart: %+v, want 5 processed, 2 failed, 1 dead-lettered", got)
	}
	if _, ok, err := Read(ctx, st, "other"); ok || err != nil {
		t.Fatalf("an unreported worker: %v, %v", ok, err)
	}
	many, err := ReadMany(ctx, st, []string{"w", "other"})
	if err != nil || len(many) != 1 || many["w"].Processed != 5 {
		t.Fatalf("ReadMany = %+v, %v", many, err)
	}
}

// A key keeps at most MaxNodes entries; the ones folded away still count,
// also when their node writes again.
func TestEntriesBeyondMaxNodesAreFoldedNotLost(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	clock := time.UnixMilli(1_700_000_000_000)
	var first *Recorder
	for i := range MaxNodes + 5 {
		r := NewRecorder(st, fmt.Sprintf("n%02d", i), quiet())
		r.now = func() time.Time { return clock.Add(time.Duration(i) * time.Second) }
		if i == 0 {
			first = r
		}
		r.Worker("w").Processed()
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	it, _ := st.Get(ctx, Key("w"))
	if n := len(it.Value); n > 16<<10 {
		t.Errorf("key is %d bytes", n)
	}
	if got := mustRead(t, st, "w"); got.Processed != MaxNodes+5 {
		t.Fatalf("processed = %d, want %d", got.Processed, MaxNodes+5)
	}
	// n00 was folded away; it counts one more.
	first.now = func() time.Time { return clock.Add(time.Hour) }
	first.Worker("w").Processed()
	if err := first.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, st, "w"); got.Processed != MaxNodes+6 {
		t.Fatalf("processed = %d, want %d", got.Processed, MaxNodes+6)
	}
}

// A nil Recorder and Counter count nothing and do not fail.
func TestNilRecorder(t *testing.T) {
	var r *Recorder
	c := r.Worker("w")
	c.Processed()
	c.Failed("x", "e", time.Now())
	c.DeadLettered("", "", time.Time{})
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Counting goes on while a flush writes (the hot path never waits for
// one); every count reaches the store by the last flush.
func TestCountingDuringFlushesLosesNothing(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	r := NewRecorder(st, "n", quiet())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2000 {
			r.Worker(fmt.Sprintf("w%d", i%4)).Processed()
		}
	}()
	for {
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
			if err := r.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			sum := int64(0)
			for i := range 4 {
				sum += mustRead(t, st, fmt.Sprintf("w%d", i)).Processed
			}
			if sum != 2000 {
				t.Fatalf("processed %d, want 2000", sum)
			}
			return
		default:
		}
	}
}

// A dead letter that no failed attempt preceded (crashed, not_runnable,
// too_large) still sets the last error: GetWorker shows why it was given
// up on. An empty text keeps the last error.
func TestDeadLetterWithoutAnAttemptSetsTheLastError(t *testing.T) {
	c := NewRecorder(state.NewMemoryStore(), "n", quiet()).Worker("w")
	at := time.UnixMilli(1_700_000_000_000)
	c.DeadLettered("event was in flight when the node crashed", "boom-1", at)
	counts, last := c.snapshot()
	if counts.DeadLettered != 1 || last.Text != "event was in flight when the node crashed" || last.EventID != "boom-1" || last.AtMS != at.UnixMilli() {
		t.Fatalf("counts %+v, last %+v", counts, last)
	}
	c.DeadLettered("", "other", at.Add(time.Second))
	if _, last := c.snapshot(); last.EventID != "boom-1" {
		t.Fatalf("an empty text replaced the last error: %+v", last)
	}
}
