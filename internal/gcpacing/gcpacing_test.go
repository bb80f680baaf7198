package gcpacing

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live, headroom uint64
		want           int
	}{
		{8 << 20, 64 << 20, 800},  // a small node: grow by the headroom
		{64 << 20, 64 << 20, 100}, // live = headroom: Go's default
		{512 << 20, 64 << 20, 100},
		{1 << 20, 64 << 20, 1000}, // capped
		{0, 64 << 20, 1000},       // no collection yet
	} {
		if got := Percent(c.live, c.headroom); got != c.want {
			t.Errorf("Percent(%d, %d) = %d, want %d", c.live, c.headroom, got, c.want)
		}
	}
}

// The pacer follows the live heap as it grows and gives Go's default back
// when it stops; with GOGC set it does not exist.
func TestPacerFollowsTheLiveHeap(t *testing.T) {
	var live atomic.Uint64
	live.Store(16 << 20)
	var pct atomic.Int64
	p := &Pacer{Headroom: 64 << 20, Log: slog.New(slog.DiscardHandler), live: live.Load, set: func(v int) int { return int(pct.Swap(int64(v))) }}
	if got := p.Pace(); got != 400 || pct.Load() != 400 {
		t.Fatalf("16 MiB live: %d (set %d), want 400", got, pct.Load())
	}
	live.Store(256 << 20)
	if got := p.Pace(); got != 100 {
		t.Fatalf("256 MiB live: %d, want 100", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	live.Store(32 << 20)
	go func() { p.Run(ctx); close(done) }()
	for deadline := time.Now().Add(5 * time.Second); pct.Load() != 200; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Run set %d, want 200 at once", pct.Load())
		}
	}
	cancel()
	<-done
	if pct.Load() != 100 {
		t.Fatalf("after Run: %d, want Go's default 100", pct.Load())
	}
	t.Setenv("GOGC", "50")
	if New(DefaultHeadroom, slog.New(slog.DiscardHandler)) != nil {
		t.Fatal("a pacer despite GOGC set")
	}
}
