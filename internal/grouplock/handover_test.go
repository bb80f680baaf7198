package grouplock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// handing builds nodes that ask each other for a group (Config.Notify,
// straight to the other's YieldIdle) and hand lingering holds over
// (Config.HandTo: a holder "<node>/..." of a known node).
type handing struct {
	w     *world
	mu    sync.Mutex
	nodes map[string]*node
	asked []string
}

func newHanding(t *testing.T) *handing {
	return &handing{w: newWorld(t), nodes: map[string]*node{}}
}

func (hd *handing) node(name string, cs *countStore, mod func(*Config)) *node {
	var st state.Store // nil: the world's store (a nil *countStore is not nil here)
	if cs != nil {
		st = cs
	}
	n := hd.w.node(st, func(c *Config) { hd.config(name, c, mod) })
	hd.mu.Lock()
	hd.nodes[name] = n
	hd.mu.Unlock()
	return n
}

func (hd *handing) config(name string, c *Config, mod func(*Config)) {
	c.Node, c.KeepFor, c.TokenBlock, c.Linger = name, 100, 100, time.Second
	c.HandTo = func(node, holder string) bool {
		hd.mu.Lock()
		defer hd.mu.Unlock()
		return hd.nodes[node] != nil && strings.HasPrefix(holder, node+"/")
	}
	c.Notify = func(ctx context.Context, node, group, holder string) Answer {
		hd.mu.Lock()
		hd.asked = append(hd.asked, name+">"+node)
		to := hd.nodes[node]
		hd.mu.Unlock()
		if to == nil {
			return Answer{}
		}
		return to.YieldIdle(ctx, group, Asker{Node: name, Holder: holder})
	}
	if mod != nil {
		mod(c)
	}
}

func (hd *handing) questions() []string {
	hd.mu.Lock()
	defer hd.mu.Unlock()
	q := hd.asked
	hd.asked = nil
	return q
}

// Config.HandTo: a node asked for a hold that only lingers writes the
// asker's holder into the record (the next token block, wrote=true) and
// answers with its tokens: the asker's lease needs no store round trip of
// its own, nor does its first Check. Asked back first (Locks.handedTo),
// the hold comes back the same way: the whole hand-over is one read and
// one write by the node that gives it. Tokens only grow; the hold given
// away is stale on its old node.
func TestLingeringHoldIsHandedToTheAsker(t *testing.T) {
	hd := newHanding(t)
	ast, bst := &countStore{MemoryStore: hd.w.mem}, &countStore{MemoryStore: hd.w.mem}
	a := hd.node("a", ast, nil)
	b := hd.node("b", bst, nil)
	ctx := context.Background()

	first := mustAcquire(t, b, "g", "b/1")
	mustRelease(t, first) // b lingers
	ag0, ap0 := ast.trips()
	bg0, bp0 := bst.trips()
	la := mustAcquire(t, a, "g", "a/1")
	if err := la.Check(ctx); err != nil {
		t.Fatal(err)
	}
	ag, ap := ast.trips()
	bg, bp := bst.trips()
	if q := hd.questions(); len(q) != 1 || q[0] != "a>b" {
		t.Fatalf("questions %v, want a asking b", q)
	}
	// a: the try that found it held (a read; its holder is asked before
	// a waiter marker is written, and hands it over); b: the hand-over.
	if ag-ag0 != 1 || ap-ap0 != 0 || bg-bg0 != 1 || bp-bp0 != 1 {
		t.Fatalf("a's acquisition and Check: a %d gets %d puts, b %d gets %d puts; want a read, and 1+1", ag-ag0, ap-ap0, bg-bg0, bp-bp0)
	}
	r := hd.w.record("g")
	if !r.Held || r.Holder != "a/1" || r.Node != "a" || !r.Wrote || la.Token != 101 || r.Token != 200 || r.Waiter != "" {
		t.Fatalf("lease token %d, record %+v: want 101 of the block up to 200, held by a/1 on a, wrote, no waiter", la.Token, r)
	}
	if e := a.ev.last(); e.Kind != EventAcquired || e.Holder != "a/1" || e.Token != 101 || !e.Handed {
		t.Fatalf("a's last event %+v, want acquired by a/1 with token 101, handed", e)
	}
	if e := b.ev.last(); e.Kind != EventReleased || e.Holder != "b/1" || e.Token != first.Token {
		t.Fatalf("b's last event %+v, want released by b/1 with token %d", e, first.Token)
	}
	if err := first.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("b's ended lease checks %v, want ErrStale", err)
	}
	mustRelease(t, la) // a lingers

	// b asks a first (it handed the group to a within Linger): a hands it
	// back, and b's acquisition and Check cost b nothing.
	ag0, ap0 = ast.trips()
	bg0, bp0 = bst.trips()
	lb := mustAcquire(t, b, "g", "b/2")
	if err := lb.Check(ctx); err != nil {
		t.Fatal(err)
	}
	ag, ap = ast.trips()
	bg, bp = bst.trips()
	if q := hd.questions(); len(q) != 1 || q[0] != "b>a" {
		t.Fatalf("questions %v, want b asking a first", q)
	}
	if bg != bg0 || bp != bp0 || ag-ag0 != 1 || ap-ap0 != 1 || len(b.sl.Slept()) != 0 {
		t.Fatalf("handed back: b %d gets %d puts, a %d gets %d puts, b slept %v; want none, 1+1, no sleep", bg-bg0, bp-bp0, ag-ag0, ap-ap0, b.sl.Slept())
	}
	if lb.Token != 201 {
		t.Fatalf("token %d handed back, want 201", lb.Token)
	}
	if err := la.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("a's ended lease checks %v, want ErrStale", err)
	}
	// b's hold works as any: a second lease of it while the first runs is
	// kept (KeepFor), and the last release gives the lock up.
	mustRelease(t, lb)
	b.ReleaseIdle(ctx)
	if r := hd.w.record("g"); r.Held || r.Token != 300 {
		t.Fatalf("record %+v after b gave up, want free at token 300", r)
	}
}

