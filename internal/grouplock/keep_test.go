package grouplock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Issue 47 item 1: with KeepFor, a Release that finds another caller of
// the process waiting for the group passes the lock on without a store
// round trip; the next lease takes the next token of the hold, its Check
// is free (the hold wrote already), and the last Release gives the lock up
// with the reserved block's top as the record's token, so whoever acquires
// next starts above every token handed out.
func TestKeptHoldServesTheNextCallerWithoutRoundTrips(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock = "a", 100, 100 })
	waiting := make(chan struct{})
	a.localWait = func(string) { close(waiting) }
	ctx := context.Background()
	first := mustAcquire(t, a, "g", "a/1")
	if err := first.Check(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease)
	go func() {
		ls, err := a.Acquire(ctx, "g", "a/2")
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	<-waiting
	g0, p0 := st.trips()
	mustRelease(t, first)
	second := <-got
	if second == nil || second.Token != first.Token+1 || second.Holder != "a/2" {
		t.Fatalf("second lease %+v after token %d", second, first.Token)
	}
	if err := second.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if g, p := st.trips(); g != g0 || p != p0 {
		t.Fatalf("hand-over and Check: %d gets %d puts, want none", g-g0, p-p0)
	}
	if err := first.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("Check of the ended lease: %v, want ErrStale", err)
	}
	if r := w.record("g"); !r.Held || r.Token != 100 || r.Holder != "a/1" {
		t.Fatalf("record while kept: %+v", r)
	}
	mustRelease(t, second) // nobody waits: given up
	if r := w.record("g"); r.Held || r.Token != 100 {
		t.Fatalf("record after the last release: %+v", r)
	}
	b := w.node(nil, func(c *Config) { c.Node = "b" }) // one token per acquisition, as an older node
	if ls := mustAcquire(t, b, "g", "b/1"); ls.Token != 101 {
		t.Fatalf("next acquisition's token %d, want 101 (above the reserved block)", ls.Token)
	}
	if got := a.ev.kinds(); len(got) != 2 || got[0] != EventAcquired || got[1] != EventReleased {
		t.Fatalf("events %v: one acquisition and one release for two leases", got)
	}
}

// A kept hold yields when another node waits for the group: the waiter
// marker, read at most every FairEvery, makes the Release give the lock
// up, and the free lock is kept for that node (this node's own next
// caller does not take it).
func TestKeptHoldYieldsToAWaitingNode(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock, c.MaxRetries = "a", 100, 10, -1 })
	b := w.node(nil, func(c *Config) { c.Node = "b" })
	waiting := make(chan struct{})
	a.localWait = func(string) { close(waiting) }
	ctx := context.Background()
	first := mustAcquire(t, a, "g", "a/1")
	r := w.record("g")
	r.Waiter, r.WaiterMs = "b", w.clk.Now().UnixMilli() // b tried and waits
	w.putRecord("g", r)
	w.clk.Advance(a.cfg.FairEvery)
	errs := make(chan error)
	go func() {
		ls, err := a.Acquire(ctx, "g", "a/2")
		if err == nil {
			ls.Release(ctx)
		}
		errs <- err
	}()
	<-waiting
	mustRelease(t, first)
	if err := <-errs; !errors.Is(err, ErrContended) {
		t.Fatalf("a's next caller: %v, want ErrContended (the lock is b's turn)", err)
	}
	if r := w.record("g"); r.Held || r.Token != 10 {
		t.Fatalf("record after a yielded: %+v", r)
	}
	if ls := mustAcquire(t, b, "g", "b/1"); ls.Token != 11 {
		t.Fatalf("b's token %d, want 11", ls.Token)
	}
}

