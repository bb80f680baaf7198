package grouplock

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

const base = 500 * time.Millisecond

// clock is a fake Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// sleeper is a fake Config.Sleep: it records the sleeps, advances the clock
// and runs hook (with the sleep's index) while "asleep".
type sleeper struct {
	clk   *clock
	mu    sync.Mutex
	slept []time.Duration
	hook  func(i int)
}

func (s *sleeper) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.slept = append(s.slept, d)
	i := len(s.slept) - 1
	s.mu.Unlock()
	s.clk.Advance(d)
	if s.hook != nil {
		s.hook(i)
	}
	return ctx.Err()
}

func (s *sleeper) Slept() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.slept)
}

// events collects Config.OnEvent.
type events struct {
	mu   sync.Mutex
	list []Event
}

func (e *events) add(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, ev)
}

func (e *events) all() []Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.list)
}

func (e *events) kinds() []string {
	var ks []string
	for _, ev := range e.all() {
		ks = append(ks, ev.Kind)
	}
	return ks
}

func (e *events) last() Event {
	all := e.all()
	if len(all) == 0 {
		return Event{}
	}
	return all[len(all)-1]
}

// countStore counts round trips and injects errors and interleavings.
type countStore struct {
	*state.MemoryStore
	gets, puts atomic.Int64

	mu        sync.Mutex
	getErr    error
	putErr    error
	beforePut func() // run once before the next Put
}

func (s *countStore) Get(ctx context.Context, key string) (state.Item, error) {
	s.gets.Add(1)
	s.mu.Lock()
	err := s.getErr
	s.mu.Unlock()
	if err != nil {
		return state.Item{}, err
	}
	return s.MemoryStore.Get(ctx, key)
}

func (s *countStore) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	s.puts.Add(1)
	s.mu.Lock()
	err, hook := s.putErr, s.beforePut
	s.beforePut = nil
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if hook != nil {
		hook()
	}
	return s.MemoryStore.Put(ctx, key, value, opts)
}

func (s *countStore) set(getErr, putErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.getErr, s.putErr = getErr, putErr
}

func (s *countStore) trips() (int64, int64) { return s.gets.Load(), s.puts.Load() }

// node is one simulated WorkManager node.
type node struct {
	*Locks
	ev *events
	sl *sleeper
}

type world struct {
	t   *testing.T
	mem *state.MemoryStore
	clk *clock
}

func newWorld(t *testing.T) *world {
	return &world{t: t, mem: state.NewMemoryStore(), clk: &clock{t: time.Unix(1_700_000_000, 0)}}
}

// node returns a node on the shared store and clock; mod adjusts its Config.
func (w *world) node(st state.Store, mod func(*Config)) *node {
	n := &node{ev: &events{}, sl: &sleeper{clk: w.clk}}
	cfg := Config{RetryBase: base, MaxAge: 30 * time.Second, OnEvent: n.ev.add, Now: w.clk.Now, Sleep: n.sl.Sleep}
	if mod != nil {
		mod(&cfg)
	}
	if st == nil {
		st = w.mem
	}
	n.Locks = New(st, cfg)
	return n
}

func (w *world) record(group string) record {
	w.t.Helper()
	it, err := w.mem.Get(context.Background(), Key(group))
	if err != nil {
		w.t.Fatalf("get record: %v", err)
	}
	var r record
	if err := json.Unmarshal(it.Value, &r); err != nil {
		w.t.Fatal(err)
	}
	return r
}

func (w *world) putRecord(group string, r record) {
	w.t.Helper()
	ctx := context.Background()
	b, _ := json.Marshal(r)
	it, err := w.mem.Get(ctx, Key(group))
	opts := state.PutOptions{IfAbsent: true}
	if err == nil {
		opts = state.PutOptions{ETag: it.ETag}
	}
	if err := w.mem.Put(ctx, Key(group), b, opts); err != nil {
		w.t.Fatal(err)
	}
}