// A hold is not handed over the head of another node that has been
// waiting (its fresh waiter marker): it is released, and the lock stays
// kept for that waiter, as without hand-over. Neither is it handed when
// HandTo refuses the asker.
func TestHandOverLeavesTheLockToAnEarlierWaiter(t *testing.T) {
	hd := newHanding(t)
	a := hd.node("a", nil, nil)
	hd.node("b", nil, nil)
	ctx := context.Background()
	mustRelease(t, mustAcquire(t, a, "g", "a/1")) // lingers
	r := hd.w.record("g")
	r.Waiter, r.WaiterMs = "c", hd.w.clk.Now().UnixMilli()
	hd.w.putRecord("g", r)
	if ans := a.YieldIdle(ctx, "g", Asker{Node: "b", Holder: "b/1"}); !ans.Released || ans.Handed != nil {
		t.Fatalf("answer %+v, want released, not handed", ans)
	}
	if r := hd.w.record("g"); r.Held || r.Waiter != "c" {
		t.Fatalf("record %+v, want free and kept for c", r)
	}

	hd.w.clk.Advance(a.cfg.WaiterMaxAge) // c's marker ages out
	mustRelease(t, mustAcquire(t, a, "g", "a/2"))
	if ans := a.YieldIdle(ctx, "g", Asker{Node: "x", Holder: "x/1"}); !ans.Released || ans.Handed != nil {
		t.Fatalf("asked by a node HandTo refuses: %+v, want released, not handed", ans)
	}
	if r := hd.w.record("g"); r.Held {
		t.Fatalf("record %+v, want free", r)
	}
}

