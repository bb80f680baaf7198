// Package cluster owns node membership: which WorkManager nodes are alive,
// so that a lifecycle change can be applied on every node at once instead of
// waiting for each node's periodic reconcile. Membership is one ETag-guarded
// key in the state store, a map from node id to the time of its last
// heartbeat; a node that missed its heartbeats for TTL counts as gone.
package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// membersKey holds the member map.
const membersKey = state.KeyPrefix + "nodes"

// MembersKey is the state key of the membership (every read of Alive, and
// a placement's read-ahead, placement.Placer.AliveKeys).
const MembersKey = membersKey

// Members is this node's view of, and entry in, the membership.
type Members struct {
	// OnBeat, when set before Run, is told the outcome of each heartbeat
	// of Beat and, after a successful one, the live nodes (for /health).
	OnBeat func(alive []string, err error)

	// LapseMargin, when set before Run, is the margin of the lapses that
	// Lapses counts (see Member).
	LapseMargin time.Duration

	store state.Store
	self  string
	ttl   time.Duration
	now   func() time.Time
	seen  atomic.Pointer[map[string]bool] // live nodes at the last successful beat
	// beat is the time written by this node's last successful heartbeat
	// (UnixNano; 0: none, or left since).
	beat atomic.Int64
	// lapses counts the successful heartbeats that found this node's
	// previous one lapsed.
	lapses atomic.Uint64
	// lapseEnd is the time written by the heartbeat that ended the last
	// lapse (UnixNano; 0: none).
	lapseEnd atomic.Int64
}

// New returns the membership as seen by node self; entries older than ttl
// count as gone.
func New(store state.Store, self string, ttl time.Duration) *Members {
	return &Members{store: store, self: self, ttl: ttl, now: time.Now}
}

// Self is this node's id.
func (m *Members) Self() string { return m.self }

// Heartbeat records this node as alive now and drops the entries of nodes
// gone for longer than the TTL.
func (m *Members) Heartbeat(ctx context.Context) error {
	at := m.now().UTC()
	err := m.update(ctx, func(ms map[string]time.Time) {
		ms[m.self] = at
	})
	if err == nil {
		// Counted before the new beat makes this node a member again, so
		// that whoever checks Member and Lapses together never sees a
		// member whose lapse is not counted yet.
		if b := m.beat.Load(); b != 0 && !m.Member(m.LapseMargin) {
			m.lapseEnd.Store(at.UnixNano())
			m.lapses.Add(1)
		}
		m.beat.Store(at.UnixNano())
	}
	return err
}

// Lapses counts the times this node was a member, stopped being one
// (Member(LapseMargin) false: heartbeats failing, the process paused, the
// store unreachable) and became one again with a later heartbeat. Peers may
// have counted it as gone meanwhile, and lifecycle changes may have been
// announced without it (the worker workflow waits only for live members):
// a node must reconcile after each lapse before it serves again
// (services/reconcile.MemberGate). The count is raised before the heartbeat
// that ends the lapse is recorded.
func (m *Members) Lapses() uint64 { return m.lapses.Load() }

// Member reports whether the other nodes still count this node as alive,
// with a margin: its last heartbeat is younger than the TTL less one
// heartbeat interval (margin). Once it is not, peers may take the group
// locks its workers hold (grouplock.Config.HolderAlive), so a holder must
// look at the store again before it acts under one
// (grouplock.Config.SelfAlive). False before the first heartbeat and after
// Leave.
func (m *Members) Member(margin time.Duration) bool {
	b := m.beat.Load()
	return b != 0 && m.now().Before(time.Unix(0, b).Add(m.ttl-margin))
}

// Settled reports whether the other nodes surely count this node as alive:
// it is a member (Member(margin)) and its last lapse, if any, ended at
// least settle ago. A peer counts a node gone from its own last view of the
// membership (SeenAlive), refreshed only at its own heartbeats, so for up
// to one heartbeat interval (more while its heartbeats fail) after this
// node's lapse ended a peer may still count it gone and take its group
// locks: until then a holder must look at the store before it acts under
// one (grouplock.Config.SelfAlive; cmd/worker passes two intervals).
func (m *Members) Settled(margin, settle time.Duration) bool {
	if !m.Member(margin) {
		return false
	}
	e := m.lapseEnd.Load()
	return e == 0 || !m.now().Before(time.Unix(0, e).Add(settle))
}