func mustAcquire(t *testing.T, n *node, group, holder string) *Lease {
	t.Helper()
	ls, err := n.Acquire(context.Background(), group, holder)
	if err != nil {
		t.Fatalf("Acquire %s by %s: %v", group, holder, err)
	}
	return ls
}

func mustRelease(t *testing.T, ls *Lease) {
	t.Helper()
	if err := ls.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func TestUncontendedTokensAndRoundTrips(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	n := w.node(st, nil)
	ctx := context.Background()
	for want := int64(1); want <= 3; want++ {
		g0, p0 := st.trips()
		ls := mustAcquire(t, n, "g", "a/1")
		if ls.Token != want || ls.Group != "g" || ls.Holder != "a/1" {
			t.Fatalf("lease %+v, want token %d", ls, want)
		}
		if g, p := st.trips(); g-g0 != 1 || p-p0 != 1 {
			t.Fatalf("acquire: %d gets %d puts, want 1+1", g-g0, p-p0)
		}
		if err := ls.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if g, p := st.trips(); g-g0 != 2 || p-p0 != 2 {
			t.Fatalf("first check: %d gets %d puts in all, want 2+2", g-g0, p-p0)
		}
		if err := ls.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if g, p := st.trips(); g-g0 != 2 || p-p0 != 2 {
			t.Fatalf("second check made a round trip: %d gets %d puts", g-g0, p-p0)
		}
		if r := w.record("g"); !r.Held || !r.Wrote || r.Token != want || r.Holder != "a/1" {
			t.Fatalf("record while held: %+v", r)
		}
		mustRelease(t, ls)
		if g, p := st.trips(); g-g0 != 3 || p-p0 != 3 {
			t.Fatalf("release: %d gets %d puts in all, want 3+3", g-g0, p-p0)
		}
		if r := w.record("g"); r.Held || r.Token != want {
			t.Fatalf("record after release: %+v", r)
		}
		if err := ls.Check(ctx); !errors.Is(err, ErrStale) {
			t.Fatalf("Check after Release: %v, want ErrStale", err)
		}
		mustRelease(t, ls) // idempotent
	}
	if got, want := n.ev.kinds(), []string{"acquired", "released", "acquired", "released", "acquired", "released"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if ev := n.ev.last(); ev.Group != "g" || ev.Holder != "a/1" || ev.Token != 3 || ev.At.IsZero() {
		t.Fatalf("release event %+v", ev)
	}
	// The key is permanent and keeps the documented JSON shape.
	it, _ := w.mem.Get(ctx, Key("g"))
	var m map[string]any
	if err := json.Unmarshal(it.Value, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"token", "holder", "held", "acquired_ms", "wrote", "waiter", "waiter_ms"} {
		if _, ok := m[f]; !ok {
			t.Errorf("field %q missing in %s", f, it.Value)
		}
	}
	if Key("g") != "workmanager/grouplock/g" {
		t.Errorf("Key = %q", Key("g"))
	}
	if len(n.slots) != 0 {
		t.Errorf("local slots left: %v", n.slots)
	}
}

func TestContendedGivesUpAfterRetries(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, nil)
	st := &countStore{MemoryStore: w.mem}
	b := w.node(st, nil)
	held := mustAcquire(t, a, "g", "a/1")

	_, err := b.Acquire(context.Background(), "g", "b/1")
	if !errors.Is(err, ErrContended) {
		t.Fatalf("Acquire: %v, want ErrContended", err)
	}
	if g, p := st.trips(); g != 4 || p != 3 {
		t.Fatalf("%d gets %d puts, want 4 tries and 3 waiter markers", g, p)
	}
	if got, want := b.sl.Slept(), []time.Duration{base, 2 * base, 4 * base}; !slices.Equal(got, want) {
		t.Fatalf("sleeps %v, want %v", got, want)
	}
	ev := b.ev.last()
	if ev.Kind != EventContended || ev.Holder != "b/1" || ev.PrevHolder != "a/1" || ev.PrevToken != 1 {
		t.Fatalf("event %+v", ev)
	}
	if r := w.record("g"); r.Waiter != "b/1" || !r.Held || r.Holder != "a/1" {
		t.Fatalf("record %+v: want b/1 waiting", r)
	}
	// The holder is unaffected by the waiter markers.
	if err := held.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, held)
	ls := mustAcquire(t, b, "g", "b/1")
	if ls.Token != 2 {
		t.Fatalf("token %d", ls.Token)
	}
	if r := w.record("g"); r.Waiter != "" || r.WaiterMs != 0 {
		t.Fatalf("waiter marker not cleared by the waiter's acquisition: %+v", r)
	}

	// MaxRetries is honoured; a negative value means a single try.
	for _, c := range []struct{ retries, tries int }{{1, 2}, {-1, 1}} {
		n := w.node(nil, func(cfg *Config) { cfg.MaxRetries = c.retries })
		if _, err := n.Acquire(context.Background(), "g", "c/1"); !errors.Is(err, ErrContended) {
			t.Fatalf("MaxRetries %d: %v", c.retries, err)
		}
		if got := len(n.sl.Slept()); got != c.tries-1 {
			t.Fatalf("MaxRetries %d: %d sleeps, want %d", c.retries, got, c.tries-1)
		}
	}
}

