// Package ratelimit owns the control API's per-caller rate limits: each
// caller (tenant, subject and how it authenticated) gets a token bucket per
// Limiter, one for the RPCs that change something and one for those that
// read (cmd/api); a call over the limit is
// RESOURCE_EXHAUSTED with a RetryInfo saying when to try again.
package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Config configures a Limiter.
type Config struct {
	// PerSecond is the sustained rate of limited calls per caller
	// (API_RATE_LIMIT); 0 turns the limit off.
	PerSecond float64
	// Burst is how many limited calls a caller may make at once
	// (API_RATE_BURST); at least 1 when PerSecond is set.
	Burst int
	// Methods are the full method names that are limited.
	Methods map[string]bool
	// Caller names the caller of a call (the key of its bucket).
	Caller func(ctx context.Context) string
	// What names the limited calls and their settings in the refusal;
	// "": "changing calls (API_RATE_LIMIT, API_RATE_BURST)".
	What string
}

// Validate checks the settings.
func (c Config) Validate() error {
	switch {
	case c.PerSecond < 0:
		return fmt.Errorf("API_RATE_LIMIT must not be negative (0: no limit), got %g", c.PerSecond)
	case c.PerSecond > 0 && c.Burst < 1:
		return fmt.Errorf("API_RATE_BURST must be at least 1, got %d", c.Burst)
	}
	return nil
}

// maxIdle is how long a caller's bucket is kept after its last call (a
// full bucket is no different from a new one by then); sweepEvery bounds
// how many callers are kept before idle ones are dropped.
const (
	maxIdle    = 10 * time.Minute
	sweepEvery = 4096
)

// Limiter holds one token bucket per caller.
type Limiter struct {
	cfg Config
	now func() time.Time

	mu      sync.Mutex
	callers map[string]*bucket
	next    int // sweep when len(callers) reaches it
}

type bucket struct {
	lim  *rate.Limiter
	last time.Time
}

// New returns a Limiter.
func New(cfg Config) *Limiter {
	return &Limiter{cfg: cfg, now: time.Now, callers: map[string]*bucket{}, next: sweepEvery}
}

// Allow takes one token of caller's bucket; when there is none it says how
// long until there is.
func (l *Limiter) Allow(caller string) (bool, time.Duration) {
	if l.cfg.PerSecond <= 0 {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.callers[caller]
	if b == nil {
		if len(l.callers) >= l.next {
			l.sweep(now)
		}
		b = &bucket{lim: rate.NewLimiter(rate.Limit(l.cfg.PerSecond), l.cfg.Burst)}
		l.callers[caller] = b
	}
	b.last = now
	r := b.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

func cond(ok bool, a, b string) string {
	if ok {
		return a
	}
	return b
}

// sweep drops the buckets idle for maxIdle; l.mu is held.
func (l *Limiter) sweep(now time.Time) {
	for k, b := range l.callers {
		if now.Sub(b.last) > maxIdle {
			delete(l.callers, k)
		}
	}
	l.next = max(sweepEvery, 2*len(l.callers))
}

// UnaryInterceptor limits the configured methods. It must run after the
// authentication interceptor (Config.Caller reads what that put in ctx).
func (l *Limiter) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if l.cfg.Methods[info.FullMethod] {
			caller := l.cfg.Caller(ctx)
			if ok, wait := l.Allow(caller); !ok {
				what, settings := "changing calls", "API_RATE_LIMIT, API_RATE_BURST"
				if l.cfg.What != "" {
					what, settings = l.cfg.What, ""
				}
				st := status.New(codes.ResourceExhausted, fmt.Sprintf(
					"rate limit: %s may make %g %s per second (burst %d%s); retry in %v",
					caller, l.cfg.PerSecond, what, l.cfg.Burst, cond(settings != "", "; "+settings, ""), wait.Round(time.Millisecond)))
				if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
					st = d
				}
				return nil, st.Err()
			}
		}
		return handler(ctx, req)
	}
}
