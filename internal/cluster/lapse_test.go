package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Issue 33 item 5: a heartbeat that finds the node's previous one lapsed
// (peers may have counted it gone: paused, store unreachable) counts a
// lapse, so that the node reconciles before it serves again; the first
// heartbeat and heartbeats in time do not.
func TestLapseCountedWhenAHeartbeatEndsIt(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := members(state.NewMemoryStore(), c, "a") // TTL 30 s
	a.LapseMargin = 10 * time.Second
	beat := func() {
		t.Helper()
		if err := a.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	c.add(19 * time.Second)
	beat()
	if a.Lapses() != 0 {
		t.Fatalf("lapses %d after heartbeats in time", a.Lapses())
	}
	c.add(21 * time.Second) // paused: no heartbeat for longer than TTL - margin
	if a.Member(a.LapseMargin) {
		t.Fatal("still a member")
	}
	beat()
	if a.Lapses() != 1 || !a.Member(a.LapseMargin) {
		t.Fatalf("after the lapse: lapses %d, member %v; want 1, true", a.Lapses(), a.Member(a.LapseMargin))
	}
	c.add(5 * time.Second)
	beat()
	if a.Lapses() != 1 {
		t.Fatalf("lapses %d, want 1", a.Lapses())
	}
}

// failingPuts fails the writes while fail is set.
type failingPuts struct {
	state.Store
	mu   sync.Mutex
	fail bool
	puts int
}

func (f *failingPuts) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	f.mu.Lock()
	f.puts++
	fail := f.fail
	f.fail = false // the next write succeeds
	f.mu.Unlock()
	if fail {
		return errors.New("injected: daprd restarting")
	}
	return f.Store.Put(ctx, key, value, opts)
}

// One failed heartbeat is not a lapse: Run tries again after a fifth of
// the interval, well within the TTL less the margin, instead of a whole
// interval later (which is when the node stops being a member).
func TestOneFailedHeartbeatIsNotALapse(t *testing.T) {
	const interval = time.Second
	store := &failingPuts{Store: state.NewMemoryStore()}
	m := New(store, "a", 3*interval)
	m.LapseMargin = interval
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	store.mu.Lock()
	store.fail = true // Run's first heartbeat fails
	store.mu.Unlock()
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx, slog.New(slog.DiscardHandler), interval) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		store.mu.Lock()
		puts := store.puts
		store.mu.Unlock()
		if puts >= 3 { // the first, the failed one, the retry
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d heartbeat writes in 10 s", puts)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if m.Lapses() != 0 {
		t.Fatalf("lapses %d after one failed heartbeat; want 0", m.Lapses())
	}
}