func TestTokensIncreaseAcrossReleaseAndTheft(t *testing.T) {
	w := newWorld(t)
	a, b := w.node(nil, nil), w.node(nil, nil)
	var tokens []int64
	ls := mustAcquire(t, a, "g", "a/1")
	tokens = append(tokens, ls.Token)
	mustRelease(t, ls)
	ls = mustAcquire(t, b, "g", "b/1")
	tokens = append(tokens, ls.Token)
	w.clk.Advance(30 * time.Second) // b dies without writing
	ls = mustAcquire(t, a, "g", "a/1")
	tokens = append(tokens, ls.Token)
	mustRelease(t, ls)
	ls = mustAcquire(t, w.node(nil, nil), "g", "b/2") // b restarted
	tokens = append(tokens, ls.Token)
	if !slices.Equal(tokens, []int64{1, 2, 3, 4}) {
		t.Fatalf("tokens %v", tokens)
	}
	// Another group has its own tokens.
	if ls := mustAcquire(t, a, "h", "a/1"); ls.Token != 1 {
		t.Fatalf("group h token %d", ls.Token)
	}
}

func TestStealUnwrittenStaleLock(t *testing.T) {
	w := newWorld(t)
	a, b := w.node(nil, nil), w.node(nil, func(cfg *Config) { cfg.MaxRetries = -1 })
	ctx := context.Background()
	old := mustAcquire(t, a, "g", "a/1")

	w.clk.Advance(30*time.Second - time.Millisecond)
	if _, err := b.Acquire(ctx, "g", "b/1"); !errors.Is(err, ErrContended) {
		t.Fatalf("young lock: %v, want ErrContended", err)
	}
	w.clk.Advance(time.Millisecond)
	b2 := w.node(nil, nil)
	ls := mustAcquire(t, b2, "g", "b/2")
	ev := b2.ev.last()
	if ev.Kind != EventAcquired || !ev.Stolen || ev.PrevHolder != "a/1" || ev.PrevToken != 1 || ev.Token != ls.Token {
		t.Fatalf("event %+v", ev)
	}
	if err := old.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("old Check: %v, want ErrStale", err)
	}
	if err := old.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("old Check again: %v, want ErrStale", err)
	}
	mustRelease(t, old)
	if r := w.record("g"); !r.Held || r.Holder != "b/2" || r.Token != ls.Token {
		t.Fatalf("old Release touched the new lock: %+v", r)
	}
	if err := ls.Check(ctx); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, ls)
	if r := w.record("g"); r.Held {
		t.Fatalf("still held: %+v", r)
	}
	// Neither node's local slot stays taken.
	mustRelease(t, mustAcquire(t, a, "g", "a/1"))
}

