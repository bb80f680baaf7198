// Package gcpacing owns the node's garbage-collector pacing: with GOGC
// unset, it lets the heap grow by at least Headroom between collections
// (Go's default lets it grow by its live size: a node's live heap is a few
// MiB, so it collected every few MiB of the hot path's allocations, about
// a tenth of its CPU under load), going back to Go's default as the live
// heap grows past Headroom. A GOGC the operator set is left alone.
package gcpacing

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// DefaultHeadroom is how far the heap may grow between collections at
// least (NODE_GC_HEADROOM_BYTES).
const DefaultHeadroom = 64 << 20

// Interval is how often the live heap is read and the pacing set.
const Interval = 5 * time.Second

// Percent is the GOGC value that lets a heap of live bytes grow by
// headroom before the next collection, and never less than Go's default
// (100: growth by the live heap itself), nor more than 1,000.
func Percent(live, headroom uint64) int {
	if live == 0 {
		live = 1
	}
	p := headroom * 100 / live
	return int(min(max(p, 100), 1000))
}

// Pacer sets the GC percent from the live heap, every Interval.
type Pacer struct {
	Headroom uint64
	Log      *slog.Logger
	// live reads the live heap (bytes marked by the last collection);
	// set, a fake's.
	live func() uint64
	// set sets the GC percent and returns the previous one.
	set func(int) int
}

// New returns a pacer with headroom, or nil when headroom is 0 (pacing
// off) or GOGC is set in the environment (the operator's choice stands).
func New(headroom uint64, log *slog.Logger) *Pacer {
	if _, set := os.LookupEnv("GOGC"); set || headroom == 0 {
		return nil
	}
	return &Pacer{Headroom: headroom, Log: log, live: liveHeap, set: debug.SetGCPercent}
}

// Pace sets the percent once from the live heap and returns it.
func (p *Pacer) Pace() int {
	pct := Percent(p.live(), p.Headroom)
	p.set(pct)
	return pct
}

// Run paces until ctx ends, then restores Go's default.
func (p *Pacer) Run(ctx context.Context) {
	t := time.NewTicker(Interval)
	defer t.Stop()
	last := p.Pace()
	p.Log.Info("gc pacing on", "percent", last, "headroom_bytes", p.Headroom)
	for {
		select {
		case <-ctx.Done():
			p.set(100)
			return
		case <-t.C:
			if pct := p.Pace(); pct != last {
				p.Log.Debug("gc pacing", "percent", pct)
				last = pct
			}
		}
	}
}

// liveHeap is the heap the last collection marked live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