// A lock handed to a node that never learns of it (the answer lost, or a
// question that was not its node's: anyone can ask) does not block the
// group: the node it names frees it when another node asks (it holds,
// acquires and gives up nothing of the group), and takes it over at its
// own next Acquire. A node that does hold or acquire the group keeps it.
func TestHandedLockNobodyTookIsFreed(t *testing.T) {
	hd := newHanding(t)
	a := hd.node("a", nil, nil)
	b := hd.node("b", nil, nil)
	c := hd.node("c", nil, nil)
	ctx := context.Background()

	mustRelease(t, mustAcquire(t, a, "g", "a/1"))
	ans := a.YieldIdle(ctx, "g", Asker{Node: "b", Holder: "b/1"}) // b did not ask
	if ans.Handed == nil {
		t.Fatalf("answer %+v, want handed", ans)
	}
	lc := mustAcquire(t, c, "g", "c/1")
	if q := hd.questions(); len(q) != 1 || q[0] != "c>b" || len(c.sl.Slept()) != 0 {
		t.Fatalf("questions %v, c slept %v: want c asking b once, no sleep", q, c.sl.Slept())
	}
	if lc.Token <= ans.Handed.Token {
		t.Fatalf("c's token %d, want above the handed block's %d", lc.Token, ans.Handed.Token)
	}
	if e := b.ev.last(); e.Kind != EventReleased || e.Holder != "b/1" {
		t.Fatalf("b's last event %+v, want the orphan released", e)
	}
	mustRelease(t, lc)

	// Handed to b again, unknown to b: b's own next Acquire takes it over.
	ans = c.YieldIdle(ctx, "g", Asker{Node: "b", Holder: "b/1"})
	if ans.Handed == nil {
		t.Fatalf("answer %+v, want handed", ans)
	}
	lb := mustAcquire(t, b, "g", "b/2")
	if lb.Token <= ans.Handed.Token || len(b.sl.Slept()) != 0 {
		t.Fatalf("b's token %d after the handed block's %d, slept %v", lb.Token, ans.Handed.Token, b.sl.Slept())
	}
	// b holds it (a lease in use): asked, it keeps it.
	if ans := b.YieldIdle(ctx, "g", Asker{Node: "c", Holder: "c/2"}); ans.Released {
		t.Fatalf("b gave up a lease in use: %+v", ans)
	}
	if err := lb.Check(ctx); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, lb)
}

// A hand-over whose answer arrives after the asker's membership lapsed
// (a pause: peers may have taken its locks meanwhile) is not used as it
// is: the asker reads the store, finds the record naming it, and takes
// it under a new token block; its lease's first Check writes as after
// any acquisition.
func TestHandedAnswerAfterALapseIsNotUsed(t *testing.T) {
	hd := newHanding(t)
	bst := &countStore{MemoryStore: hd.w.mem}
	a := hd.node("a", nil, nil)
	b := hd.node("b", bst, func(c *Config) { c.AliveSince = func(time.Time) bool { return false } })
	ctx := context.Background()
	mustRelease(t, mustAcquire(t, a, "g", "a/1"))
	lb := mustAcquire(t, b, "g", "b/1")
	r := hd.w.record("g")
	if lb.Token != 201 || r.Token != 300 || r.Holder != "b/1" || r.Wrote {
		t.Fatalf("lease token %d, record %+v: want b's own acquisition above the handed block (201 of 300), not written yet", lb.Token, r)
	}
	if err := lb.Check(ctx); !errors.Is(err, ErrAnswerOutlived) {
		t.Fatalf("Check after the lapse: %v, want ErrAnswerOutlived", err)
	}
	mustRelease(t, lb)
}

// Warm asks, ahead of an Acquire, for a hold this node handed to another
// within Linger: handed back, the hold is parked here, and an Acquire
// that comes meanwhile waits on the local slot and takes it with no store
// round trip or question of its own. Not handed over before, or with
// anything of the group here, Warm does nothing; a hold in use on the
// other node stays there, and the warm-up leaves no slot behind.
func TestWarmAsksForAHandedGroupBeforeAcquire(t *testing.T) {
	hd := newHanding(t)
	ast := &countStore{MemoryStore: hd.w.mem}
	a := hd.node("a", ast, nil)
	b := hd.node("b", nil, nil)
	ctx := context.Background()
	noSlots := func(n *node) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			n.mu.Lock()
			k := len(n.slots)
			n.mu.Unlock()
			if k == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d slots left", k)
			}
		}
	}

	a.Warm(ctx, "g", "a/0") // never handed over: nothing to ask for
	noSlots(a)
	mustRelease(t, mustAcquire(t, a, "g", "a/1")) // a lingers
	mustRelease(t, mustAcquire(t, b, "g", "b/1")) // handed to b, which lingers
	hd.questions()

	g0, p0 := ast.trips()
	a.Warm(ctx, "g", "a/2")
	got := make(chan *Lease, 1)
	go func() { // usually waits on the slot the warm-up holds
		ls, err := a.Acquire(ctx, "g", "a/2")
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	la := <-got
	if err := la.Check(ctx); err != nil {
		t.Fatal(err)
	}
	g, p := ast.trips()
	if q := hd.questions(); len(q) != 1 || q[0] != "a>b" {
		t.Fatalf("questions %v, want a asking b once", q)
	}
	// Handed back with tokens 201..300: the warm-up's lease took 201.
	if la.Token != 202 || g != g0 || p != p0 {
		t.Fatalf("lease token %d, a's store %d gets %d puts: want 202 of the hold handed back, no round trip", la.Token, g-g0, p-p0)
	}
	a.Warm(ctx, "g", "a/3") // held here: nothing
	if q := hd.questions(); len(q) != 0 {
		t.Fatalf("questions %v while a holds the group", q)
	}
	mustRelease(t, la)

	// Handed to b again, and in use there: a's warm-up asks and leaves it.
	lb := mustAcquire(t, b, "g", "b/2")
	hd.questions()
	a.Warm(ctx, "g", "a/4")
	noSlots(a)
	if q := hd.questions(); len(q) != 1 || q[0] != "a>b" {
		t.Fatalf("questions %v, want a asking b once", q)
	}
	if err := lb.Check(ctx); err != nil {
		t.Fatalf("b's lease in use after a's warm-up: %v", err)
	}
	mustRelease(t, lb)
}