// The old lease's Release after a theft must not free the new lock even when
// the old holder never called Check.
func TestStolenReleaseWithoutCheck(t *testing.T) {
	w := newWorld(t)
	a, b := w.node(nil, nil), w.node(nil, nil)
	old := mustAcquire(t, a, "g", "a/1")
	w.clk.Advance(time.Minute)
	ls := mustAcquire(t, b, "g", "b/1")
	mustRelease(t, old)
	if r := w.record("g"); !r.Held || r.Holder != "b/1" || r.Token != ls.Token {
		t.Fatalf("record %+v", r)
	}
	for _, k := range a.ev.kinds() {
		if k == EventReleased {
			t.Fatalf("stolen lease reported released: %v", a.ev.kinds())
		}
	}
}

func TestWrittenStaleLockTheftAborted(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, nil)
	b := w.node(nil, nil)
	ctx := context.Background()
	old := mustAcquire(t, a, "g", "a/1")
	if err := old.Check(ctx); err != nil {
		t.Fatal(err)
	}
	w.clk.Advance(31 * time.Second)

	_, err := b.Acquire(ctx, "g", "b/1")
	if !errors.Is(err, ErrContended) {
		t.Fatalf("Acquire: %v, want ErrContended", err)
	}
	want := []string{"theft_aborted", "theft_aborted", "theft_aborted", "theft_aborted", "contended"}
	if got := b.ev.kinds(); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if ev := b.ev.all()[0]; ev.Holder != "b/1" || ev.PrevHolder != "a/1" || ev.PrevToken != 1 {
		t.Fatalf("theft_aborted event %+v", ev)
	}
	g0, p0 := st.trips()
	if err := old.Check(ctx); err != nil {
		t.Fatalf("writer lost its lock: %v", err)
	}
	if g, p := st.trips(); g != g0 || p != p0 {
		t.Fatal("Check after wrote=true made a store round trip")
	}

	// Escape hatch: a written lock older than WrittenMaxAge (10*MaxAge).
	w.clk.Advance(300 * time.Second)
	b2 := w.node(nil, nil)
	ls := mustAcquire(t, b2, "g", "b/2")
	if ev := b2.ev.last(); !ev.Stolen || ev.PrevToken != 1 || ls.Token != 2 {
		t.Fatalf("event %+v token %d", ev, ls.Token)
	}
	// Past WrittenMaxAge the old lease's Check goes back to the store.
	if err := old.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("old Check: %v, want ErrStale", err)
	}
	mustRelease(t, old)
	if r := w.record("g"); !r.Held || r.Holder != "b/2" {
		t.Fatalf("record %+v", r)
	}
}

func TestWaiterGetsFreedLock(t *testing.T) {
	w := newWorld(t)
	a, b := w.node(nil, nil), w.node(nil, nil)
	cst := &countStore{MemoryStore: w.mem}
	c := w.node(cst, func(cfg *Config) { cfg.MaxRetries = -1 })
	held := mustAcquire(t, a, "g", "a/1")
	var cErr error
	b.sl.hook = func(i int) {
		if i != 0 {
			return
		}
		// While b sleeps: the holder releases and c finds the lock free
		// but kept for b.
		if err := held.Release(context.Background()); err != nil {
			t.Error(err)
		}
		_, cErr = c.Acquire(context.Background(), "g", "c/1")
	}
	ls := mustAcquire(t, b, "g", "b/1")
	if !errors.Is(cErr, ErrContended) {
		t.Fatalf("non-waiter: %v, want ErrContended", cErr)
	}
	if g, p := cst.trips(); g != 1 || p != 0 {
		t.Fatalf("non-waiter wrote: %d gets %d puts", g, p)
	}
	if ev := c.ev.last(); ev.Kind != EventContended || ev.PrevHolder != "" {
		t.Fatalf("non-waiter event %+v", ev)
	}
	if ls.Token != 2 || len(b.sl.Slept()) != 1 {
		t.Fatalf("waiter: token %d after %d sleeps", ls.Token, len(b.sl.Slept()))
	}
	if r := w.record("g"); r.Waiter != "" || r.Holder != "b/1" {
		t.Fatalf("record %+v", r)
	}
	mustRelease(t, ls)
}

