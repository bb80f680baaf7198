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