// Many callers of one node, one group, a hold kept across them with small
// token blocks: no two leases overlap, every token is handed out once and
// in the order the leases ran, and the store sees far fewer writes than
// one acquisition and one release per lease.
func TestKeptHoldTokensAcrossBlocks(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock = "a", 50, 7 })
	const callers, each = 4, 100
	var (
		mu     sync.Mutex
		tokens []int64
		inside atomic.Int64
		wg     sync.WaitGroup
	)
	start := make(chan struct{})
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx := context.Background()
			for range each {
				ls, err := a.Acquire(ctx, "g", "a/"+string(rune('1'+i)))
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					t.Error("two leases at once")
				}
				if err := ls.Check(ctx); err != nil {
					t.Error(err)
				}
				mu.Lock()
				tokens = append(tokens, ls.Token)
				mu.Unlock()
				for range 3 {
					runtime.Gosched() // the others queue for the group meanwhile
				}
				inside.Add(-1)
				if err := ls.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(tokens) != callers*each {
		t.Fatalf("%d leases", len(tokens))
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("token %d after %d (lease %d)", tokens[i], tokens[i-1], i)
		}
	}
	r := w.record("g")
	if r.Held || r.Token < tokens[len(tokens)-1] {
		t.Fatalf("record %+v after last token %d", r, tokens[len(tokens)-1])
	}
	if _, p := st.trips(); p >= 2*callers*each {
		t.Fatalf("%d writes for %d leases: the hold was never kept", p, callers*each)
	}
	t.Logf("%d leases, %d store writes", callers*each, st.puts.Load())
	if len(a.slots) != 0 {
		t.Fatalf("slots left: %v", a.slots)
	}
}

// Yield lets the next caller of the group start its call while the
// yielding lease still publishes: its Check still passes, the next lease's
// Turn waits for it (side effects in token order), and the lock is given
// up in the store only after both are released — a yielded lease's
// outputs never land after the lock is free.
func TestYieldPipelinesSideEffectsInTokenOrder(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock = "a", 100, 100 })
	waiting := make(chan struct{})
	a.localWait = func(string) { close(waiting) }
	ctx := context.Background()
	first := mustAcquire(t, a, "g", "a/1")
	if err := first.Check(ctx); err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease)
	go func() {
		ls, err := a.Acquire(ctx, "g", "a/2")
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	<-waiting
	if !first.Yield(ctx) {
		t.Fatal("Yield with a caller waiting did not yield")
	}
	second := <-got // its call may start now
	if second.Token != first.Token+1 {
		t.Fatalf("tokens %d then %d", first.Token, second.Token)
	}
	if err := first.Check(ctx); err != nil {
		t.Fatalf("the yielded lease's Check: %v", err)
	}
	if err := first.Turn(ctx); err != nil {
		t.Fatal(err)
	}
	turn := make(chan error, 1)
	go func() { turn <- second.Turn(ctx) }()
	select {
	case err := <-turn:
		t.Fatalf("the second lease's Turn returned (%v) before the first lease was released", err)
	case <-time.After(20 * time.Millisecond):
	}
	released := make(chan error, 1)
	go func() { released <- second.Release(ctx) }() // nobody waits: gives the lock up, after the first
	select {
	case err := <-released:
		t.Fatalf("the lock was given up (%v) while a yielded lease was still publishing", err)
	case <-time.After(20 * time.Millisecond):
	}
	if r := w.record("g"); !r.Held {
		t.Fatalf("record %+v: free while the first lease publishes", r)
	}
	mustRelease(t, first)
	if err := <-turn; err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if r := w.record("g"); r.Held || r.Token != 100 {
		t.Fatalf("record after both: %+v", r)
	}
	if first.Yield(ctx) {
		t.Fatal("a released lease yielded")
	}
	if len(a.slots) != 0 {
		t.Fatalf("slots left: %v", a.slots)
	}
}

// Without a caller waiting, Yield does nothing: the lease keeps the slot
// and releases as before.
func TestYieldAloneDoesNothing(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor = "a", 100 })
	ctx := context.Background()
	ls := mustAcquire(t, a, "g", "a/1")
	if ls.Yield(ctx) {
		t.Fatal("yielded with nobody waiting")
	}
	if err := ls.Turn(ctx); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, ls)
	if r := w.record("g"); r.Held {
		t.Fatalf("record %+v", r)
	}
}

