package state_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/virtufin/workmanager/internal/state"
)

// bulkCounter counts the calls a Batching makes and can hold a call until
// released, so that the next callers pile up into one batch.
type bulkCounter struct {
	*state.MemoryStore
	gets, getManys, puts, putManys atomic.Int32
	keysPerGetMany                 atomic.Int32
	hold                           chan struct{} // when set, the first call of any kind waits on it
	held                           atomic.Bool
	failPutMany                    error
}

func (s *bulkCounter) wait() {
	if s.hold != nil && s.held.CompareAndSwap(false, true) {
		<-s.hold
	}
}

func (s *bulkCounter) Get(ctx context.Context, key string) (state.Item, error) {
	s.gets.Add(1)
	s.wait()
	return s.MemoryStore.Get(ctx, key)
}

func (s *bulkCounter) GetMany(ctx context.Context, keys []string) ([]state.Result, error) {
	s.getManys.Add(1)
	s.keysPerGetMany.Store(int32(len(keys)))
	s.wait()
	return s.MemoryStore.GetMany(ctx, keys)
}

func (s *bulkCounter) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	s.puts.Add(1)
	s.wait()
	return s.MemoryStore.Put(ctx, key, value, opts)
}

func (s *bulkCounter) PutMany(ctx context.Context, writes []state.Write) error {
	s.putManys.Add(1)
	s.wait()
	if s.failPutMany != nil {
		// Like a store that fails half-way: the first half is applied.
		_ = s.MemoryStore.PutMany(ctx, writes[:len(writes)/2])
		return s.failPutMany
	}
	return s.MemoryStore.PutMany(ctx, writes)
}

// concurrently runs f(i) for i < n, the first call alone (held by the store)
// and the others while it is held, then releases it.
func concurrently(t *testing.T, st *bulkCounter, b *state.Batching, n int, f func(i int) error) []error {
	t.Helper()
	st.hold = make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); errs[0] = f(0) }()
	for !st.held.Load() {
		runtime.Gosched() // the first call is in flight (and held)
	}
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i) }()
	}
	for b.Queued() < n-1 {
		runtime.Gosched()
	}
	close(st.hold)
	wg.Wait()
	return errs
}

func TestBatchingCoalescesConcurrentGets(t *testing.T) {
	st := &bulkCounter{MemoryStore: state.NewMemoryStore()}
	ctx := context.Background()
	for i := range 20 {
		if err := st.MemoryStore.Put(ctx, fmt.Sprint("k", i), []byte(fmt.Sprint("v", i)), state.PutOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	b := state.NewBatching(st, 0)
	got := make([]string, 41)
	errs := concurrently(t, st, b, 41, func(i int) error {
		it, err := b.Get(ctx, fmt.Sprint("k", i%21)) // k20 is absent; some keys twice
		got[i] = string(it.Value)
		return err
	})
	for i, err := range errs {
		switch {
		case i%21 == 20:
			if !errors.Is(err, state.ErrNotFound) {
				t.Fatalf("get of the absent key: %v", err)
			}
		case err != nil || got[i] != fmt.Sprint("v", i%21):
			t.Fatalf("get %d = %q, %v", i, got[i], err)
		}
	}
	// The first Get went alone; the 40 queued behind it went as one batch
	// of their 21 distinct keys.
	if st.gets.Load() != 1 || st.getManys.Load() != 1 || st.keysPerGetMany.Load() != 21 {
		t.Fatalf("gets %d, bulk gets %d of %d keys; want 1, 1 of 21", st.gets.Load(), st.getManys.Load(), st.keysPerGetMany.Load())
	}
}

func TestBatchingPutsKeepTheirPreconditions(t *testing.T) {
	st := &bulkCounter{MemoryStore: state.NewMemoryStore()}
	ctx := context.Background()
	if err := st.MemoryStore.Put(ctx, "taken", []byte("old"), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	b := state.NewBatching(st, 0)
	errs := concurrently(t, st, b, 11, func(i int) error {
		if i == 5 { // a create of a key that exists: its own conflict
			return b.Put(ctx, "taken", []byte("new"), state.PutOptions{IfAbsent: true})
		}
		return b.Put(ctx, fmt.Sprint("k", i), []byte(fmt.Sprint("v", i)), state.PutOptions{IfAbsent: true})
	})
	for i, err := range errs {
		if i == 5 {
			if !errors.Is(err, state.ErrConflict) {
				t.Fatalf("create of an existing key in a batch: %v, want ErrConflict", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if it, err := st.MemoryStore.Get(ctx, fmt.Sprint("k", i)); err != nil || string(it.Value) != fmt.Sprint("v", i) {
			t.Fatalf("k%d = %q, %v", i, it.Value, err)
		}
	}
	if it, _ := st.MemoryStore.Get(ctx, "taken"); string(it.Value) != "old" {
		t.Fatalf("the conflicting create overwrote the key: %q", it.Value)
	}
	// One alone, one batch of 10; the batch failed on "taken", was read
	// back, and only "taken" was retried alone.
	if st.putManys.Load() != 1 || st.puts.Load() != 2 || st.getManys.Load() != 1 {
		t.Fatalf("puts %d, bulk puts %d, read-backs %d; want 2, 1, 1", st.puts.Load(), st.putManys.Load(), st.getManys.Load())
	}
}

// A batch that fails half-way (as a store error can) is settled write by
// write: the applied ones succeed, the others are retried alone.
func TestBatchingSettlesAFailedBatch(t *testing.T) {
	st := &bulkCounter{MemoryStore: state.NewMemoryStore(), failPutMany: errors.New("connection reset")}
	ctx := context.Background()
	b := state.NewBatching(st, 0)
	errs := concurrently(t, st, b, 9, func(i int) error {
		return b.Put(ctx, fmt.Sprint("k", i), []byte(fmt.Sprint("v", i)), state.PutOptions{IfAbsent: true})
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if it, err := st.MemoryStore.Get(ctx, fmt.Sprint("k", i)); err != nil || string(it.Value) != fmt.Sprint("v", i) {
			t.Fatalf("k%d = %q, %v", i, it.Value, err)
		}
	}
	// 1 alone + 4 of the 8 batched were not applied: 5 single puts.
	if st.puts.Load() != 5 {
		t.Fatalf("single puts %d, want 5", st.puts.Load())
	}
}

func TestBatchingCallerCancelReturns(t *testing.T) {
	st := &bulkCounter{MemoryStore: state.NewMemoryStore(), hold: make(chan struct{})}
	defer close(st.hold)
	b := state.NewBatching(st, 0)
	go func() { _, _ = b.Get(context.Background(), "a") }()
	for !st.held.Load() {
		runtime.Gosched()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Get(ctx, "b"); !errors.Is(err, context.Canceled) {
		t.Fatalf("queued Get with a cancelled context: %v", err)
	}
}
