package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

type callerKey struct{}

func newLimiter(perSecond float64, burst int) (*Limiter, *time.Time) {
	now := time.Unix(1_700_000_000, 0)
	l := New(Config{PerSecond: perSecond, Burst: burst, Methods: map[string]bool{"/svc/Change": true},
		Caller: func(ctx context.Context) string { s, _ := ctx.Value(callerKey{}).(string); return s }})
	l.now = func() time.Time { return now }
	return l, &now
}

// Each caller has its own bucket: a burst, then the sustained rate; other
// callers and unlimited methods are unaffected; the refusal says when to
// retry, also as RetryInfo.
func TestLimitsPerCaller(t *testing.T) {
	l, now := newLimiter(2, 3)
	call := l.UnaryInterceptor()
	run := func(caller, method string) error {
		ctx := context.WithValue(context.Background(), callerKey{}, caller)
		_, err := call(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, func(context.Context, any) (any, error) { return "ok", nil })
		return err
	}
	for i := range 3 {
		if err := run("acme/alice", "/svc/Change"); err != nil {
			t.Fatalf("call %d of the burst: %v", i, err)
		}
	}
	err := run("acme/alice", "/svc/Change")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry in 500ms") || !strings.Contains(err.Error(), "acme/alice") {
		t.Fatalf("over the burst: %v", err)
	}
	var ri *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			ri = r
		}
	}
	if ri == nil || ri.GetRetryDelay().AsDuration() != 500*time.Millisecond {
		t.Fatalf("RetryInfo %v", ri)
	}
	if err := run("globex/bob", "/svc/Change"); err != nil {
		t.Fatalf("another caller: %v", err)
	}
	if err := run("acme/alice", "/svc/Get"); err != nil {
		t.Fatalf("an unlimited method: %v", err)
	}
	*now = now.Add(500 * time.Millisecond)
	if err := run("acme/alice", "/svc/Change"); err != nil {
		t.Fatalf("after the wait: %v", err)
	}
	if err := run("acme/alice", "/svc/Change"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the refused call must not have taken a token, the next one must: %v", err)
	}
}

func TestOffAndValidate(t *testing.T) {
	l, _ := newLimiter(0, 0)
	for range 100 {
		if ok, _ := l.Allow("x"); !ok {
			t.Fatal("limit 0 must let everything through")
		}
	}
	for _, c := range []Config{{PerSecond: -1}, {PerSecond: 1, Burst: 0}} {
		if c.Validate() == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// Idle callers are forgotten, so that many callers cannot grow the map
// without bound.
func TestIdleCallersAreSwept(t *testing.T) {
	l, now := newLimiter(1, 1)
	for i := range sweepEvery {
		l.Allow(fmt.Sprint("c", i))
	}
	*now = now.Add(maxIdle + time.Second)
	l.Allow("late")
	if n := len(l.callers); n != 1 {
		t.Fatalf("%d callers kept", n)
	}
}