func TestWaiterMarkerAge(t *testing.T) {
	w := newWorld(t)
	c := w.node(nil, func(cfg *Config) { cfg.MaxRetries = -1 })
	if got := New(w.mem, Config{}).cfg.WaiterMaxAge; got != 2500*time.Millisecond {
		t.Fatalf("default WaiterMaxAge %v", got)
	}
	maxAge := c.cfg.WaiterMaxAge
	now := w.clk.Now()

	// A fresh marker of another holder keeps a free lock.
	w.putRecord("g", record{Token: 5, Holder: "a/1", Waiter: "x/1", WaiterMs: now.Add(-maxAge + time.Millisecond).UnixMilli()})
	if _, err := c.Acquire(context.Background(), "g", "c/1"); !errors.Is(err, ErrContended) {
		t.Fatalf("fresh marker: %v", err)
	}
	// ... also a stealable one.
	w.putRecord("g", record{Token: 5, Holder: "a/1", Held: true, AcquiredMs: now.Add(-time.Hour).UnixMilli(), Waiter: "x/1", WaiterMs: now.UnixMilli()})
	if _, err := c.Acquire(context.Background(), "g", "c/1"); !errors.Is(err, ErrContended) {
		t.Fatalf("fresh marker on a stale lock: %v", err)
	}
	// The waiter itself takes it.
	ls := mustAcquire(t, c, "g", "x/1")
	if ls.Token != 6 {
		t.Fatalf("token %d", ls.Token)
	}
	mustRelease(t, ls)
	// An old marker does not block.
	w.putRecord("g", record{Token: 6, Holder: "x/1", Waiter: "x/1", WaiterMs: now.Add(-maxAge).UnixMilli()})
	ls = mustAcquire(t, c, "g", "c/1")
	if r := w.record("g"); ls.Token != 7 || r.Waiter != "" {
		t.Fatalf("token %d record %+v", ls.Token, r)
	}
}

// A waiter does not overwrite another holder's fresh marker (the first waiter
// keeps its turn), but refreshes its own.
func TestWaiterMarkerNotOverwritten(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, nil)
	held := mustAcquire(t, a, "g", "a/1")
	b := w.node(nil, func(cfg *Config) { cfg.MaxRetries = 1 })
	if _, err := b.Acquire(context.Background(), "g", "b/1"); !errors.Is(err, ErrContended) {
		t.Fatal(err)
	}
	r := w.record("g")
	c := w.node(nil, func(cfg *Config) { cfg.MaxRetries = 1 })
	if _, err := c.Acquire(context.Background(), "g", "c/1"); !errors.Is(err, ErrContended) {
		t.Fatal(err)
	}
	if r2 := w.record("g"); r2.Waiter != "b/1" || r2.WaiterMs != r.WaiterMs {
		t.Fatalf("marker overwritten: %+v -> %+v", r, r2)
	}
	if _, err := b.Acquire(context.Background(), "g", "b/1"); !errors.Is(err, ErrContended) {
		t.Fatal(err)
	}
	if r3 := w.record("g"); r3.Waiter != "b/1" || r3.WaiterMs <= r.WaiterMs {
		t.Fatalf("own marker not refreshed: %+v -> %+v", r, r3)
	}
	mustRelease(t, held)
}

