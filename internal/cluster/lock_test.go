package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/state"
)

// Issue 43, item 8: the group locks of two nodes, wired to their
// memberships as cmd/worker wires them (lockConfig), around a lapse of
// node a's heartbeats while it holds a lock.
const lockBeat = 5 * time.Second // NODE_HEARTBEAT; the TTL is three of them

// lockConfig is cmd/worker's wiring of a node's locks to its membership.
func lockConfig(m *Members, c *clock) grouplock.Config {
	return grouplock.Config{RetryBase: lockBeat, MaxRetries: -1, Node: m.Self(), Now: c.now,
		HolderAlive: func(holder string) bool { node, _, _ := strings.Cut(holder, "/"); return m.SeenAlive(node) },
		ConfirmGone: func(ctx context.Context, holder string) (bool, error) {
			node, _, _ := strings.Cut(holder, "/")
			alive, err := m.AliveNow(ctx, node)
			return !alive, err
		},
		SelfAlive: func() bool { return m.Settled(lockBeat, 2*lockBeat) },
	}
}

// lapsed returns nodes a and b on one store and clock, a holding group g
// (its lease written) through a lapse: b saw it gone at its last
// heartbeat, and a's first heartbeat back has just made it a member again.
func lapsed(t *testing.T, bCfg func(*Members, *clock) grouplock.Config) (a, b *Members, la, lb *grouplock.Locks, lease *grouplock.Lease) {
	t.Helper()
	ctx := context.Background()
	st := state.NewMemoryStore()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a, b = New(st, "a", 3*lockBeat), New(st, "b", 3*lockBeat)
	for _, m := range []*Members{a, b} {
		m.now, m.LapseMargin = c.now, lockBeat
		if err := m.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	la, lb = grouplock.New(st, lockConfig(a, c)), grouplock.New(st, bCfg(b, c))
	lease, err := la.Acquire(ctx, "g", "a/w")
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Check(ctx); err != nil { // written
		t.Fatal(err)
	}
	for range 3 { // a is paused; b beats on and, at the third, sees a gone
		c.add(lockBeat)
		if err := b.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if b.SeenAlive("a") {
		t.Fatal("b still counts a alive")
	}
	c.add(time.Second)
	if err := a.Beat(ctx); err != nil { // the lapse ends; b has not beaten since
		t.Fatal(err)
	}
	if a.Lapses() != 1 || !a.Member(lockBeat) {
		t.Fatalf("a: lapses %d, member %v", a.Lapses(), a.Member(lockBeat))
	}
	return a, b, la, lb, lease
}

// A peer whose last view of the membership says the holder is gone reads
// the membership again before it takes the lock: the holder is back, so
// the lock stays the holder's, and only the holder acts under it.
func TestPeerRereadsMembershipBeforeTakingALock(t *testing.T) {
	ctx := context.Background()
	_, _, _, lb, lease := lapsed(t, lockConfig)
	taken, errB := lb.Acquire(ctx, "g", "b/w")
	errA := lease.Check(ctx)
	if errB == nil && errA == nil {
		t.Fatalf("both nodes act under group g: a's lease token %d passes Check, b took token %d", lease.Token, taken.Token)
	}
	if !errors.Is(errB, grouplock.ErrContended) || errA != nil {
		t.Fatalf("b's Acquire: %v (want contended: a is a member again); a's Check: %v (want nil)", errB, errA)
	}
}

// A peer that took the lock anyway (it read the membership just before the
// holder's heartbeat landed, or it is a node of an older version) is not
// trusted twice: for two heartbeat intervals after its lapse ends the
// holder reads the store before each side effect, for its old lease and
// for a fresh one taken after its reconcile.
func TestHolderReadsTheStoreAfterItsLapseEnds(t *testing.T) {
	ctx := context.Background()
	// b as a node that trusts its last view (no re-read).
	stale := func(m *Members, c *clock) grouplock.Config {
		return grouplock.Config{RetryBase: lockBeat, MaxRetries: -1, Node: m.Self(), Now: c.now,
			HolderAlive: func(holder string) bool { node, _, _ := strings.Cut(holder, "/"); return m.SeenAlive(node) }}
	}
	t.Run("old lease", func(t *testing.T) {
		_, _, _, lb, lease := lapsed(t, stale)
		taken, err := lb.Acquire(ctx, "g", "b/w")
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Check(ctx); !errors.Is(err, grouplock.ErrStale) {
			t.Fatalf("a's old lease (token %d) after b took token %d: Check %v, want ErrStale", lease.Token, taken.Token, err)
		}
	})
	t.Run("fresh lease", func(t *testing.T) {
		_, _, la, lb, lease := lapsed(t, stale)
		if err := lease.Release(ctx); err != nil { // a's reconcile stops and starts its worker
			t.Fatal(err)
		}
		fresh, err := la.Acquire(ctx, "g", "a/w")
		if err != nil {
			t.Fatal(err)
		}
		if err := fresh.Check(ctx); err != nil {
			t.Fatal(err)
		}
		taken, err := lb.Acquire(ctx, "g", "b/w")
		if err != nil {
			t.Fatal(err)
		}
		if err := fresh.Check(ctx); !errors.Is(err, grouplock.ErrStale) {
			t.Fatalf("a's fresh lease (token %d) after b took token %d: Check %v, want ErrStale", fresh.Token, taken.Token, err)
		}
	})
}

// Settled (SelfAlive of the locks) is false from the lapse until settle
// after the heartbeat that ended it, then true again; a node that never
// lapsed is settled from its first heartbeat.
func TestSettledWindowAfterALapse(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := New(state.NewMemoryStore(), "a", 3*lockBeat)
	a.now, a.LapseMargin = c.now, lockBeat
	beat := func() {
		t.Helper()
		if err := a.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	if !a.Settled(lockBeat, 2*lockBeat) {
		t.Fatal("not settled after the first heartbeat")
	}
	c.add(3 * lockBeat) // lapsed
	if a.Settled(lockBeat, 2*lockBeat) {
		t.Fatal("settled while lapsed")
	}
	beat() // the lapse ends
	for _, step := range []time.Duration{lockBeat, lockBeat - time.Millisecond} {
		if a.Settled(lockBeat, 2*lockBeat) {
			t.Fatal("settled within two intervals of the lapse's end")
		}
		c.add(step)
		beat()
	}
	if a.Settled(lockBeat, 2*lockBeat) {
		t.Fatal("settled before two intervals")
	}
	c.add(time.Millisecond)
	if !a.Settled(lockBeat, 2*lockBeat) {
		t.Fatal("not settled two intervals after the lapse's end")
	}
}

// MemberSince (AliveSince of the locks): an answer to a request sent at t
// is trusted while no lapse ended after t: not while the node is lapsed
// (its heartbeat not back yet), not after the heartbeat that ended a
// lapse, and again for requests sent after that heartbeat.
func TestMemberSinceALapse(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := New(state.NewMemoryStore(), "a", 3*lockBeat)
	a.now, a.LapseMargin = c.now, lockBeat
	if a.MemberSince(lockBeat, c.now()) {
		t.Fatal("member since before the first heartbeat")
	}
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	sent := c.now()
	c.add(time.Millisecond)
	if !a.MemberSince(lockBeat, sent) {
		t.Fatal("not member since a request sent while a member")
	}
	c.add(3 * lockBeat) // paused with the answer unread: lapsed
	if a.MemberSince(lockBeat, sent) {
		t.Fatal("member since the request while lapsed")
	}
	if err := a.Heartbeat(ctx); err != nil { // the heartbeat at wake ends the lapse
		t.Fatal(err)
	}
	if a.MemberSince(lockBeat, sent) {
		t.Fatal("member since a request sent before the lapse ended")
	}
	c.add(time.Millisecond)
	if !a.MemberSince(lockBeat, c.now()) {
		t.Fatal("not member since a request sent after the lapse ended")
	}
}