// With Linger, the last lease of a run keeps the hold for a while: the
// group's next message within it needs no store round trip, and the lock
// is given up when it passes (or at once by ReleaseIdle, on shutdown).
// Another node's waiter marker ends it at the next release.
func TestLingeringHold(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock, c.Linger = "a", 100, 100, 30*time.Millisecond })
	ctx := context.Background()
	first := mustAcquire(t, a, "g", "a/1")
	mustRelease(t, first)
	if r := w.record("g"); !r.Held {
		t.Fatalf("record %+v: given up without lingering", r)
	}
	g0, p0 := st.trips()
	second := mustAcquire(t, a, "g", "a/2")
	if g, p := st.trips(); g != g0 || p != p0 || second.Token != first.Token+1 {
		t.Fatalf("acquisition within the linger: %d gets %d puts, token %d after %d", g-g0, p-p0, second.Token, first.Token)
	}
	mustRelease(t, second)
	w.waitRecord("g", func(r record) bool { return !r.Held }, "the lingering hold given up")
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		a.mu.Lock()
		n := len(a.slots)
		a.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slots left after the linger", n)
		}
	}

	// On shutdown: at once.
	a.cfg.Linger = time.Hour
	mustRelease(t, mustAcquire(t, a, "h", "a/1"))
	if r := w.record("h"); !r.Held {
		t.Fatal("not lingering")
	}
	a.ReleaseIdle(ctx)
	a.mu.Lock()
	slots := len(a.slots)
	a.mu.Unlock()
	if r := w.record("h"); r.Held || slots != 0 {
		t.Fatalf("after ReleaseIdle: record %+v, %d slots", r, slots)
	}

	// Another node waits: no linger.
	third := mustAcquire(t, a, "h", "a/1")
	r := w.record("h")
	r.Waiter, r.WaiterMs = "b", w.clk.Now().UnixMilli()
	w.putRecord("h", r)
	w.clk.Advance(a.cfg.FairEvery)
	mustRelease(t, third)
	if r := w.record("h"); r.Held {
		t.Fatalf("record %+v: lingered although another node waits", r)
	}
}

// With KeepFor, a node waiting for a group between two tries looks at the
// record every FairEvery and tries at once when the lock is free for it,
// instead of sleeping out its backoff (a hand-over between nodes takes
// about FairEvery): the tries, and their events, are the backoff's.
func TestWaiterTriesAsSoonAsTheLockIsFree(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node = "a" })
	held := mustAcquire(t, a, "g", "a/1")
	b := w.node(nil, func(c *Config) { c.Node, c.KeepFor = "b", 10 })
	b.sl.hook = func(i int) {
		if i == 2 { // 300 ms into the first 500 ms backoff
			if err := held.Release(context.Background()); err != nil {
				t.Error(err)
			}
		}
	}
	ls, err := b.Acquire(context.Background(), "g", "b/1")
	if err != nil {
		t.Fatal(err)
	}
	var slept time.Duration
	for _, d := range b.sl.Slept() {
		slept += d
	}
	if slept > 400*time.Millisecond || ls.Token != 2 {
		t.Fatalf("slept %v (%v) before taking the lock freed after 300 ms; token %d", slept, b.sl.Slept(), ls.Token)
	}
	if got := b.ev.kinds(); len(got) != 1 || got[0] != EventAcquired {
		t.Fatalf("events %v: one try failed quietly, one acquired", got)
	}
}

// A hold given up in the background while a lease of it that yielded is
// still publishing (its linger ended: the run's last call had no outputs
// and released before the yielded one published) is not taken over by
// this process's next Acquire as its own lock: that Acquire waits until
// the hold is released, so its side effects cannot go out before the
// yielded lease's (a token of the next block before an earlier one).
func TestNextAcquireWaitsForAHoldBeingGivenUp(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock, c.Linger = "a", 100, 100, 5*time.Millisecond })
	waiting := make(chan struct{}, 1)
	a.localWait = func(string) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	ctx := context.Background()
	first := mustAcquire(t, a, "g", "a/1")
	if err := first.Check(ctx); err != nil {
		t.Fatal(err)
	}
	got := acquireLater(t, a.Locks, "g", "a/2")
	<-waiting
	if !first.Yield(ctx) {
		t.Fatal("Yield with a caller waiting did not yield")
	}
	second := <-got
	mustRelease(t, second) // no outputs, nobody waits: lingers
	// The linger ends: the hold is being given up, after first.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		a.mu.Lock()
		s := a.slots["g"]
		ending := s != nil && !s.lingering && a.giving["g"] != nil
		a.mu.Unlock()
		if ending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the linger did not end")
		}
	}
	got = acquireLater(t, a.Locks, "g", "a/3")
	select {
	case third := <-got:
		t.Fatalf("acquired token %d while token %d of the hold given up was still publishing", third.Token, first.Token)
	case <-time.After(50 * time.Millisecond):
	}
	mustRelease(t, first)
	third := <-got
	if third == nil || third.Token <= 100 {
		t.Fatalf("third lease %+v, want one of the next block", third)
	}
	mustRelease(t, third)
}