// Check and Release re-read and retry when a waiter marker changed the ETag
// between their read and their write.
func TestCheckAndReleaseRetryOnMarkerConflict(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	n := w.node(st, nil)
	ctx := context.Background()
	ls := mustAcquire(t, n, "g", "a/1")
	mark := func() {
		r := w.record("g")
		r.Waiter, r.WaiterMs = "b/1", w.clk.Now().UnixMilli()
		w.putRecord("g", r)
	}
	st.mu.Lock()
	st.beforePut = mark
	st.mu.Unlock()
	if err := ls.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if r := w.record("g"); !r.Wrote || r.Waiter != "b/1" || !r.Held {
		t.Fatalf("after check %+v", r)
	}
	st.mu.Lock()
	st.beforePut = mark
	st.mu.Unlock()
	mustRelease(t, ls)
	if r := w.record("g"); r.Held || r.Waiter != "b/1" || r.Token != 1 {
		t.Fatalf("after release %+v", r)
	}
}

func TestLocalSerialization(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	n := w.node(st, nil)
	const workers, iters = 2, 300
	var inside, overlaps atomic.Int64
	var wg sync.WaitGroup
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for range iters {
				ls, err := n.Acquire(ctx, "g", "node/"+string(rune('a'+i)))
				if err != nil {
					t.Error(err)
					return
				}
				if v := inside.Add(1); v != 1 {
					overlaps.Add(1)
				}
				if err := ls.Check(ctx); err != nil {
					t.Error(err)
				}
				inside.Add(-1)
				if err := ls.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() != 0 {
		t.Fatalf("%d times two holders at once", overlaps.Load())
	}
	// No polling: exactly acquire+check+release round trips, no sleeps.
	if g, p := st.trips(); g != 3*workers*iters || p != 3*workers*iters {
		t.Fatalf("%d gets %d puts, want %d each", g, p, 3*workers*iters)
	}
	if len(n.sl.Slept()) != 0 {
		t.Fatal("local contenders slept")
	}
	if r := w.record("g"); r.Token != workers*iters || r.Held {
		t.Fatalf("record %+v", r)
	}
	if len(n.slots) != 0 {
		t.Fatalf("slots left: %v", n.slots)
	}
}

func TestLocalWaiterDoesNotPoll(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	n := w.node(st, nil)
	waiting := make(chan struct{})
	n.localWait = func(string) { close(waiting) }
	first := mustAcquire(t, n, "g", "n/1")
	g0, p0 := st.trips()
	got := make(chan *Lease)
	go func() {
		ls, err := n.Acquire(context.Background(), "g", "n/2")
		if err != nil {
			t.Error(err)
		}
		got <- ls
	}()
	<-waiting
	if g, p := st.trips(); g != g0 || p != p0 {
		t.Fatal("local waiter touched the store")
	}
	// Other groups are not blocked.
	mustRelease(t, mustAcquire(t, n, "h", "n/3"))
	g0, p0 = st.trips()
	mustRelease(t, first)
	second := <-got
	if second == nil || second.Token != 2 {
		t.Fatalf("second lease %+v", second)
	}
	if g, p := st.trips(); g-g0 != 2 || p-p0 != 2 {
		t.Fatalf("release+acquire: %d gets %d puts, want 2+2", g-g0, p-p0)
	}
	if len(n.sl.Slept()) != 0 {
		t.Fatal("slept")
	}
	mustRelease(t, second)
}

func TestStoreErrors(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	n := w.node(st, nil)
	ctx := context.Background()
	boom := errors.New("store down")

	st.set(boom, nil)
	if _, err := n.Acquire(ctx, "g", "a/1"); !errors.Is(err, boom) || errors.Is(err, ErrContended) {
		t.Fatalf("Acquire with failing Get: %v", err)
	}
	st.set(nil, boom)
	if _, err := n.Acquire(ctx, "g", "a/1"); !errors.Is(err, boom) {
		t.Fatalf("Acquire with failing Put: %v", err)
	}
	if len(n.sl.Slept()) != 0 {
		t.Fatal("store errors must not be retried by Acquire")
	}
	st.set(nil, nil)
	ls := mustAcquire(t, n, "g", "a/1") // the local slot was freed

	st.set(nil, boom)
	if err := ls.Check(ctx); !errors.Is(err, boom) {
		t.Fatalf("Check with failing Put: %v", err)
	}
	st.set(boom, nil)
	if err := ls.Check(ctx); !errors.Is(err, boom) {
		t.Fatalf("Check with failing Get: %v", err)
	}
	st.set(nil, nil)
	if err := ls.Check(ctx); err != nil {
		t.Fatal(err)
	}

	st.set(boom, nil)
	if err := ls.Release(ctx); !errors.Is(err, boom) {
		t.Fatalf("Release with failing Get: %v", err)
	}
	if err := ls.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("Check after Release: %v", err)
	}
	st.set(nil, nil)
	if len(n.slots) != 0 {
		t.Fatal("failed Release kept the local slot")
	}
	mustRelease(t, ls) // retry succeeds
	if r := w.record("g"); r.Held {
		t.Fatalf("record %+v", r)
	}
	mustRelease(t, mustAcquire(t, n, "g", "a/1"))
	if len(n.slots) != 0 {
		t.Fatal("slot freed twice or leaked")
	}

	if _, err := n.Acquire(ctx, "", "a/1"); err == nil {
		t.Fatal("empty group accepted")
	}
}

