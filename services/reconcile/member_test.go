package reconcile_test

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/services/reconcile"
)

// fakeMembers is a membership whose state the test sets.
type fakeMembers struct {
	member atomic.Bool
	lapses atomic.Uint64
}

func (m *fakeMembers) Member(time.Duration) bool { return m.member.Load() }
func (m *fakeMembers) Lapses() uint64            { return m.lapses.Load() }

// rejoin is a heartbeat that ends a lapse: the lapse is counted before the
// node counts as a member again (cluster.Members.Heartbeat).
func (m *fakeMembers) rejoin() { m.lapses.Add(1); m.member.Store(true) }

func servingWorker(t *testing.T) (*nodetest.Fixture, catalog.Worker) {
	f, ctx := nodetest.New(t), context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := nodetest.Worker(catalog.StatusRunning, sha)
	if err := f.Node.Apply(ctx, w, nil); err != nil {
		t.Fatal(err)
	}
	return f, w
}

func newGate(f *nodetest.Fixture, m *fakeMembers) (*reconcile.MemberGate, *health.State) {
	h := health.New()
	return reconcile.NewMemberGate(slog.New(slog.NewTextHandler(io.Discard, nil)), m, time.Second, f.Node, h), h
}

// Issue 33 item 5: a node paused past the membership TTL (SIGSTOP) while
// its worker was stopped without it: once it runs again and its heartbeat
// makes it a member again, it serves nothing until it fenced and
// reconciled; then it does not serve the stopped worker.
func TestNodeBackFromALapseReconcilesBeforeServing(t *testing.T) {
	f, w := servingWorker(t)
	ctx := context.Background()
	m := &fakeMembers{}
	m.member.Store(true)
	g, h := newGate(f, m)
	g.Check(ctx)
	if !g.Serving() {
		t.Fatal("a member that never lapsed does not serve")
	}
	// Paused: the check never ran meanwhile; the worker was stopped (and
	// "stopped" announced) by the other nodes.
	m.member.Store(false)
	if g.Serving() {
		t.Fatal("serving while not a member")
	}
	w.Status = catalog.StatusStopped
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	m.rejoin()
	if g.Serving() {
		t.Fatal("serving after a lapse before reconciling")
	}
	g.Check(ctx)
	if !g.Serving() || f.Dispatcher.Attached(w.ID) || f.Node.FencedBy(node.FenceMembership) {
		t.Fatalf("after the check: serving %v (want true), stopped worker attached %v (want false), fenced %v (want false)",
			g.Serving(), f.Dispatcher.Attached(w.ID), f.Node.FencedBy(node.FenceMembership))
	}
	if st := h.Report().Checks[reconcile.Membership].Status; st != health.Healthy {
		t.Fatalf("membership check %s", st)
	}
}

// Issue 33 item 5: a running node that sees it is no longer a member (its
// heartbeats fail) fences itself at once (its subscriptions close, so its
// messages go to the members), and after the lapse serves the catalog's
// workers again once reconciled.
func TestNodeThatIsNoLongerAMemberFencesItself(t *testing.T) {
	f, w := servingWorker(t)
	ctx := context.Background()
	m := &fakeMembers{}
	m.member.Store(true)
	g, h := newGate(f, m)
	g.Check(ctx)
	m.member.Store(false)
	g.Check(ctx)
	if f.Dispatcher.Attached(w.ID) || !f.Node.FencedBy(node.FenceMembership) || h.Report().Checks[reconcile.Membership].Status != health.Unhealthy {
		t.Fatalf("not a member: attached %v, fenced %v, health %v", f.Dispatcher.Attached(w.ID), f.Node.FencedBy(node.FenceMembership),
			h.Report().Checks[reconcile.Membership])
	}
	if _, err := f.Node.Reconcile(ctx); err != nil || f.Dispatcher.Attached(w.ID) {
		t.Fatalf("reconcile attached the worker on a node that is not a member (%v)", err)
	}
	m.rejoin()
	g.Check(ctx)
	if !g.Serving() || !f.Dispatcher.Attached(w.ID) {
		t.Fatalf("a member again: serving %v, attached %v; want both", g.Serving(), f.Dispatcher.Attached(w.ID))
	}
}

// The membership's fence and the lease's are separate: a node back in the
// membership stays fenced while it is cut off from Temporal.
func TestMembershipDoesNotLiftTheLeaseFence(t *testing.T) {
	f, w := servingWorker(t)
	ctx := context.Background()
	m := &fakeMembers{}
	g, _ := newGate(f, m)
	f.Node.Fence(ctx) // LeaseLoop: no answer from Temporal
	m.rejoin()
	g.Check(ctx)
	if !f.Node.Fenced() || f.Dispatcher.Attached(w.ID) {
		t.Fatalf("lease fence lifted by the membership: fenced %v, attached %v", f.Node.Fenced(), f.Dispatcher.Attached(w.ID))
	}
}
