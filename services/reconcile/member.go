package reconcile

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/node"
)

// Membership is the name of the health check of this node's cluster
// membership (MemberGate).
const Membership = "membership"

// Members is what MemberGate needs of cluster.Members.
type Members interface {
	// Member reports whether peers still count this node as alive, with a
	// margin (cluster.Members.Member).
	Member(margin time.Duration) bool
	// Lapses counts the times it stopped being a member and became one
	// again, raised before it counts as one again (cluster.Members.Lapses).
	Lapses() uint64
}

// MemberGate keeps a node that is not a cluster member from serving (issue
// 33 item 5). A lifecycle change waits only for the nodes that are members
// (the worker workflow's ListNodes): once peers may count this node as gone
// (its heartbeat older than the TTL less margin: paused by SIGSTOP, stuck,
// or the state store unreachable), "stopped" or "code_updated" may be
// announced without it. So while it is not a member the hot path serves no
// message (Serving: given back, RETRY, nothing lost), and the node fences
// itself (node.FenceBy, FenceMembership) once Run sees it; when it becomes
// a member again after such a lapse it fences (if Run did not see the
// lapse: a paused process), unfences and reconciles against the catalog
// before it serves again, as LeaseLoop does after a Temporal outage.
type MemberGate struct {
	members Members
	margin  time.Duration
	node    *node.Node
	log     *slog.Logger
	health  *health.State
	// handled is the count of lapses the node reconciled after.
	handled atomic.Uint64
	// joined tells that Run saw the node a member once: before its first
	// heartbeat it served nothing that could be stale.
	joined bool
}

// NewMemberGate returns the gate of node n, a member as long as
// members.Member(margin).
func NewMemberGate(log *slog.Logger, members Members, margin time.Duration, n *node.Node, h *health.State) *MemberGate {
	g := &MemberGate{members: members, margin: margin, node: n, log: log, health: h}
	g.handled.Store(members.Lapses())
	return g
}

// Serving reports whether the node may serve messages: it is a member and
// has reconciled after its last lapse (dispatch.Config.Serving). Lapses is
// raised before a member again counts as one, and read after Member here,
// so a node that became a member again is never seen serving before it
// reconciled.
func (g *MemberGate) Serving() bool {
	return g.members.Member(g.margin) && g.members.Lapses() == g.handled.Load()
}

// Run watches the membership every interval until ctx ends (see
// MemberGate).
func (g *MemberGate) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		g.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check does one step of Run: fence a node that is no longer a member, and
// reconcile one that became a member again after a lapse.
func (g *MemberGate) Check(ctx context.Context) {
	lapses := g.members.Lapses()
	member := g.members.Member(g.margin)
	switch {
	case ctx.Err() != nil:
	case !member && (g.joined || lapses != g.handled.Load()):
		if !g.node.FencedBy(node.FenceMembership) {
			g.log.Error("this node is no longer a cluster member (heartbeats lapsed): fencing it (serving no worker) until it is one again and reconciled",
				"margin", g.margin)
			g.node.FenceBy(ctx, node.FenceMembership)
		}
		g.health.Set(Membership, health.Unhealthy, "not a cluster member (heartbeats lapsed): serving no worker")
	case member && lapses != g.handled.Load():
		// A member again after a lapse that Run may not have seen (the
		// process was paused): whatever it attached may be stale.
		g.node.FenceBy(ctx, node.FenceMembership)
		g.node.UnfenceBy(node.FenceMembership)
		res, err := g.node.Reconcile(ctx)
		if err != nil {
			// Still not serving: tried again at the next check.
			g.log.Warn("a member again after a lapse, but the reconcile failed; serving nothing until it succeeds", "err", err)
			g.health.Set(Membership, health.Unhealthy, "a member again, not reconciled yet: "+err.Error())
			return
		}
		g.handled.Store(lapses)
		g.joined = true
		g.log.Info("a cluster member again after a lapse: node fenced, unfenced and reconciled; serving again", "running", res.Running, "stopped", res.Stopped, "failed", res.Failed)
		g.health.Set(Membership, health.Healthy, fmt.Sprintf("a member again after %d lapse(s); reconciled", lapses))
	case member:
		if !g.joined {
			g.health.Set(Membership, health.Healthy, "a cluster member")
		}
		g.joined = true
	}
}
