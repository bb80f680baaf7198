// Package logbudget owns the rate limit on what worker code may log: a
// slog.Handler that passes at most a budget of records per second (with a
// burst of one second's worth) and drops the rest, counting them; the
// first record let through after drops is preceded by one that says how
// many were dropped and which setting bounds them, and when none comes
// within a second (a worker that flooded, then went quiet) that notice is
// written on its own.
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

// flushAfter is how long drops wait for a record to be let through before
// their notice is written on its own.
var flushAfter = time.Second

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

// Handler wraps h under b. With noticeAttrs the drop notices are written
// to h with those attributes, whatever attributes the loggers made from the
// returned handler add (an engine's own worker_id), so that a notice names
// the worker once; without, to the handler that let the record through or
// dropped it.
func (b *Budget) Handler(h slog.Handler, noticeAttrs ...slog.Attr) slog.Handler {
	hh := &handler{inner: h, b: b}
	if len(noticeAttrs) > 0 {
		hh.notices = h.WithAttrs(noticeAttrs)
	}
	return hh
}

type handler struct {
	inner   slog.Handler
	notices slog.Handler // nil: inner
	b       *Budget
}

// noticeTo is the handler drop notices go to.
func (h *handler) noticeTo() slog.Handler {
	if h.notices != nil {
		return h.notices
	}
	return h.inner
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.inner.Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	b := h.b
	if b.limit == nil {
		return h.inner.Handle(ctx, r)
	}
	if !b.limit.AllowN(b.now(), 1) {
		b.dropped.Add(1)
		if b.pending.Add(1) == 1 {
			// The first drop since the last notice: if no record is let
			// through within flushAfter, say so anyway.
			inner := h.noticeTo()
			time.AfterFunc(flushAfter, func() { _ = b.notice(context.Background(), inner, 0) })
		}
		return nil
	}
	if err := b.notice(ctx, h.noticeTo(), r.PC); err != nil {
		return err
	}
	return h.inner.Handle(ctx, r)
}

// notice writes to inner how many records were dropped since the last
// notice, if any were: once, whichever of the next record and the timer
// comes first.
func (b *Budget) notice(ctx context.Context, inner slog.Handler, pc uintptr) error {
	n := b.pending.Swap(0)
	if n == 0 {
		return nil
	}
	notice := slog.NewRecord(b.now(), slog.LevelWarn, "worker log lines dropped: over the budget", pc)
	notice.AddAttrs(slog.Int64("dropped", n), slog.Int("budget_per_second", b.perSec), slog.String("setting", Setting))
	return inner.Handle(ctx, notice)
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{inner: h.inner.WithAttrs(as), notices: h.notices, b: h.b}
}

func (h *handler) WithGroup(name string) slog.Handler {
	return &handler{inner: h.inner.WithGroup(name), notices: h.notices, b: h.b}
}