func TestContextCancel(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()

	t.Run("local wait", func(t *testing.T) {
		n := w.node(nil, nil)
		held := mustAcquire(t, n, "g", "n/1")
		cctx, cancel := context.WithCancel(ctx)
		n.localWait = func(string) { cancel() }
		if _, err := n.Acquire(cctx, "g", "n/2"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire: %v", err)
		}
		n.localWait = nil
		mustRelease(t, held)
		if len(n.slots) != 0 {
			t.Fatalf("slots left: %v", n.slots)
		}
		if _, err := n.Acquire(cctx, "g", "n/2"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire with cancelled ctx: %v", err)
		}
	})

	t.Run("sleep", func(t *testing.T) {
		a := w.node(nil, nil)
		held := mustAcquire(t, a, "s", "a/1")
		asleep := make(chan struct{})
		b := w.node(nil, func(cfg *Config) {
			cfg.Sleep = func(ctx context.Context, _ time.Duration) error {
				close(asleep)
				<-ctx.Done()
				return ctx.Err()
			}
		})
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error)
		go func() {
			_, err := b.Acquire(cctx, "s", "b/1")
			done <- err
		}()
		<-asleep
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire: %v", err)
		}
		if len(b.slots) != 0 {
			t.Fatal("slot kept")
		}
		mustRelease(t, held)
	})

	t.Run("default sleep", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := sleep(cctx, time.Hour); !errors.Is(err, context.Canceled) {
			t.Fatalf("sleep: %v", err)
		}
		if err := sleep(ctx, time.Microsecond); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDefaults(t *testing.T) {
	c := New(state.NewMemoryStore(), Config{}).cfg
	if c.RetryBase != 500*time.Millisecond || c.MaxRetries != 3 || c.MaxAge != 60*time.Second ||
		c.WrittenMaxAge != 600*time.Second || c.Now == nil || c.Sleep == nil {
		t.Fatalf("defaults %+v", c)
	}
	c = New(state.NewMemoryStore(), Config{MaxAge: time.Minute, WrittenMaxAge: time.Second}).cfg
	if c.WrittenMaxAge != time.Minute {
		t.Fatalf("WrittenMaxAge %v below MaxAge", c.WrittenMaxAge)
	}
	if got := backoff(time.Second, 100); got <= 0 {
		t.Fatalf("backoff overflow %v", got)
	}
}

// A lock whose holder's process is gone (HolderAlive says so) is taken at
// once, even young and written: a dead holder cannot write under its token
// any more, and waiting would stall the group for the written max age.
func TestDeadHolderLockTakenAtOnce(t *testing.T) {
	w := newWorld(t)
	a := w.node(nil, nil)
	ctx := context.Background()
	old := mustAcquire(t, a, "g", "a/1")
	if err := old.Check(ctx); err != nil { // wrote
		t.Fatal(err)
	}
	alive := map[string]bool{"a": true, "b": true}
	b := w.node(nil, func(c *Config) {
		c.HolderAlive = func(holder string) bool { node, _, _ := strings.Cut(holder, "/"); return alive[node] }
	})
	if _, err := b.Acquire(ctx, "g", "b/1"); !errors.Is(err, ErrContended) {
		t.Fatalf("Acquire while the holder is alive: %v, want ErrContended", err)
	}
	alive["a"] = false // node a left the membership
	ls := mustAcquire(t, b, "g", "b/1")
	if ev := b.ev.last(); !ev.Stolen || ev.PrevHolder != "a/1" || ls.Token != 2 {
		t.Fatalf("event %+v, token %d", ev, ls.Token)
	}
}

// A lease whose Release could not reach the store (a broker outage) leaves
// the lock held and written; its own process takes it back at once, another
// process still waits for the written max age.
func TestOwnUnreleasedLockTakenBack(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, func(c *Config) { c.Node = "a" })
	b := w.node(nil, func(c *Config) { c.Node = "b"; c.MaxRetries = -1 })
	ctx := context.Background()
	old := unreleased(t, w, st, a, "a/1")
	w.clk.Advance(time.Minute) // past MaxAge, not WrittenMaxAge
	if _, err := b.Acquire(ctx, "g", "b/1"); !errors.Is(err, ErrContended) {
		t.Fatalf("another node took a written lock before WrittenMaxAge: %v", err)
	}
	ls := mustAcquire(t, a, "g", "a/2")
	if ev := a.ev.last(); ev.Kind != EventAcquired || !ev.Stolen || ev.PrevHolder != "a/1" || ls.Token != 2 {
		t.Fatalf("event %+v, token %d", ev, ls.Token)
	}
	if err := old.Check(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("old lease Check: %v", err)
	}
	mustRelease(t, ls)
}

