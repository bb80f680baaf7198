package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// faulty wraps a store: fail decides, per call, whether it fails and with
// what ("get", "put" or "delete" and the key).
type faulty struct {
	state.Store
	mu   sync.Mutex
	fail func(op, key string) error
}

func (f *faulty) check(op, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail == nil {
		return nil
	}
	return f.fail(op, key)
}

func (f *faulty) Get(ctx context.Context, key string) (state.Item, error) {
	if err := f.check("get", key); err != nil {
		return state.Item{}, err
	}
	return f.Store.Get(ctx, key)
}

func (f *faulty) Put(ctx context.Context, key string, v []byte, o state.PutOptions) error {
	if err := f.check("put", key); err != nil {
		return err
	}
	return f.Store.Put(ctx, key, v, o)
}

func (f *faulty) Delete(ctx context.Context, key, etag string) error {
	if err := f.check("delete", key); err != nil {
		return err
	}
	return f.Store.Delete(ctx, key, etag)
}

func entry(worker, id, reason string, at int64) Entry {
	return Entry{Worker: worker, Topic: "orders", Reason: reason, Attempts: 3, Error: "boom", EventID: id, Source: "shop",
		Event: json.RawMessage(fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"shop","type":"order.placed"}`, id)), AtMS: at}
}

func ids(es []Entry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.EventID)
	}
	return out
}

func mustList(t *testing.T, s *Store, worker string, f Filter, limit int) []string {
	t.Helper()
	es, err := s.List(context.Background(), worker, f, limit)
	if err != nil {
		t.Fatal(err)
	}
	return ids(es)
}

func eq(t *testing.T, got, want []string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestAddListFilterLimitRemove(t *testing.T) {
	ctx := context.Background()
	s := NewStore(state.NewMemoryStore(), 0)
	for i, r := range []string{"worker_failed", "timeout", "worker_failed", "panic"} {
		if err := s.Add(ctx, entry("w1", fmt.Sprint("e", i), r, int64(1000+i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Add(ctx, entry("w2", "x", "timeout", 1)); err != nil {
		t.Fatal(err)
	}
	eq(t, mustList(t, s, "w1", Filter{}, 0), []string{"e0", "e1", "e2", "e3"})
	eq(t, mustList(t, s, "w1", Filter{}, 2), []string{"e0", "e1"})
	eq(t, mustList(t, s, "w1", Filter{Reason: "worker_failed"}, 0), []string{"e0", "e2"})
	eq(t, mustList(t, s, "w1", Filter{Reason: "worker_failed"}, 1), []string{"e0"})
	eq(t, mustList(t, s, "w1", Filter{EventIDs: []string{"e3", "e1", "nope"}}, 0), []string{"e1", "e3"})
	eq(t, mustList(t, s, "w2", Filter{}, 0), []string{"x"})
	eq(t, mustList(t, s, "w3", Filter{}, 0), nil)
	if n, err := s.Count(ctx, "w1", Filter{Reason: "worker_failed"}); err != nil || n != 2 {
		t.Fatalf("count: %d %v", n, err)
	}

	es, err := s.List(ctx, "w1", Filter{EventIDs: []string{"e1"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := entry("w1", "e1", "timeout", 1001)
	if got := es[0]; got.Topic != want.Topic || got.Attempts != 3 || got.Error != "boom" || got.Source != "shop" ||
		string(got.Event) != string(want.Event) || got.AtMS != 1001 {
		t.Fatalf("entry read back as %+v", got)
	}
	if err := s.Remove(ctx, "w1", es[0]); err != nil {
		t.Fatal(err)
	}
	eq(t, mustList(t, s, "w1", Filter{}, 0), []string{"e0", "e2", "e3"})
	if err := s.Remove(ctx, "w1", es[0]); err != nil {
		t.Fatalf("removing again: %v", err)
	}
	if err := s.Remove(ctx, "nobody", es[0]); err != nil {
		t.Fatalf("removing from an absent index: %v", err)
	}
}

// Removing the last entry deletes the index too: nothing is left behind.
func TestRemoveLastLeavesNothing(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	s := NewStore(st, 0)
	e := entry("w1", "e0", "timeout", 1)
	if err := s.Add(ctx, e); err != nil {
		t.Fatal(err)
	}
	if len(st.Keys()) != 2 {
		t.Fatalf("keys: %v", st.Keys())
	}
	if err := s.Remove(ctx, "w1", e); err != nil {
		t.Fatal(err)
	}
	if keys := st.Keys(); len(keys) != 0 {
		t.Fatalf("left behind: %v", keys)
	}
	if err := s.Add(ctx, e); err != nil {
		t.Fatalf("adding after the index was deleted: %v", err)
	}
	eq(t, mustList(t, s, "w1", Filter{}, 0), []string{"e0"})
}

func TestDuplicateAddKeepsOneEntry(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	s := NewStore(st, 0)
	for _, e := range []Entry{entry("w1", "a", "timeout", 1), entry("w1", "b", "timeout", 2), entry("w1", "a", "worker_failed", 3)} {
		if err := s.Add(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	eq(t, mustList(t, s, "w1", Filter{}, 0), []string{"b", "a"})
	es, _ := s.List(ctx, "w1", Filter{EventIDs: []string{"a"}}, 0)
	if len(es) != 1 || es[0].Reason != "worker_failed" || es[0].AtMS != 3 {
		t.Fatalf("duplicate not overwritten: %+v", es)
	}
	if len(st.Keys()) != 3 {
		t.Fatalf("keys: %v", st.Keys())
	}
	// The same id from another source is another message.
	other := entry("w1", "a", "timeout", 4)
	other.Source = "elsewhere"
	if err := s.Add(ctx, other); err != nil {
		t.Fatal(err)
	}
	eq(t, mustList(t, s, "w1", Filter{}, 0), []string{"b", "a", "a"})
}

func TestIndexCapDropsOldest(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	s := NewStore(st, 0)
	s.maxIndex = 3
	for i := range 5 {
		if err := s.Add(ctx, entry("w1", fmt.Sprint("e", i), "timeout", int64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	eq(t, mustList(t, s, "w1", Filter{}, 0), []string{"e2", "e3", "e4"})
	if n := len(st.Keys()); n != 4 { // three entries and the index
		t.Fatalf("dropped entries left behind: %v", st.Keys())
	}
}

// Entries no worker could take are kept per topic, without an event.
func TestTopicOwnedEntries(t *testing.T) {
	ctx := context.Background()
	s := NewStore(state.NewMemoryStore(), 0)
	e := Entry{Topic: "orders", Reason: "undecodable", EventID: "", Source: "", Raw: []byte("\x00garbage"), AtMS: 5}
	if err := s.Add(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(ctx, entry("w1", "ok", "timeout", 6)); err != nil {
		t.Fatal(err)
	}
	es, err := s.List(ctx, TopicOwner("orders"), Filter{}, 0)
	if err != nil || len(es) != 1 || string(es[0].Raw) != "\x00garbage" || es[0].Worker != "" {
		t.Fatalf("topic entries: %+v %v", es, err)
	}
	eq(t, mustList(t, s, TopicOwner("orders"), Filter{Replayable: true}, 0), nil)
	if n, _ := s.Count(ctx, TopicOwner("orders"), Filter{Replayable: true}); n != 0 {
		t.Fatalf("count replayable: %d", n)
	}
	eq(t, mustList(t, s, "w1", Filter{Replayable: true}, 0), []string{"ok"})
	if err := s.Add(ctx, Entry{Reason: "undecodable"}); err == nil {
		t.Fatal("an entry with neither worker nor topic was stored")
	}
}

// Expired entries are not listed and are dropped from the index by the next
// Add; a reader constructed without a TTL honours the one in the index.
func TestTTL(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	now := time.UnixMilli(1_000_000)
	w := NewStore(st, time.Minute)
	w.now = func() time.Time { return now }
	r := NewStore(st, 0)
	r.now = func() time.Time { return now }
	if err := w.Add(ctx, entry("w1", "old", "timeout", now.UnixMilli())); err != nil {
		t.Fatal(err)
	}
	now = now.Add(30 * time.Second)
	if err := w.Add(ctx, entry("w1", "new", "timeout", 0)); err != nil {
		t.Fatal(err)
	}
	eq(t, mustList(t, r, "w1", Filter{}, 0), []string{"old", "new"})
	now = now.Add(45 * time.Second)
	eq(t, mustList(t, r, "w1", Filter{}, 0), []string{"new"})
	if n, _ := r.Count(ctx, "w1", Filter{}); n != 1 {
		t.Fatalf("count: %d", n)
	}
	if err := w.Add(ctx, entry("w1", "newer", "timeout", 0)); err != nil {
		t.Fatal(err)
	}
	x, _, err := w.read(ctx, "w1")
	if err != nil || len(x.Entries) != 2 || x.TTLMS != time.Minute.Milliseconds() {
		t.Fatalf("index: %+v %v", x, err)
	}
}

// Adds racing on one index lose nothing.
func TestConcurrentAddsLoseNothing(t *testing.T) {
	ctx := context.Background()
	s := NewStore(state.NewMemoryStore(), 0)
	const writers, each = 12, 8
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				errs <- s.Add(ctx, entry("w1", fmt.Sprintf("g%d-%d", g, i), "timeout", 0))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := s.Count(ctx, "w1", Filter{}); n != writers*each {
		t.Fatalf("%d entries indexed, want %d", n, writers*each)
	}
	// And removes racing with adds.
	es, _ := s.List(ctx, "w1", Filter{}, 0)
	wg = sync.WaitGroup{}
	for _, e := range es[:writers] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Remove(ctx, "w1", e); err != nil {
				t.Error(err)
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Add(ctx, entry("w1", "more-"+e.EventID, "timeout", 0)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n, _ := s.Count(ctx, "w1", Filter{}); n != writers*each {
		t.Fatalf("%d entries indexed after removes and adds, want %d", n, writers*each)
	}
}

// A conflicting write between read and write is retried; one that never
// stops conflicting ends in ErrConflict.
func TestConflictsAreRetriedBounded(t *testing.T) {
	ctx := context.Background()
	mem := state.NewMemoryStore()
	f := &faulty{Store: mem}
	s := NewStore(f, 0)
	if err := s.Add(ctx, entry("w1", "a", "timeout", 1)); err != nil {
		t.Fatal(err)
	}
	conflicts := 3
	f.fail = func(op, key string) error {
		if op == "put" && strings.HasPrefix(key, indexPrefix) && conflicts > 0 {
			conflicts--
			return fmt.Errorf("put %s: %w", key, state.ErrConflict)
		}
		return nil
	}
	if err := s.Add(ctx, entry("w1", "b", "timeout", 2)); err != nil {
		t.Fatal(err)
	}
	eq(t, mustList(t, s, "w1", Filter{}, 0), []string{"a", "b"})

	f.fail = func(op, key string) error {
		if op == "put" && strings.HasPrefix(key, indexPrefix) {
			return fmt.Errorf("put %s: %w", key, state.ErrConflict)
		}
		return nil
	}
	if err := s.Add(ctx, entry("w1", "c", "timeout", 3)); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("endless conflicts: %v", err)
	}
}

// Store failures are returned and leave the index as it was.
func TestStoreFailures(t *testing.T) {
	ctx := context.Background()
	down := errors.New("state store unavailable")
	f := &faulty{Store: state.NewMemoryStore()}
	s := NewStore(f, 0)
	a := entry("w1", "a", "timeout", 1)
	if err := s.Add(ctx, a); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		fail func(op, key string) error
		run  func() error
	}{
		"add: entry put": {func(op, key string) error {
			if op == "put" && strings.HasPrefix(key, entryPrefix) {
				return down
			}
			return nil
		}, func() error { return s.Add(ctx, entry("w1", "b", "timeout", 2)) }},
		"add: index put": {func(op, key string) error {
			if op == "put" && strings.HasPrefix(key, indexPrefix) {
				return down
			}
			return nil
		}, func() error { return s.Add(ctx, entry("w1", "b", "timeout", 2)) }},
		"remove: index read": {func(op, key string) error {
			if op == "get" && strings.HasPrefix(key, indexPrefix) {
				return down
			}
			return nil
		}, func() error { return s.Remove(ctx, "w1", a) }},
		"list: entry read": {func(op, key string) error {
			if op == "get" && strings.HasPrefix(key, entryPrefix) {
				return down
			}
			return nil
		}, func() error { _, err := s.List(ctx, "w1", Filter{}, 0); return err }},
	} {
		t.Run(name, func(t *testing.T) {
			f.mu.Lock()
			f.fail = c.fail
			f.mu.Unlock()
			err := c.run()
			f.mu.Lock()
			f.fail = nil
			f.mu.Unlock()
			if !errors.Is(err, down) {
				t.Fatalf("got %v, want the store's error", err)
			}
			eq(t, mustList(t, s, "w1", Filter{}, 0), []string{"a"})
		})
	}
	// An entry whose delete failed is gone from the index; removing it
	// again deletes it.
	f.fail = func(op, key string) error {
		if op == "delete" && strings.HasPrefix(key, entryPrefix) {
			return down
		}
		return nil
	}
	if err := s.Remove(ctx, "w1", a); !errors.Is(err, down) {
		t.Fatalf("remove with a failing delete: %v", err)
	}
	f.fail = nil
	eq(t, mustList(t, s, "w1", Filter{}, 0), nil)
	if err := s.Remove(ctx, "w1", a); err != nil {
		t.Fatal(err)
	}
}