// MemberSince reports whether the other nodes have counted this node as
// alive without a break since t: it is a member now (Member(margin)) and
// no lapse ended after t. A store answer to a request sent at t is then
// still this node's to act on (grouplock.Config.AliveSince): a process
// paused with the answer unread past its membership is either not a
// member yet when it wakes (its last beat is old) or, once its heartbeat
// came back, has a lapse that ended after t.
func (m *Members) MemberSince(margin time.Duration, t time.Time) bool {
	if !m.Member(margin) {
		return false
	}
	e := m.lapseEnd.Load()
	return e == 0 || e < t.UnixNano()
}

// AliveNow reads the membership and reports whether node sent a heartbeat
// within the TTL: unlike SeenAlive (this node's view at its last
// heartbeat), it sees a node whose heartbeats came back since
// (grouplock.Config.ConfirmGone).
func (m *Members) AliveNow(ctx context.Context, node string) (bool, error) {
	ms, err := m.read(ctx)
	if err != nil {
		return false, err
	}
	seen, ok := ms[node]
	return ok && seen.After(m.now().Add(-m.ttl)), nil
}

// Beat sends a heartbeat and reports it to OnBeat.
func (m *Members) Beat(ctx context.Context) error {
	err := m.Heartbeat(ctx)
	var alive []string
	if err == nil {
		alive, err = m.Alive(ctx)
	}
	if err == nil {
		set := make(map[string]bool, len(alive))
		for _, id := range alive {
			set[id] = true
		}
		m.seen.Store(&set)
	}
	if m.OnBeat != nil && ctx.Err() == nil {
		m.OnBeat(alive, err)
	}
	return err
}

// SeenAlive reports whether node was alive at this node's last successful
// heartbeat; before the first one every node counts as alive (unknown is
// not gone).
func (m *Members) SeenAlive(node string) bool {
	set := m.seen.Load()
	return set == nil || (*set)[node]
}

// Leave removes this node (on a clean shutdown), so that nobody waits for it.
func (m *Members) Leave(ctx context.Context) error {
	m.beat.Store(0) // counted as gone from now on, whether the write lands or not
	return m.update(ctx, func(ms map[string]time.Time) { delete(ms, m.self) })
}

// Alive returns the ids of the nodes that sent a heartbeat within the TTL,
// sorted.
func (m *Members) Alive(ctx context.Context) ([]string, error) {
	ms, err := m.read(ctx)
	if err != nil {
		return nil, err
	}
	cut := m.now().Add(-m.ttl)
	var ids []string
	for id, seen := range ms {
		if seen.After(cut) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// Run sends a heartbeat (Beat) every interval until ctx ends, then leaves.
// The first heartbeat is the caller's, so that start-up can report it.
// Leaving lets peers take this node's group locks at once: end ctx only
// once the node released them (after draining its messages), not when the
// shutdown signal arrives.
//
// A failed heartbeat is tried again after a fifth of the interval (until
// one succeeds), not after a whole one: a node is a member for the TTL
// less one interval after its last heartbeat (three intervals less one),
// so one failure followed by a full interval was a lapse — the node fenced
// itself and ran its calls in flight again because daprd restarted for a
// second (CI-like run 24).
func (m *Members) Run(ctx context.Context, log *slog.Logger, interval time.Duration) {
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := m.Leave(lctx); err != nil {
				log.Warn("leave the cluster", "node_id", m.self, "err", err)
			}
			return
		case <-t.C:
			next := interval
			if err := m.Beat(ctx); err != nil && ctx.Err() == nil {
				next = max(interval/5, 50*time.Millisecond)
				log.Warn("cluster heartbeat", "node_id", m.self, "err", err, "retry_in", next)
			}
			t.Reset(next)
		}
	}
}

func (m *Members) read(ctx context.Context) (map[string]time.Time, error) {
	ms, _, err := state.GetJSON[map[string]time.Time](ctx, m.store, membersKey)
	if err != nil {
		return nil, fmt.Errorf("read cluster members: %w", err)
	}
	return ms, nil
}

// update applies change and prunes expired entries, with optimistic
// concurrency.
func (m *Members) update(ctx context.Context, change func(map[string]time.Time)) error {
	err := state.UpdateJSON(ctx, m.store, membersKey, func(ms *map[string]time.Time) bool {
		if *ms == nil {
			*ms = map[string]time.Time{}
		}
		change(*ms)
		cut := m.now().Add(-m.ttl)
		for id, seen := range *ms {
			if !seen.After(cut) {
				delete(*ms, id)
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("update cluster members: %w", err)
	}
	return nil
}