// With a store whose ETags are versions (state.redis; state.Versioned),
// a hold knows its record's ETag after its own write, so a hand-over
// writes without reading first, and the answer tells the asker the ETag
// it writes its own hand-over with: taking turns, a hand-over is one
// write. A write by anybody else meanwhile (a waiter marker) makes that
// write conflict: the hold reads and decides as without versions (here:
// released for the node that marked it). A keyed lock's record expires,
// so it always reads first.
func TestHandOverWritesWithoutReadingOnVersionedStores(t *testing.T) {
	hd := newHanding(t)
	hd.w.mem.Versions = true
	ast, bst := &countStore{MemoryStore: hd.w.mem}, &countStore{MemoryStore: hd.w.mem}
	// A key's TTL short enough that half of it is less than WrittenMaxAge.
	ttl := func(c *Config) { c.KeyTTL = 2 * time.Minute }
	a := hd.node("a", ast, ttl)
	b := hd.node("b", bst, ttl)
	ctx := context.Background()
	trips := func(st *countStore, f func()) (int64, int64) {
		g0, p0 := st.trips()
		f()
		g, p := st.trips()
		return g - g0, p - p0
	}

	mustRelease(t, mustAcquire(t, a, "g", "a/1")) // created: ETag 1; a lingers
	var lb *Lease
	if g, p := trips(ast, func() { lb = mustAcquire(t, b, "g", "b/1") }); g != 0 || p != 1 {
		t.Fatalf("a handing the group to b: %d gets %d puts, want one write", g, p)
	}
	if it, _ := hd.w.mem.Get(ctx, Key("g")); it.ETag != "2" || hd.w.record("g").Holder != "b/1" {
		t.Fatalf("record %+v at ETag %s, want b/1's at 2", hd.w.record("g"), it.ETag)
	}
	mustRelease(t, lb)
	var la *Lease
	if g, p := trips(bst, func() { la = mustAcquire(t, a, "g", "a/2") }); g != 0 || p != 1 {
		t.Fatalf("b handing the group back (the ETag from a's answer): %d gets %d puts, want one write", g, p)
	}
	if err := la.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if r := hd.w.record("g"); r.Holder != "a/2" || !r.Held || la.Token != 201 {
		t.Fatalf("record %+v, lease token %d: want a/2's, 201", r, la.Token)
	}
	mustRelease(t, la) // a lingers

	// c marks the record: a's write with the ETag it knows conflicts, a
	// reads, and the lock goes to c, which waited first.
	r := hd.w.record("g")
	r.Waiter, r.WaiterMs = "c", hd.w.clk.Now().UnixMilli()
	hd.w.putRecord("g", r)
	var ans Answer
	if g, p := trips(ast, func() { ans = a.YieldIdle(ctx, "g", Asker{Node: "b", Holder: "b/2"}) }); g != 1 || p != 2 {
		t.Fatalf("hand-over after a marker: %d gets %d puts, want the conflicting write, a read and a write", g, p)
	}
	if !ans.Released || ans.Handed != nil {
		t.Fatalf("answer %+v, want released for c, not handed", ans)
	}
	if r := hd.w.record("g"); r.Held || r.Waiter != "c" {
		t.Fatalf("record %+v, want free and kept for c", r)
	}

	// Any write of a hold leaves the read out: here a fresh acquisition's
	// first Check (wrote=true). A keyed lock's record expires (KeyTTL),
	// so its ETag is trusted within KeyTTL/2 of the hold's write only.
	k := KeyedName("k", "x")
	var lk *Lease
	if g, p := trips(ast, func() { lk = mustAcquire(t, a, k, "a/3") }); g != 1 || p != 1 {
		t.Fatalf("a keyed acquisition: %d gets %d puts, want a read and a write", g, p)
	}
	if g, p := trips(ast, func() {
		if err := lk.Check(ctx); err != nil {
			t.Fatal(err)
		}
	}); g != 0 || p != 1 || !hd.w.record(k).Wrote {
		t.Fatalf("its first Check: %d gets %d puts, record %+v; want one write of wrote=true", g, p, hd.w.record(k))
	}
	mustRelease(t, lk) // a lingers
	if g, p := trips(ast, func() { mustRelease(t, mustAcquire(t, b, k, "b/3")) }); g != 0 || p != 1 {
		t.Fatalf("a handing a keyed lock over: %d gets %d puts, want one write", g, p)
	}
	hd.w.clk.Advance(b.cfg.KeyTTL / 2) // b lingers; its record may be near expiry
	if g, p := trips(bst, func() { mustRelease(t, mustAcquire(t, a, k, "a/4")) }); g != 1 || p != 1 {
		t.Fatalf("b handing a keyed lock over half its TTL after its write: %d gets %d puts, want a read and a write", g, p)
	}
}