// When another node is waiting for the group, the process that finds its own
// unreleased lock frees it for that waiter instead of taking it.
func TestOwnUnreleasedLockFreedForWaiter(t *testing.T) {
	w := newWorld(t)
	st := &countStore{MemoryStore: w.mem}
	a := w.node(st, func(c *Config) { c.Node = "a"; c.MaxRetries = -1 })
	b := w.node(nil, func(c *Config) { c.Node = "b" })
	ctx := context.Background()
	unreleased(t, w, st, a, "a/1")
	var errA error
	b.sl.hook = func(i int) {
		if i == 0 { // b has marked itself as the waiter
			_, errA = a.Acquire(ctx, "g", "a/2")
		}
	}
	ls := mustAcquire(t, b, "g", "b/1")
	if !errors.Is(errA, ErrContended) {
		t.Fatalf("a's Acquire while b waits: %v, want ErrContended", errA)
	}
	if slices.Index(a.ev.kinds(), EventReleased) < 0 || ls.Token != 2 || len(b.sl.Slept()) != 1 {
		t.Fatalf("a's events %v, b's token %d after %d sleeps", a.ev.kinds(), ls.Token, len(b.sl.Slept()))
	}
}

// unreleased leaves group g held and written by holder of node n, as a
// Release during a store outage does.
func unreleased(t *testing.T, w *world, st *countStore, n *node, holder string) *Lease {
	t.Helper()
	ctx := context.Background()
	ls := mustAcquire(t, n, "g", holder)
	if err := ls.Check(ctx); err != nil {
		t.Fatal(err)
	}
	st.set(errors.New("store down"), nil)
	if err := ls.Release(ctx); err == nil {
		t.Fatal("Release with a failing store succeeded")
	}
	st.set(nil, nil)
	if r := w.record("g"); !r.Held || !r.Wrote || r.Node != n.cfg.Node {
		t.Fatalf("record after the failed Release %+v", r)
	}
	return ls
}
