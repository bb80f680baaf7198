package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Issue 30, item 2: a node knows when its peers may count it as gone (and
// take its group locks): no heartbeat yet, heartbeats missed for the TTL
// less a margin, or left.
func TestMemberUntilHeartbeatsLapseOrLeave(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := members(state.NewMemoryStore(), c, "a") // TTL 30 s
	if a.Member(10 * time.Second) {
		t.Fatal("a member before its first heartbeat")
	}
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	c.add(19 * time.Second)
	if !a.Member(10 * time.Second) {
		t.Fatal("not a member 19 s after a heartbeat (TTL 30 s, margin 10 s)")
	}
	c.add(2 * time.Second)
	if a.Member(10 * time.Second) {
		t.Fatal("still a member 21 s after its last heartbeat (TTL 30 s, margin 10 s)")
	}
	if err := a.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Member(10 * time.Second) {
		t.Fatal("a member after Leave")
	}
}
