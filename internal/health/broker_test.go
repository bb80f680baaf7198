package health

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestBrokerCheckFollowsPublishesAndSubscriptions(t *testing.T) {
	s := New()
	s.Set(Recovery, Healthy, "done")
	b := NewBrokerWatch(s)
	if c := s.Report().Checks[Broker]; c.Status != Degraded || !strings.Contains(c.Detail, "no publish") {
		t.Fatalf("before any publish: %+v", c)
	}
	b.Published(nil)
	if c := s.Report().Checks[Broker]; c.Status != Healthy {
		t.Fatalf("after a publish: %+v", c)
	}
	b.Published(errors.New("redis: connection pool timeout"))
	if c := s.Report().Checks[Broker]; c.Status != Degraded || !strings.Contains(c.Detail, "connection pool timeout") {
		t.Fatalf("after a failed publish: %+v", c)
	}
	b.Published(context.Canceled) // says nothing about the broker
	if c := s.Report().Checks[Broker]; c.Status != Degraded {
		t.Fatalf("a cancelled publish cleared the failure: %+v", c)
	}
	b.Published(nil)
	b.Subscribed("orders", errors.New("connection refused"))
	b.Subscribed("billing", errors.New("connection refused"))
	if c := s.Report().Checks[Broker]; c.Status != Degraded || !strings.Contains(c.Detail, `2 topic(s), first "billing"`) {
		t.Fatalf("failing subscriptions: %+v", c)
	}
	b.Subscribed("orders", nil)
	b.Subscribed("billing", context.Canceled) // topic given up: no longer failing
	if c := s.Report().Checks[Broker]; c.Status != Healthy {
		t.Fatalf("after the subscriptions recovered: %+v", c)
	}
}

func TestBrokerFailureFailsReadinessAfterGrace(t *testing.T) {
	s := New()
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	s.Set(Recovery, Healthy, "done")
	s.GateReadiness(Broker, 10*time.Second)
	b := NewBrokerWatch(s)
	b.Published(nil)
	h := s.Handler()
	b.Published(errors.New("connection refused"))
	now = now.Add(9 * time.Second)
	if code, _ := get(t, h, "/readyz"); code != 200 {
		t.Fatal("within the grace the node stays ready")
	}
	now = now.Add(2 * time.Second)
	b.Published(errors.New("connection refused")) // still failing: the grace counts from the first failure
	code, body := get(t, h, "/readyz")
	if code != 503 || !strings.Contains(body, "broker") || !strings.Contains(body, "connection refused") {
		t.Fatalf("after the grace: %d %q", code, body)
	}
	b.Published(nil)
	if code, _ := get(t, h, "/readyz"); code != 200 {
		t.Fatal("readiness must come back with the broker")
	}
}

func TestProbeReportsEachOutcome(t *testing.T) {
	s := New()
	b := NewBrokerWatch(s)
	var calls atomic.Int32
	fail := atomic.Bool{}
	fail.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		b.Probe(ctx, time.Millisecond, 100*time.Millisecond, func(pctx context.Context) error {
			calls.Add(1)
			if fail.Load() {
				<-pctx.Done() // a broker that never answers
				return pctx.Err()
			}
			return nil
		})
		close(done)
	}()
	waitFor(t, func() bool {
		return strings.Contains(s.Report().Checks[Broker].Detail, "no answer within") || calls.Load() > 0 && s.Report().Checks[Broker].Status == Degraded && strings.Contains(s.Report().Checks[Broker].Detail, "publish failing")
	})
	fail.Store(false)
	waitFor(t, func() bool { return s.Report().Checks[Broker].Status == Healthy })
	cancel()
	<-done
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