// acquireLater acquires group for holder on l in the background; the
// lease comes on the channel (nil on an error, which fails t).
func acquireLater(t *testing.T, l *Locks, group, holder string) chan *Lease {
	got := make(chan *Lease, 1)
	go func() {
		ls, err := l.Acquire(context.Background(), group, holder)
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	return got
}

// Config.Notify: a node that finds the group held by another asks that
// node to give it up (YieldIdle) and tries again at once when it did. A
// hold that only lingers is given up on the spot (released in the store,
// announced as at the linger's end), and the lock goes to the waiting
// node without a sleep; the first node's own next caller does not take it
// back meanwhile (the waiter marker). A hold in use is not given up: the
// waiter sleeps its backoff as before. Tokens only grow.
func TestNotifiedHolderGivesUpALingeringHold(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock, c.Linger = "a", 100, 100, time.Hour })
	var asked atomic.Int32
	b := w.node(nil, func(c *Config) {
		c.Node, c.KeepFor, c.Linger = "b", 100, time.Hour
		c.Notify = func(ctx context.Context, node, group, holder string) Answer {
			asked.Add(1)
			if node != "a" || group != "g" || holder != "b/1" {
				t.Errorf("asked %s for %s for %s, want a for g for b/1", node, group, holder)
				return Answer{}
			}
			return a.YieldIdle(ctx, group, Asker{Node: "b", Holder: holder})
		}
	})
	ctx := context.Background()
	first := mustAcquire(t, a, "g", "a/1")
	mustRelease(t, first)
	if r := w.record("g"); !r.Held {
		t.Fatalf("record %+v: not lingering", r)
	}
	got := mustAcquire(t, b, "g", "b/1")
	if n := asked.Load(); n != 1 || len(b.sl.Slept()) != 0 {
		t.Fatalf("asked %d times, slept %v: want one question and no sleep", n, b.sl.Slept())
	}
	if got.Token <= first.Token {
		t.Fatalf("token %d after %d", got.Token, first.Token)
	}
	if kinds := a.ev.kinds(); kinds[len(kinds)-1] != EventReleased {
		t.Fatalf("a's events %v: the hold given up is announced", kinds)
	}
	a.mu.Lock()
	slots := len(a.slots)
	a.mu.Unlock()
	if slots != 0 {
		t.Fatalf("%d slots left on a", slots)
	}
	if a.YieldIdle(ctx, "g", Asker{}).Released {
		t.Fatal("a yielded a hold it does not have")
	}

	// b's lease in use: a's caller asks, b does not give it up, a sleeps.
	a.cfg.Notify = func(ctx context.Context, node, group, holder string) Answer {
		return b.YieldIdle(ctx, group, Asker{Node: "a", Holder: holder})
	}
	a.cfg.MaxRetries = 1
	if _, err := a.Acquire(ctx, "g", "a/2"); !errors.Is(err, ErrContended) {
		t.Fatalf("Acquire while b's lease runs: %v, want ErrContended", err)
	}
	var slept time.Duration
	for _, d := range a.sl.Slept() {
		slept += d
	}
	if want := backoff(base, 0); slept != want {
		t.Fatalf("a slept %v, want its one backoff (%v)", a.sl.Slept(), want)
	}
	if err := got.Check(ctx); err != nil {
		t.Fatalf("b's lease after a's question: %v", err)
	}
	mustRelease(t, got)
}

// A waiting node asks again at each look (FairEvery): the holder's lease
// that was in use at the first question has ended and its hold only
// lingers now, so it is given up then, not at the end of the backoff.
func TestWaiterAsksAgainWhenTheHoldComesToLinger(t *testing.T) {
	w := newWorld(t)
	// a reads the record for waiter markers rarely (FairEvery): its hold
	// comes to linger although b waits.
	a := w.node(nil, func(c *Config) {
		c.Node, c.KeepFor, c.TokenBlock, c.Linger, c.FairEvery = "a", 100, 100, time.Hour, time.Hour
	})
	mustRelease(t, mustAcquire(t, a, "g", "a/0")) // lingers; the record read
	held := mustAcquire(t, a, "g", "a/1")
	var answers []bool
	b := w.node(nil, func(c *Config) {
		c.Node, c.KeepFor = "b", 100
		c.Notify = func(ctx context.Context, _, group, holder string) Answer {
			ans := a.YieldIdle(ctx, group, Asker{Node: "b", Holder: holder})
			answers = append(answers, ans.Released)
			return ans
		}
	})
	b.sl.hook = func(i int) {
		if i == 0 { // the lease in use ends during b's first look's sleep
			mustRelease(t, held)
		}
	}
	got := mustAcquire(t, b, "g", "b/1")
	if len(answers) != 2 || answers[0] || !answers[1] {
		t.Fatalf("answers %v, want in use, then given up", answers)
	}
	if slept := b.sl.Slept(); len(slept) != 1 || slept[0] != b.cfg.FairEvery {
		t.Fatalf("b slept %v, want one look (%v) of its %v backoff", slept, b.cfg.FairEvery, backoff(base, 0))
	}
	if got.Token <= held.Token {
		t.Fatalf("token %d after %d", got.Token, held.Token)
	}
}

