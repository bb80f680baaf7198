package grouplock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// waitRecord waits (real time) until the group's record satisfies cond.
func (w *world) waitRecord(group string, cond func(record) bool, what string) {
	w.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond(w.record(group)) {
		if time.Now().After(deadline) {
			w.t.Fatalf("timed out waiting for %s (record %+v)", what, w.record(group))
		}
		time.Sleep(time.Millisecond)
	}
}

// Issue 30, item 7: a holder whose call runs longer than MaxAge keeps its
// lock while it renews the lease (without writing anything under it): a
// peer finds it fresh and does not take it, and the holder's Check passes.
// Without renewal the unwritten lock is taken after MaxAge.
func TestKeptAliveLeaseOutlivesMaxAge(t *testing.T) {
	w := newWorld(t)
	const maxAge = 30 * time.Second
	a := w.node(nil, func(c *Config) { c.MaxAge, c.Node, c.RenewEvery = maxAge, "a", 2*time.Millisecond })
	b := w.node(nil, func(c *Config) { c.MaxAge, c.Node, c.MaxRetries = maxAge, "b", -1 })
	ctx := context.Background()
	ls := mustAcquire(t, a, "g", "a/w")
	ls.KeepAlive(ctx)
	for range 6 { // 3 × MaxAge in all
		w.clk.Advance(maxAge / 2)
		now := w.clk.Now().UnixMilli()
		w.waitRecord("g", func(r record) bool { return r.AcquiredMs == now }, "a renewal")
		if _, err := b.Acquire(ctx, "g", "b/w"); !errors.Is(err, ErrContended) {
			t.Fatalf("peer acquire of a renewed lock: %v, want ErrContended", err)
		}
	}
	if r := w.record("g"); r.Token != 1 || r.Holder != "a/w" || !r.Held || r.Wrote {
		t.Fatalf("record %+v, want token 1 held by a/w", r)
	}
	if err := ls.Check(ctx); err != nil {
		t.Fatalf("Check of the renewed lease: %v", err)
	}
	mustRelease(t, ls)
	before := w.record("g")
	time.Sleep(20 * time.Millisecond) // ten renewal periods
	if after := w.record("g"); after != before || after.Held {
		t.Fatalf("record changed after Release: %+v then %+v", before, after)
	}
	if _, err := b.Acquire(ctx, "g", "b/w"); err != nil {
		t.Fatalf("peer acquire after Release: %v", err)
	}
}

// A lease that is not kept alive (a paused holder: nothing renews it) is
// still taken after MaxAge.
func TestLeaseNotRenewedIsTakenAfterMaxAge(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node = "a" })
	b := w.node(nil, func(c *Config) { c.Node, c.MaxRetries = "b", -1 })
	ctx := context.Background()
	ls := mustAcquire(t, a, "g", "a/w")
	w.clk.Advance(a.cfg.MaxAge)
	if _, err := b.Acquire(ctx, "g", "b/w"); err != nil {
		t.Fatalf("peer acquire past MaxAge: %v", err)
	}
	if err := ls.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("Check of the taken lease: %v, want ErrStale", err)
	}
	if err := ls.Renew(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("Renew of the taken lease: %v, want ErrStale", err)
	}
}

// A renewal that finds the lock taken makes the lease stale: Check fails
// from then on, even for a written lease whose Check would otherwise trust
// it without reading the store. The renewals stop; the new holder's record
// is left alone.
func TestRenewalFindingLockTakenFailsCheck(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, func(c *Config) { c.Node, c.RenewEvery = "a", 2*time.Millisecond })
	ctx := context.Background()
	ls := mustAcquire(t, a, "g", "a/w")
	if err := ls.Check(ctx); err != nil { // written: later Checks trust the lease
		t.Fatal(err)
	}
	ls.KeepAlive(ctx)
	taken := record{Token: 7, Holder: "b/w", Held: true, AcquiredMs: w.clk.Now().UnixMilli(), Node: "b"}
	w.putRecord("g", taken)
	deadline := time.Now().Add(5 * time.Second)
	for {
		ls.h.mu.Lock()
		stale := ls.h.stale
		ls.h.mu.Unlock()
		if stale {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no renewal found the lock taken")
		}
		time.Sleep(time.Millisecond)
	}
	gets, _ := st.trips()
	if err := ls.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("Check after the renewal found the lock taken: %v, want ErrStale", err)
	}
	if g, _ := st.trips(); g != gets {
		t.Fatalf("Check read the store (%d gets): the renewal's finding should suffice", g-gets)
	}
	time.Sleep(20 * time.Millisecond)
	if g, _ := st.trips(); g != gets {
		t.Fatalf("renewals went on after the lease went stale (%d gets)", g-gets)
	}
	mustRelease(t, ls)
	if r := w.record("g"); r != taken {
		t.Fatalf("record %+v, want the new holder's %+v", r, taken)
	}
}

// A renewal that fails on a store error changes nothing and is tried
// again; once the store answers, the lease is renewed.
func TestRenewalRetriesAfterStoreError(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, func(c *Config) { c.Node, c.RenewEvery = "a", 2*time.Millisecond })
	ctx := context.Background()
	ls := mustAcquire(t, a, "g", "a/w")
	outage := errors.New("store down")
	st.set(outage, outage)
	if err := ls.Renew(ctx); !errors.Is(err, outage) || errors.Is(err, ErrStale) {
		t.Fatalf("Renew during an outage: %v", err)
	}
	ls.KeepAlive(ctx)
	time.Sleep(10 * time.Millisecond)
	w.clk.Advance(time.Second)
	st.set(nil, nil)
	now := w.clk.Now().UnixMilli()
	w.waitRecord("g", func(r record) bool { return r.AcquiredMs == now }, "a renewal after the outage")
	if err := ls.Check(ctx); err != nil {
		t.Fatalf("Check after the outage: %v", err)
	}
	mustRelease(t, ls)
}

func TestRenewDefaults(t *testing.T) {
	if c := New(state.NewMemoryStore(), Config{}).cfg; c.MaxAge != DefaultMaxAge || c.RenewEvery != DefaultMaxAge/3 {
		t.Fatalf("MaxAge %v RenewEvery %v", c.MaxAge, c.RenewEvery)
	}
	if c := New(state.NewMemoryStore(), Config{MaxAge: time.Second, RenewEvery: time.Hour}).cfg; c.RenewEvery != time.Second/2 {
		t.Fatalf("RenewEvery %v above MaxAge/2", c.RenewEvery)
	}
}
