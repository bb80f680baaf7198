package cluster

import (
	"context"
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