// A node that gave a lingering hold up to another on its request asks
// that node first at its next Acquire of the group within Linger: the
// hold it gets back costs one read and one write (no try that finds it
// held, no waiter marker). Past Linger, or when the other node's lease is
// in use, it acquires as before.
func TestHandedBackGroupIsAskedForFirst(t *testing.T) {
	w := newWorld(t)
	var a, b *node
	var asked []string
	var mu sync.Mutex
	ask := func(from string, to **node) func(context.Context, string, string, string) Answer {
		return func(ctx context.Context, node, group, holder string) Answer {
			mu.Lock()
			asked = append(asked, from+">"+node)
			mu.Unlock()
			return (*to).YieldIdle(ctx, group, Asker{Node: from, Holder: holder})
		}
	}
	bst := &countStore{MemoryStore: w.mem}
	a = w.node(nil, func(c *Config) {
		c.Node, c.KeepFor, c.TokenBlock, c.Linger, c.Notify = "a", 100, 100, time.Second, ask("a", &b)
	})
	b = w.node(bst, func(c *Config) {
		c.Node, c.KeepFor, c.TokenBlock, c.Linger, c.Notify = "b", 100, 100, time.Second, ask("b", &a)
	})
	ctx := context.Background()
	mustRelease(t, mustAcquire(t, b, "g", "b/1")) // b lingers
	mustRelease(t, mustAcquire(t, a, "g", "a/1")) // a asks b, which hands it over; a lingers
	mu.Lock()
	if len(asked) != 1 || asked[0] != "a>b" {
		t.Fatalf("questions %v, want a asking b", asked)
	}
	asked = nil
	mu.Unlock()

	g0, p0 := bst.trips()
	l := mustAcquire(t, b, "g", "b/2")
	g, p := bst.trips()
	mu.Lock()
	if len(asked) != 1 || asked[0] != "b>a" {
		t.Fatalf("questions %v, want b asking a first", asked)
	}
	asked = nil
	mu.Unlock()
	if g-g0 != 1 || p-p0 != 1 || len(b.sl.Slept()) != 0 {
		t.Fatalf("b's acquisition after handing the group over: %d gets %d puts, slept %v; want 1+1, no sleep", g-g0, p-p0, b.sl.Slept())
	}
	if err := l.Check(ctx); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, l)

	// a takes it back (asking b), then b's next Acquire comes after Linger:
	// no question first (a's hold may be gone; the try reads and asks if
	// it is held).
	mustRelease(t, mustAcquire(t, a, "g", "a/2"))
	mu.Lock()
	asked = nil
	mu.Unlock()
	w.clk.Advance(2 * time.Second)
	g0, p0 = bst.trips()
	mustRelease(t, mustAcquire(t, b, "g", "b/3"))
	g, p = bst.trips()
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != "b>a" || g-g0 != 2 || p-p0 != 2 {
		t.Fatalf("after Linger: questions %v, %d gets %d puts; want the try's question only, 2+2 (read, marker, read, acquire)", asked, g-g0, p-p0)
	}
}

// A node alone (Config.Alone: its last heartbeat saw no other live node)
// keeps and lingers its holds without FairEvery's read for waiter
// markers: nobody else can have written one. Not alone, the read comes
// back, and a marker ends the hold as before.
func TestAloneNodeSkipsTheWaiterRead(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	var alone atomic.Bool
	alone.Store(true)
	a := w.node(st, func(c *Config) {
		c.Node, c.KeepFor, c.TokenBlock, c.Linger, c.Alone = "a", 100, 100, time.Hour, alone.Load
	})
	mustRelease(t, mustAcquire(t, a, "g", "a/1")) // lingers
	for i := 2; i <= 4; i++ {
		w.clk.Advance(time.Second) // past FairEvery each time
		g0, p0 := st.trips()
		mustRelease(t, mustAcquire(t, a, "g", fmt.Sprintf("a/%d", i)))
		if g, p := st.trips(); g != g0 || p != p0 {
			t.Fatalf("lease %d of a lingering hold on a node alone: %d gets %d puts, want none", i, g-g0, p-p0)
		}
	}
	// Another node appears and marks the record: no longer alone, the
	// next release reads it and gives the hold up.
	alone.Store(false)
	rec := w.record("g")
	rec.Waiter, rec.WaiterMs = "b", w.clk.Now().UnixMilli()
	w.putRecord("g", rec)
	w.clk.Advance(time.Second)
	mustRelease(t, mustAcquire(t, a, "g", "a/5"))
	w.waitRecord("g", func(r record) bool { return !r.Held }, "the hold given up for the waiting node")
}

