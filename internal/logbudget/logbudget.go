// Package logbudget owns the rate limit on what worker code may log: a
// slog.Handler that passes at most a budget of records per second (with a
// burst of one second's worth) and drops the rest, counting them; the
// first record let through after drops is preceded by one that says how
// many were dropped and which setting bounds them.
package logbudget

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Setting names the limit in the drop notice.
const Setting = "WORKER_LOG_LINES_PER_SECOND"

// Budget is shared by the handlers of one worker (WithAttrs/WithGroup keep
// it).
type Budget struct {
	limit   *rate.Limiter
	perSec  int
	pending atomic.Int64 // dropped since the last notice
	dropped atomic.Int64 // dropped in total
	now     func() time.Time
}

// New returns a budget of perSecond records per second (0: unlimited).
func New(perSecond int) *Budget {
	b := &Budget{perSec: perSecond, now: time.Now}
	if perSecond > 0 {
		b.limit = rate.NewLimiter(rate.Limit(perSecond), perSecond)
	}
	return b
}

// Dropped is how many records were dropped so far.
func (b *Budget) Dropped() int64 { return b.dropped.Load() }

// Handler wraps h under b.
func (b *Budget) Handler(h slog.Handler) slog.Handler { return &handler{inner: h, b: b} }

type handler struct {
	inner slog.Handler
	b     *Budget
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	b := h.b
	if b.limit == nil {
		return h.inner.Handle(ctx, r)
	}
	if !b.limit.AllowN(b.now(), 1) {
		b.pending.Add(1)
		b.dropped.Add(1)
		return nil
	}
	if n := b.pending.Swap(0); n > 0 {
		notice := slog.NewRecord(b.now(), slog.LevelWarn, "worker log lines dropped: over the budget", r.PC)
		notice.AddAttrs(slog.Int64("dropped", n), slog.Int("budget_per_second", b.perSec), slog.String("setting", Setting))
		if err := h.inner.Handle(ctx, notice); err != nil {
			return err
		}
	}
	return h.inner.Handle(ctx, r)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{inner: h.inner.WithAttrs(as), b: h.b}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), b: h.b}
}