// A node that hands holds over asks the holder before it writes its
// waiter marker; when the question does not get it the lock (a lease in
// use there), the marker is written then, and keeps the lock for it as
// before.
func TestWaiterMarksAfterAQuestionThatDidNotGetTheLock(t *testing.T) {
	hd := newHanding(t)
	a := hd.node("a", nil, func(c *Config) { c.MaxRetries = 1 })
	b := hd.node("b", nil, nil)
	ctx := context.Background()
	lb := mustAcquire(t, b, "g", "b/1")
	if _, err := a.Acquire(ctx, "g", "a/1"); !errors.Is(err, ErrContended) {
		t.Fatalf("Acquire while b's lease runs: %v, want ErrContended", err)
	}
	if q := hd.questions(); len(q) == 0 || q[0] != "a>b" {
		t.Fatalf("questions %v, want a asking b", q)
	}
	if r := hd.w.record("g"); r.Waiter != "a" || r.Holder != "b/1" {
		t.Fatalf("record %+v, want b's with a's waiter marker", r)
	}
	mustRelease(t, lb)
	b.ReleaseIdle(ctx)
	if r := hd.w.record("g"); r.Held {
		t.Fatalf("record %+v, want free (kept for a by its marker)", r)
	}
	b.cfg.MaxRetries = 0 // one try, while a's marker is fresh
	if _, err := b.Acquire(ctx, "g", "b/2"); !errors.Is(err, ErrContended) {
		t.Fatalf("b's Acquire of a lock kept for a: %v, want ErrContended", err)
	}
}

// A hold whose record was taken over meanwhile (here: written by another
// holder) finds out on its next write also when it writes without reading
// (state.Versioned): the write conflicts, the read shows the other holder,
// and the lease is stale — nothing more happens under it, and the other
// holder's record stays.
func TestVersionedWriteOfATakenLockIsStale(t *testing.T) {
	w := newWorld(t)
	w.mem.Versions = true
	a := w.node(nil, func(c *Config) { c.Node = "a" })
	ctx := context.Background()
	la := mustAcquire(t, a, "g", "a/1")
	r := w.record("g")
	thief := record{Token: r.Token + 5, Holder: "c/1", Held: true, AcquiredMs: w.clk.Now().UnixMilli(), Node: "c"}
	w.putRecord("g", thief)
	if err := la.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("Check of a taken lock: %v, want ErrStale", err)
	}
	mustRelease(t, la)
	if got := w.record("g"); got != thief {
		t.Fatalf("record %+v after the stale holder's release, want the new holder's %+v", got, thief)
	}
}