// A hold serves leases without store round trips only while it is younger
// than half of MaxAge (since it was taken or renewed): a peer may take an
// unwritten lock older than MaxAge, so a hold reused past that age — a
// long linger, calls too short to be renewed — would run this node's
// calls while the peer ran the group's. An aged hold is given up and the
// lock acquired anew (its record's age starts again); one that ages during
// a call does not linger.
func TestAgedHoldIsAcquiredAnew(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, func(c *Config) {
		c.Node, c.KeepFor, c.TokenBlock, c.Linger, c.Alone = "a", 1000, 1000, time.Hour, func() bool { return true }
	})
	first := mustAcquire(t, a, "g", "a/1")
	mustRelease(t, first) // lingers
	w.clk.Advance(10 * time.Second)
	g0, p0 := st.trips()
	second := mustAcquire(t, a, "g", "a/2")
	if g, p := st.trips(); g != g0 || p != p0 || second.Token != first.Token+1 {
		t.Fatalf("lease of a hold 10 s old (MaxAge 30 s): %d gets %d puts, token %d after %d", g-g0, p-p0, second.Token, first.Token)
	}
	mustRelease(t, second) // still young: lingers
	if r := w.record("g"); !r.Held {
		t.Fatalf("record %+v: a young hold did not linger", r)
	}
	w.clk.Advance(6 * time.Second) // 16 s: past half of MaxAge
	third := mustAcquire(t, a, "g", "a/3")
	r := w.record("g")
	if !r.Held || r.Holder != "a/3" || r.AcquiredMs != w.clk.Now().UnixMilli() || third.Token <= second.Token {
		t.Fatalf("after the aged hold: record %+v, token %d after %d; want a new acquisition by a/3, now", r, third.Token, second.Token)
	}
	if got := a.ev.kinds(); len(got) != 3 || got[1] != EventReleased || got[2] != EventAcquired {
		t.Fatalf("events %v: want acquired, released (the aged hold), acquired", got)
	}
	// A hold that ages while its call runs is given up at its release.
	w.clk.Advance(20 * time.Second)
	mustRelease(t, third)
	if r := w.record("g"); r.Held {
		t.Fatalf("record %+v: an aged hold lingered", r)
	}
}

