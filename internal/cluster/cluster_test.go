package cluster

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func members(store state.Store, c *clock, id string) *Members {
	m := New(store, id, 30*time.Second)
	m.now = c.now
	return m
}

func alive(t *testing.T, m *Members) string {
	t.Helper()
	ids, err := m.Alive(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(ids)
}

func TestHeartbeatExpiryAndLeave(t *testing.T) {
	ctx := context.Background()
	store, c := state.NewMemoryStore(), &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a, b := members(store, c, "a"), members(store, c, "b")
	if got := alive(t, a); got != "[]" {
		t.Fatalf("empty cluster: %s", got)
	}
	for _, m := range []*Members{b, a} {
		if err := m.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := alive(t, a); got != "[a b]" {
		t.Fatalf("alive: %s", got)
	}
	c.add(20 * time.Second)
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	c.add(15 * time.Second) // b last seen 35 s ago, a 15 s ago
	if got := alive(t, b); got != "[a]" {
		t.Fatalf("b missed its heartbeats: %s", got)
	}
	if err := b.Heartbeat(ctx); err != nil { // b comes back
		t.Fatal(err)
	}
	if got := alive(t, a); got != "[a b]" {
		t.Fatalf("b is back: %s", got)
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if got := alive(t, b); got != "[b]" {
		t.Fatalf("a left: %s", got)
	}
}

// Expired entries are dropped from the stored map, not only hidden.
func TestHeartbeatPrunesGoneNodes(t *testing.T) {
	ctx := context.Background()
	store, c := state.NewMemoryStore(), &clock{t: time.Unix(1e9, 0)}
	for i := range 5 {
		if err := members(store, c, fmt.Sprint("old", i)).Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c.add(time.Minute)
	a := members(store, c, "a")
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	ms, err := a.read(ctx)
	if err != nil || len(ms) != 1 {
		t.Fatalf("stored members after prune: %v %v", ms, err)
	}
}

// Concurrent heartbeats of many nodes all land (ETag retry).
func TestConcurrentHeartbeats(t *testing.T) {
	ctx := context.Background()
	store, c := state.NewMemoryStore(), &clock{t: time.Unix(1e9, 0)}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := members(store, c, fmt.Sprintf("n%02d", i)).Heartbeat(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ids, err := members(store, c, "x").Alive(ctx)
	if err != nil || len(ids) != 20 {
		t.Fatalf("alive after concurrent heartbeats: %v %v", ids, err)
	}
}

func TestCorruptMembersIsAnError(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	if err := store.Put(ctx, membersKey, []byte("{not json"), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(store, "a", time.Minute).Alive(ctx); err == nil {
		t.Fatal("a corrupt member map must be reported")
	}
}

func TestBeatReportsToOnBeat(t *testing.T) {
	ctx := context.Background()
	store, c := state.NewMemoryStore(), &clock{t: time.Unix(1e9, 0)}
	if err := members(store, c, "b").Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	a := members(store, c, "a")
	var got []string
	var gotErr error
	a.OnBeat = func(alive []string, err error) { got, gotErr = alive, err }
	if err := a.Beat(ctx); err != nil || gotErr != nil || fmt.Sprint(got) != "[a b]" {
		t.Fatalf("Beat: %v; reported %v %v", err, got, gotErr)
	}
	if err := store.Put(ctx, membersKey, []byte("{not json"), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Beat(ctx); err == nil || gotErr == nil {
		t.Fatalf("a failed heartbeat must be returned and reported: %v %v", err, gotErr)
	}
}

// SeenAlive and SeenAlone answer from the last successful heartbeat;
// before the first one every node counts as alive, and no node as alone.
func TestSeenAlive(t *testing.T) {
	st := state.NewMemoryStore()
	a := New(st, "a", time.Minute)
	if !a.SeenAlive("anyone") || a.SeenAlone() {
		t.Fatal("before any beat, a node must count as alive, and a not as alone")
	}
	if err := a.Beat(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !a.SeenAlone() {
		t.Fatal("a, the only member, is not alone")
	}
	b := New(st, "b", time.Minute)
	if err := b.Beat(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Beat(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !a.SeenAlive("b") || !a.SeenAlive("a") || a.SeenAlive("c") || a.SeenAlone() {
		t.Fatal("SeenAlive (or SeenAlone) does not match the members")
	}
	if err := b.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := a.Beat(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a.SeenAlive("b") || !a.SeenAlone() {
		t.Fatal("a node that left still counts as alive")
	}
}
