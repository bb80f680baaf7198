package state_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/virtufin/workmanager/internal/state"
)

// countingStore counts the Gets and GetManys that reach the memory store;
// failBulk makes its GetMany fail.
type countingStore struct {
	*state.MemoryStore
	gets, bulks atomic.Int32
	failBulk    bool
}

func (c *countingStore) Get(ctx context.Context, key string) (state.Item, error) {
	c.gets.Add(1)
	return c.MemoryStore.Get(ctx, key)
}

func (c *countingStore) GetMany(ctx context.Context, keys []string) ([]state.Result, error) {
	c.bulks.Add(1)
	if c.failBulk {
		return nil, errors.New("bulk read refused")
	}
	return c.MemoryStore.GetMany(ctx, keys)
}

func newCounting(t *testing.T, values map[string]string) (*countingStore, state.Store) {
	t.Helper()
	c := &countingStore{MemoryStore: state.NewMemoryStore()}
	for k, v := range values {
		if err := c.MemoryStore.Put(context.Background(), k, []byte(v), state.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return c, state.WithPrefetch(c)
}

// Each key read ahead is answered once from the bulk read, an absent one
// as absent; a second read, a key not read ahead and a context without a
// read-ahead go to the store.
func TestPrefetchAnswersEachKeyOnceFromOneBulkRead(t *testing.T) {
	c, s := newCounting(t, map[string]string{"a": "1", "b": "2"})
	ctx := state.Prefetch(context.Background(), s, []string{"a", "b", "absent"})
	for k, want := range map[string]string{"a": "1", "b": "2"} {
		if it, err := s.Get(ctx, k); err != nil || string(it.Value) != want || it.ETag == "" {
			t.Fatalf("%s: %q %q %v", k, it.Value, it.ETag, err)
		}
	}
	if _, err := s.Get(ctx, "absent"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("absent key: %v", err)
	}
	if n, b := c.gets.Load(), c.bulks.Load(); n != 0 || b != 1 {
		t.Fatalf("%d Gets and %d bulk reads reached the store; want 0 and 1", n, b)
	}
	if it, err := s.Get(ctx, "a"); err != nil || string(it.Value) != "1" || c.gets.Load() != 1 {
		t.Fatalf("second read of a: %q %v, %d Gets", it.Value, err, c.gets.Load())
	}
	s.Get(ctx, "c")
	s.Get(context.Background(), "b")
	if n := c.gets.Load(); n != 3 {
		t.Fatalf("%d Gets reached the store; want 3", n)
	}
}

// A context never reads back a value older than its own write, and a
// conditional write over a value read ahead that another writer changed
// meanwhile fails its condition: UpdateJSON reads again and loses
// neither change.
func TestPrefetchedValuesNeverHideAWrite(t *testing.T) {
	c, s := newCounting(t, map[string]string{"k": "1", "j": `{"n":1}`})
	ctx := state.Prefetch(context.Background(), s, []string{"k", "j"})
	if err := s.Put(ctx, "k", []byte("2"), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if it, err := s.Get(ctx, "k"); err != nil || string(it.Value) != "2" {
		t.Fatalf("read after own write: %q %v", it.Value, err)
	}
	// Another writer changes j after the read-ahead.
	if err := state.UpdateJSON(context.Background(), c.MemoryStore, "j", func(v *map[string]int) bool { (*v)["other"] = 1; return true }); err != nil {
		t.Fatal(err)
	}
	if err := state.UpdateJSON(ctx, s, "j", func(v *map[string]int) bool { (*v)["mine"] = 1; return true }); err != nil {
		t.Fatal(err)
	}
	got, _, err := state.GetJSON[map[string]int](context.Background(), c.MemoryStore, "j")
	if err != nil || got["n"] != 1 || got["other"] != 1 || got["mine"] != 1 {
		t.Fatalf("j after both writers: %v %v", got, err)
	}
}

// A bulk read that fails leaves every Get to the store.
func TestAFailedReadAheadLeavesTheReadsToTheStore(t *testing.T) {
	c, s := newCounting(t, map[string]string{"a": "1"})
	c.failBulk = true
	ctx := state.Prefetch(context.Background(), s, []string{"a"})
	if it, err := s.Get(ctx, "a"); err != nil || string(it.Value) != "1" || c.gets.Load() != 1 {
		t.Fatalf("a: %q %v, %d Gets", it.Value, err, c.gets.Load())
	}
}

// A read-ahead made in the context of another keeps the other's keys
// answered too.
func TestNestedReadAheadsAreBothAnswered(t *testing.T) {
	c, s := newCounting(t, map[string]string{"a": "1", "b": "2"})
	ctx := state.Prefetch(context.Background(), s, []string{"a"})
	ctx = state.Prefetch(ctx, s, []string{"b"})
	for k, want := range map[string]string{"a": "1", "b": "2"} {
		if it, err := s.Get(ctx, k); err != nil || string(it.Value) != want {
			t.Fatalf("%s: %q %v", k, it.Value, err)
		}
	}
	if n, b := c.gets.Load(), c.bulks.Load(); n != 0 || b != 2 {
		t.Fatalf("%d Gets and %d bulk reads reached the store; want 0 and 2", n, b)
	}
}