// HeldAt names the process this one gave a group's hold up to — at its
// question, or for its waiter marker — for Linger after, renewed by each
// turn that ran there (Forwarded), forgotten when one did not or when the
// group is held here again; never while the group is held or awaited
// here.
func TestHeldAtNamesTheProcessTheHoldWentTo(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock, c.Linger = "a", 100, 100, time.Second })
	b := w.node(nil, func(c *Config) {
		c.Node, c.KeepFor, c.TokenBlock, c.Linger = "b", 100, 100, time.Second
		c.Notify = func(ctx context.Context, node, group, holder string) Answer {
			return a.YieldIdle(ctx, group, Asker{Node: "b", Holder: holder})
		}
	})
	first := mustAcquire(t, a, "g", "a/1")
	if got := a.HeldAt("g"); got != "" {
		t.Fatalf("HeldAt while held here: %q", got)
	}
	mustRelease(t, first) // lingers
	second := mustAcquire(t, b, "g", "b/1")
	if got := a.HeldAt("g"); got != "b" {
		t.Fatalf("HeldAt after the hold went to b at its question: %q", got)
	}
	w.clk.Advance(800 * time.Millisecond)
	a.Forwarded("g", "b", true) // a turn ran there: named for another Linger
	w.clk.Advance(800 * time.Millisecond)
	if got := a.HeldAt("g"); got != "b" {
		t.Fatalf("HeldAt 800 ms after a turn ran there: %q", got)
	}
	a.Forwarded("g", "b", false) // one did not
	if got := a.HeldAt("g"); got != "" {
		t.Fatalf("HeldAt after a turn did not run there: %q", got)
	}
	mustRelease(t, second) // b lingers

	// For a waiter marker: b's kept hold reads the marker of a and gives
	// the hold up; b then names a.
	third := mustAcquire(t, b, "g", "b/2")
	rec := w.record("g")
	rec.Waiter, rec.WaiterMs = "a", w.clk.Now().UnixMilli()
	w.putRecord("g", rec)
	w.clk.Advance(b.cfg.FairEvery)
	mustRelease(t, third)
	if got := b.HeldAt("g"); got != "a" {
		t.Fatalf("HeldAt after the hold was given up for a's marker: %q", got)
	}
	// Held here again: forgotten.
	mustRelease(t, mustAcquire(t, b, "g", "b/3"))
	b.ReleaseIdle(context.Background())
	if got := b.HeldAt("g"); got != "" {
		t.Fatalf("HeldAt after the group was held here again: %q", got)
	}
	// Past Linger: forgotten.
	if got := a.HeldAt("g"); got != "" {
		t.Fatalf("a's HeldAt: %q", got)
	}
	mustRelease(t, mustAcquire(t, a, "g", "a/2"))
	mustRelease(t, mustAcquire(t, b, "g", "b/4")) // asked of a, which lingered
	if got := a.HeldAt("g"); got != "b" {
		t.Fatalf("HeldAt after the hold went to b again: %q", got)
	}
	w.clk.Advance(1100 * time.Millisecond)
	if got := a.HeldAt("g"); got != "" {
		t.Fatalf("HeldAt past Linger: %q", got)
	}
}

// A node whose try found the free lock kept for another node's marker
// writes no marker of its own then; when that node takes the lock (its
// record carries no marker), the waiting node's next look during its
// backoff writes one, so the holder yields at its next fairness read
// instead of keeping the lock for whole runs until the waiter's next try
// (RetryBase later: two nodes sharing a busy group gave messages back
// while one waited over a second for its turn).
func TestWaiterMarksWhenTheLockIsTakenByTheNodeItWasKeptFor(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.TokenBlock = "a", 100, 100 })
	b := w.node(nil, func(c *Config) { c.Node, c.KeepFor = "b", 10 })
	w.putRecord("g", record{Token: 5, Waiter: "a", WaiterMs: w.clk.Now().UnixMilli()})
	var held *Lease
	var marked record
	b.sl.hook = func(i int) {
		switch i {
		case 0: // a takes the lock kept for it: its record has no marker
			held = mustAcquire(t, a, "g", "a/1")
		case 1: // b looked once since
			marked = w.record("g")
			mustRelease(t, held)
		}
	}
	ls, err := b.Acquire(context.Background(), "g", "b/1")
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, ls)
	if marked.Waiter != "b" || !marked.Held || marked.Holder != "a/1" {
		t.Fatalf("record while a held the lock and b waited: %+v, want b's marker", marked)
	}
	var slept time.Duration
	for _, d := range b.sl.Slept() {
		slept += d
	}
	if slept > 200*time.Millisecond || ls.Token != 106 {
		t.Fatalf("b slept %v (%v) before taking the lock a freed at 200 ms; token %d, want 106", slept, b.sl.Slept(), ls.Token)
	}
}

// The marker a waiting node writes while it looks does not overwrite
// another node's fresh one: the node that waited first keeps its turn.
func TestWaiterLookLeavesAnotherFreshMarker(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, func(c *Config) { c.Node = "a" })
	b := w.node(nil, func(c *Config) { c.Node, c.KeepFor, c.MaxRetries = "b", 10, 1 })
	held := mustAcquire(t, a, "g", "a/1")
	defer mustRelease(t, held)
	b.sl.hook = func(i int) {
		if i == 0 { // c marks after b's try
			r := w.record("g")
			r.Waiter, r.WaiterMs = "c", w.clk.Now().UnixMilli()
			w.putRecord("g", r)
		}
	}
	if _, err := b.Acquire(context.Background(), "g", "b/1"); !errors.Is(err, ErrContended) {
		t.Fatalf("b: %v, want ErrContended", err)
	}
	if r := w.record("g"); r.Waiter != "c" {
		t.Fatalf("record %+v: c's marker overwritten", r)
	}
}

// blockingSleep is a Config.Sleep that really waits d (the tests make a
// look's step far longer than they take) and counts the sleeps that were
// not cut short.
type blockingSleep struct{ full atomic.Int32 }

