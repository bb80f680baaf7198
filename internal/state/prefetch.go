package state

import (
	"context"
	"errors"
	"sync"
)

// Read-ahead: a caller that knows which keys the next steps of its work
// will read (a lifecycle change's history keys, its placement's keys, a
// code body's page of the collection index) starts reading
// them all at once, in one bulk read, beside the steps before (Prefetch);
// the store WithPrefetch wraps then answers each of those keys' first Get
// in that context from the bulk read instead of a round trip of its own.
// Every write a read leads to is conditional on the ETag read, so a value
// read a little earlier is as safe as one read later: a write over a key
// changed meanwhile fails its condition and its caller reads again (that
// read, and any Get after the first, goes to the store). A Put or Delete
// of a key through the wrapper drops its value read ahead, so a context
// never reads back a value older than its own write.

// WithPrefetch wraps s so that a Get in a context made by Prefetch takes
// the value read ahead. It keeps s's bulk operations (Bulk) when s has
// them.
func WithPrefetch(s Store) Store {
	p := &prefetching{Store: s}
	if b, ok := s.(Bulk); ok {
		return &prefetchingBulk{prefetching: p, bulk: b}
	}
	return p
}

// Prefetch starts reading keys from s, a store WithPrefetch made (one
// GetMany when its store is a Bulk, else one Get each, at once), and
// returns a context whose Gets of those keys through s take what it read:
// each key once, waiting for the read if it is still under way. A read
// that failed as a whole leaves the Gets to the store; for any other s it
// reads nothing and returns ctx.
func Prefetch(ctx context.Context, s Store, keys []string) context.Context {
	if len(keys) == 0 {
		return ctx
	}
	p, ok := s.(interface{ base() Store })
	if !ok {
		return ctx // no Get of s would take what it read
	}
	s = p.base()
	r := &readAhead{done: make(chan struct{}), want: make(map[string]bool, len(keys))}
	r.parent, _ = ctx.Value(readAheadKey{}).(*readAhead) // read ahead before: still answered
	for _, k := range keys {
		r.want[k] = true
	}
	go func() {
		defer close(r.done)
		r.got, r.err = getAll(ctx, s, keys)
	}()
	return context.WithValue(ctx, readAheadKey{}, r)
}

// getAll reads keys from s in one call when s is a Bulk, else each at
// once, and returns one Result per key.
func getAll(ctx context.Context, s Store, keys []string) (map[string]Result, error) {
	out := make(map[string]Result, len(keys))
	if b, ok := s.(Bulk); ok {
		res, err := b.GetMany(ctx, keys)
		if err != nil {
			return nil, err
		}
		for i, k := range keys {
			out[k] = res[i]
		}
		return out, nil
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			it, err := s.Get(ctx, k)
			mu.Lock()
			out[k] = Result{Item: it, Err: err}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out, nil
}

type readAheadKey struct{}

// readAhead is one Prefetch: the keys it reads, and once done what it
// read; parent is the one of the context it was made in (nil: none).
type readAhead struct {
	parent *readAhead
	done   chan struct{}
	got    map[string]Result
	err    error

	mu   sync.Mutex
	want map[string]bool // keys not taken nor dropped yet
}

// take returns key's value read ahead in ctx, once; ok false when there
// is none (not read ahead, taken or dropped already, the read failed).
func take(ctx context.Context, key string) (Item, error, bool) {
	r, _ := ctx.Value(readAheadKey{}).(*readAhead)
	for r != nil && !r.claim(key) {
		r = r.parent
	}
	if r == nil {
		return Item{}, nil, false
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return Item{}, nil, false
	}
	res, ok := r.got[key]
	if r.err != nil || !ok || (res.Err != nil && !errors.Is(res.Err, ErrNotFound)) {
		return Item{}, nil, false
	}
	return res.Item, res.Err, true
}

// drop forgets key's value read ahead in ctx (written through the store).
func drop(ctx context.Context, key string) {
	for r, _ := ctx.Value(readAheadKey{}).(*readAhead); r != nil; r = r.parent {
		r.claim(key)
	}
}

// claim takes key out of the keys still to be handed out, reporting
// whether it was there.
func (r *readAhead) claim(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.want[key] {
		return false
	}
	delete(r.want, key)
	return true
}

// prefetching is WithPrefetch's store.
type prefetching struct{ Store }

func (p *prefetching) base() Store { return p.Store }

// Get implements Store: the value read ahead for ctx, else the store's.
func (p *prefetching) Get(ctx context.Context, key string) (Item, error) {
	if it, err, ok := take(ctx, key); ok {
		return it, err
	}
	return p.Store.Get(ctx, key)
}

// Put implements Store.
func (p *prefetching) Put(ctx context.Context, key string, value []byte, opts PutOptions) error {
	drop(ctx, key)
	return p.Store.Put(ctx, key, value, opts)
}

// Delete implements Store.
func (p *prefetching) Delete(ctx context.Context, key, etag string) error {
	drop(ctx, key)
	return p.Store.Delete(ctx, key, etag)
}

// prefetchingBulk is WithPrefetch's store over a Bulk.
type prefetchingBulk struct {
	*prefetching
	bulk Bulk
}

// GetMany implements Bulk (straight to the store).
func (p *prefetchingBulk) GetMany(ctx context.Context, keys []string) ([]Result, error) {
	return p.bulk.GetMany(ctx, keys)
}

// PutMany implements Bulk.
func (p *prefetchingBulk) PutMany(ctx context.Context, writes []Write) error {
	for _, w := range writes {
		drop(ctx, w.Key)
	}
	return p.bulk.PutMany(ctx, writes)
}
