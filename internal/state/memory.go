package state

import (
	"context"
	"fmt"
	"strconv"
	"sync"
)

// MemoryStore is an in-memory Store for unit tests. TTLs are ignored.
type MemoryStore struct {
	mu   sync.Mutex
	data map[string]Item
	seq  int
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore { return &MemoryStore{data: map[string]Item{}} }

// Get implements Store.
func (m *MemoryStore) Get(_ context.Context, key string) (Item, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it, ok := m.data[key]
	if !ok {
		return Item{}, fmt.Errorf("state get %q: %w", key, ErrNotFound)
	}
	return Item{Value: append([]byte(nil), it.Value...), ETag: it.ETag}, nil
}

// Put implements Store.
func (m *MemoryStore) Put(_ context.Context, key string, value []byte, opts PutOptions) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur, exists := m.data[key]
	switch {
	case opts.IfAbsent && opts.ETag == "" && exists:
		return fmt.Errorf("state put %q: %w", key, ErrConflict)
	case opts.ETag != "" && (!exists || cur.ETag != opts.ETag):
		return fmt.Errorf("state put %q: %w", key, ErrConflict)
	}
	m.seq++
	m.data[key] = Item{Value: append([]byte(nil), value...), ETag: strconv.Itoa(m.seq)}
	return nil
}

// Delete implements Store.
func (m *MemoryStore) Delete(_ context.Context, key, etag string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur, ok := m.data[key]; ok && etag != "" && cur.ETag != etag {
		return fmt.Errorf("state delete %q: %w", key, ErrConflict)
	}
	delete(m.data, key)
	return nil
}

// Keys returns the stored keys (for tests).
func (m *MemoryStore) Keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.data))
	for k := range m.data {
		out = append(out, k)
	}
	return out
}

// GetMany implements Bulk.
func (m *MemoryStore) GetMany(ctx context.Context, keys []string) ([]Result, error) {
	out := make([]Result, len(keys))
	for i, k := range keys {
		it, err := m.Get(ctx, k)
		out[i] = Result{Item: it, Err: err}
	}
	return out, nil
}

// PutMany implements Bulk like state.redis's transactions: every write is
// tried, a failed one does not undo the others, and the first error is
// returned.
func (m *MemoryStore) PutMany(ctx context.Context, writes []Write) error {
	var first error
	for _, w := range writes {
		if err := m.Put(ctx, w.Key, w.Value, w.Opts); err != nil && first == nil {
			first = err
		}
	}
	return first
}