func (s *blockingSleep) Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		s.full.Add(1)
		return nil
	}
}

// waitWaiting waits (real time) until one of l's Acquires of group
// waits between two looks.
func (l *Locks) waitWaiting(t *testing.T, group string) {
	t.Helper()
	waiting := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		lk := l.looks[group]
		return lk != nil && lk.cancel != nil
	}
	for deadline := time.Now().Add(5 * time.Second); !waiting(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no Acquire of %s waited", group)
		}
	}
}

// A node that gives a lock up while another node's waiter marker is in the
// record tells that node (Config.Tell), whose Acquire, waiting between two
// tries, looks at once and takes the lock instead of at its next look
// (FairEvery later: 5 s here, so a missed Tell fails the test by a full
// sleep, not by a hang). Told while it is between two looks (reading,
// asking), it does not wait at the next one.
func TestReleaseTellsTheWaitingNode(t *testing.T) {
	for _, between := range []bool{false, true} {
		t.Run(fmt.Sprintf("between-looks=%v", between), func(t *testing.T) {
			w := newWorld(t)
			var b *node
			var told atomic.Int32
			a := w.node(nil, func(c *Config) {
				c.Node, c.KeepFor, c.TokenBlock = "a", 100, 100
				c.Tell = func(_ context.Context, node, group string) {
					if node != "b" || group != "g" {
						t.Errorf("told %s about %s, want b about g", node, group)
					}
					told.Add(1)
					if !between {
						b.Freed(group)
					}
				}
			})
			held := mustAcquire(t, a, "g", "a/1")
			var gets atomic.Int32
			st := &hookStore{MemoryStore: w.mem}
			if between {
				st.onGet = func() {
					switch gets.Add(1) {
					case 1: // b's try reads: told now, between two looks
						b.Freed("g")
					case 2: // b's look, at once: a gives the lock up first
						mustRelease(t, held)
					}
				}
			}
			sl := &blockingSleep{}
			b = w.node(st, func(c *Config) {
				c.Node, c.KeepFor, c.FairEvery, c.RetryBase, c.Sleep = "b", 10, 5*time.Second, time.Hour, sl.Sleep
			})
			got := acquireLater(t, b.Locks, "g", "b/1")
			if !between {
				b.waitWaiting(t, "g")
				if r := w.record("g"); r.Waiter != "b" {
					t.Fatalf("record %+v: b waits without its marker", r)
				}
				mustRelease(t, held)
			}
			ls := <-got
			if ls == nil {
				t.Fatal("b took no lease")
			}
			defer mustRelease(t, ls)
			if n := sl.full.Load(); n != 0 {
				t.Fatalf("b slept %d full steps of 5 s", n)
			}
			if ls.Token != 101 {
				t.Fatalf("b's token %d, want 101", ls.Token)
			}
			for deadline := time.Now().Add(5 * time.Second); told.Load() == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("a never told b (Tell runs in the background)")
				}
			}
		})
	}
}

// hookStore calls onGet before each Get.
type hookStore struct {
	*state.MemoryStore
	onGet func()
}

func (s *hookStore) Get(ctx context.Context, key string) (state.Item, error) {
	if s.onGet != nil {
		s.onGet()
	}
	return s.MemoryStore.Get(ctx, key)
}

// A lingering hold whose linger ends with another node's waiter marker
// in the record tells that node too (giveUp), which then takes the lock
// without waiting for its next look.
func TestLingerEndTellsTheWaitingNode(t *testing.T) {
	w := newWorld(t)
	var b *node
	a := w.node(nil, func(c *Config) {
		c.Node, c.KeepFor, c.TokenBlock, c.Linger = "a", 100, 100, 30*time.Millisecond
		c.Tell = func(_ context.Context, node, group string) { b.Freed(group) }
	})
	sl := &blockingSleep{}
	b = w.node(nil, func(c *Config) {
		c.Node, c.KeepFor, c.FairEvery, c.RetryBase, c.Sleep = "b", 10, 5*time.Second, time.Hour, sl.Sleep
	})
	mustRelease(t, mustAcquire(t, a, "g", "a/1")) // lingers on a for 30 ms
	ls := mustAcquire(t, b, "g", "b/1")
	defer mustRelease(t, ls)
	if n := sl.full.Load(); n != 0 {
		t.Fatalf("b slept %d full steps of 5 s", n)
	}
	if ls.Token != 101 {
		t.Fatalf("b's token %d, want 101", ls.Token)
	}
}
