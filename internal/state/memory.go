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
	// Versions, set before use, makes its ETags versions as state.redis
	// keeps them (Versioned): "1" for a key created, one more for each
	// write of it. Otherwise an ETag is a sequence number of the store's.
	Versions bool
}

// NextETag implements Versioned when Versions is set.
func (m *MemoryStore) NextETag(etag string) (string, bool) {
	if !m.Versions {
		return "", false
	}
	return nextVersion(etag)
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
	etag := strconv.Itoa(m.seq)
	if m.Versions {
		etag, _ = nextVersion(cur.ETag)
	}
	m.data[key] = Item{Value: append([]byte(nil), value...), ETag: etag}
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
