package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/virtufin/workmanager/internal/batch"
)

// Bulk is implemented by stores that read or write several keys in one
// round trip.
type Bulk interface {
	Store
	// GetMany returns one Result per key, in order; an absent key's Err
	// wraps ErrNotFound. The error is for the call as a whole.
	GetMany(ctx context.Context, keys []string) ([]Result, error)
	// PutMany applies the writes, each with its own preconditions. It is
	// not all-or-nothing: after an error any subset of the writes may have
	// been applied (state.redis runs a transaction without rollback), and
	// the caller finds out by reading.
	PutMany(ctx context.Context, writes []Write) error
}

// Result is one key of a GetMany.
type Result struct {
	Item
	Err error
}

// Write is one write of a PutMany.
type Write struct {
	Key   string
	Value []byte
	Opts  PutOptions
}

// Batching is a Store that coalesces concurrent Gets into one GetMany and
// concurrent Puts into one PutMany on a Bulk store: while one batch is in
// flight the next callers queue, and the queue goes out as the next batch
// (at most MaxBatch keys). A caller alone waits for nothing more than its
// own call; under load, the cost of a round trip (mostly daprd's per-call
// gRPC work, see BenchmarkDaprStateCost) is shared by the batch.
//
// A batch of writes that fails is settled per write: the keys are read back,
// a write whose exact value is stored counts as applied, and the others are
// retried one by one, which gives each its own precise answer (ErrConflict
// or not). Deletes are not batched.
type Batching struct {
	st      Bulk
	timeout time.Duration
	gets    batch.Coalescer[getReq]
	puts    batch.Coalescer[putReq]
}

// MaxBatch bounds the keys of one batch.
const MaxBatch = 64

// NewBatching batches the Gets and Puts made on st; timeout bounds one
// batch (0: 30s).
func NewBatching(st Bulk, timeout time.Duration) *Batching {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	b := &Batching{st: st, timeout: timeout}
	b.gets = batch.Coalescer[getReq]{Run: b.getBatch, Max: MaxBatch}
	b.puts = batch.Coalescer[putReq]{Run: b.putBatch, Max: MaxBatch}
	return b
}

type getReq struct {
	key  string
	res  Result
	done chan struct{}
}

type putReq struct {
	w    Write
	err  error // nil: applied; errRetryAlone: to be retried on its own
	done chan struct{}
}

var errRetryAlone = errors.New("state: batch write not applied")

// Get implements Store.
func (b *Batching) Get(ctx context.Context, key string) (Item, error) {
	r := &getReq{key: key, done: make(chan struct{})}
	b.gets.Add(r)
	select {
	case <-r.done:
		return r.res.Item, r.res.Err
	case <-ctx.Done():
		return Item{}, fmt.Errorf("state get %q: %w", key, ctx.Err())
	}
}

// Put implements Store.
func (b *Batching) Put(ctx context.Context, key string, value []byte, opts PutOptions) error {
	r := &putReq{w: Write{Key: key, Value: value, Opts: opts}, done: make(chan struct{})}
	b.puts.Add(r)
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("state put %q: %w", key, ctx.Err())
	}
	if errors.Is(r.err, errRetryAlone) {
		return b.st.Put(ctx, key, value, opts)
	}
	return r.err
}

// Delete implements Store.
func (b *Batching) Delete(ctx context.Context, key, etag string) error {
	return b.st.Delete(ctx, key, etag)
}

func (b *Batching) getBatch(reqs []*getReq) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	defer settled(reqs, func(r *getReq) chan struct{} { return r.done })
	if len(reqs) == 1 {
		it, err := b.st.Get(ctx, reqs[0].key)
		reqs[0].res = Result{Item: it, Err: err}
		return
	}
	keys, index := distinct(reqs, func(r *getReq) string { return r.key })
	res, err := b.st.GetMany(ctx, keys)
	for _, r := range reqs {
		if err != nil {
			r.res.Err = err
			continue
		}
		r.res = res[index[r.key]]
	}
}

func (b *Batching) putBatch(reqs []*putReq) {
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	defer settled(reqs, func(r *putReq) chan struct{} { return r.done })
	if len(reqs) == 1 {
		reqs[0].err = b.st.Put(ctx, reqs[0].w.Key, reqs[0].w.Value, reqs[0].w.Opts)
		return
	}
	writes := make([]Write, len(reqs))
	for i, r := range reqs {
		writes[i] = r.w
	}
	if err := b.st.PutMany(ctx, writes); err == nil {
		return
	}
	// Which writes were applied? Read them back.
	keys, index := distinct(reqs, func(r *putReq) string { return r.w.Key })
	res, err := b.st.GetMany(ctx, keys)
	for _, r := range reqs {
		switch {
		case err != nil:
			r.err = err
		case res[index[r.w.Key]].Err == nil && bytes.Equal(res[index[r.w.Key]].Value, r.w.Value):
			r.err = nil
		default:
			r.err = errRetryAlone
		}
	}
}

// settled tells every caller of a batch that its request is answered.
func settled[T any](reqs []*T, done func(*T) chan struct{}) {
	for _, r := range reqs {
		close(done(r))
	}
}

// distinct lists the keys of reqs once each, with each key's position.
func distinct[T any](reqs []*T, key func(*T) string) ([]string, map[string]int) {
	keys := make([]string, 0, len(reqs))
	index := make(map[string]int, len(reqs))
	for _, r := range reqs {
		k := key(r)
		if _, ok := index[k]; !ok {
			index[k] = len(keys)
			keys = append(keys, k)
		}
	}
	return keys, index
}
