package state

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	dapr "github.com/dapr/go-sdk/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DaprStore is a Store backed by a Dapr state component.
type DaprStore struct {
	client    dapr.Client
	storeName string
	// versions: the component is state.redis, whose ETags are versions
	// (Versioned; DetectVersionETags).
	versions atomic.Bool
}

// DetectVersionETags asks daprd which component the store is and, for
// state.redis, reports its ETags as versions from then on (NextETag). An
// error (daprd not answering) leaves them unknown, as before the call.
func (s *DaprStore) DetectVersionETags(ctx context.Context) (bool, error) {
	md, err := s.client.GetMetadata(ctx)
	if err != nil {
		return false, fmt.Errorf("state: daprd metadata: %w", err)
	}
	for _, c := range md.RegisteredComponents {
		if c.Name == s.storeName {
			v := c.Type == "state.redis"
			s.versions.Store(v)
			return v, nil
		}
	}
	return false, nil
}

// NextETag implements Versioned: state.redis counts a key's writes in its
// ETag (its Lua script: HINCRBY version 1).
func (s *DaprStore) NextETag(etag string) (string, bool) {
	if !s.versions.Load() {
		return "", false
	}
	return nextVersion(etag)
}

// NewDaprStore uses the state component storeName through client.
func NewDaprStore(client dapr.Client, storeName string) *DaprStore {
	return &DaprStore{client: client, storeName: storeName}
}

// Get implements Store.
func (s *DaprStore) Get(ctx context.Context, key string) (Item, error) {
	it, err := s.client.GetState(ctx, s.storeName, key, nil)
	if err != nil {
		return Item{}, fmt.Errorf("state get %q: %w", key, err)
	}
	if it == nil || (len(it.Value) == 0 && it.Etag == "") {
		return Item{}, fmt.Errorf("state get %q: %w", key, ErrNotFound)
	}
	return Item{Value: it.Value, ETag: it.Etag}, nil
}

// GetMany implements Bulk with one GetBulkState call (daprd reads the keys
// in parallel).
func (s *DaprStore) GetMany(ctx context.Context, keys []string) ([]Result, error) {
	items, err := s.client.GetBulkState(ctx, s.storeName, keys, nil, int32(len(keys)))
	if err != nil {
		return nil, fmt.Errorf("state bulk get of %d keys: %w", len(keys), err)
	}
	byKey := make(map[string]*dapr.BulkStateItem, len(items))
	for _, it := range items {
		byKey[it.Key] = it
	}
	out := make([]Result, len(keys))
	for i, k := range keys {
		it := byKey[k]
		switch {
		case it == nil:
			out[i].Err = fmt.Errorf("state get %q: missing from the bulk answer", k)
		case it.Error != "":
			out[i].Err = fmt.Errorf("state get %q: %s", k, it.Error)
		case len(it.Value) == 0 && it.Etag == "":
			out[i].Err = fmt.Errorf("state get %q: %w", k, ErrNotFound)
		default:
			out[i].Item = Item{Value: it.Value, ETag: it.Etag}
		}
	}
	return out, nil
}

// PutMany implements Bulk with one ExecuteStateTransaction (state.redis:
// one MULTI/EXEC, without rollback). Caveat of state.redis: a key created
// by a transaction is not marked first-write, so a later create-if-absent
// of the same key (IfAbsent without an ETag) overwrites it instead of
// failing; writes with an ETag are checked as usual.
func (s *DaprStore) PutMany(ctx context.Context, writes []Write) error {
	ops := make([]*dapr.StateOperation, len(writes))
	for i, w := range writes {
		meta, etag, so := putArgs(w.Opts)
		item := &dapr.SetStateItem{Key: w.Key, Value: w.Value, Metadata: meta}
		if etag != "" {
			item.Etag = &dapr.ETag{Value: etag}
		}
		if so != nil {
			item.Options = &dapr.StateOptions{Concurrency: dapr.StateConcurrencyFirstWrite}
		}
		ops[i] = &dapr.StateOperation{Type: dapr.StateOperationTypeUpsert, Item: item}
	}
	if err := s.client.ExecuteStateTransaction(ctx, s.storeName, nil, ops); err != nil {
		return fmt.Errorf("state transaction of %d writes: %w", len(writes), err)
	}
	return nil
}

// putArgs turns PutOptions into the Dapr call's metadata, ETag and options.
func putArgs(opts PutOptions) (map[string]string, string, []dapr.StateOption) {
	var meta map[string]string
	if opts.TTL > 0 {
		meta = map[string]string{"ttlInSeconds": strconv.Itoa(int(opts.TTL.Seconds() + 0.999))}
	}
	var so []dapr.StateOption
	if opts.IfAbsent || opts.ETag != "" {
		// first-write with an empty ETag creates the key only if it is absent.
		so = append(so, dapr.WithConcurrency(dapr.StateConcurrencyFirstWrite))
	}
	return meta, opts.ETag, so
}

// Put implements Store.
func (s *DaprStore) Put(ctx context.Context, key string, value []byte, opts PutOptions) error {
	meta, etag, so := putArgs(opts)
	if err := s.client.SaveStateWithETag(ctx, s.storeName, key, value, etag, meta, so...); err != nil {
		if isConflict(err, opts.IfAbsent || etag != "") {
			return fmt.Errorf("state put %q: %w", key, ErrConflict)
		}
		return fmt.Errorf("state put %q: %w", key, err)
	}
	return nil
}

// Delete implements Store.
func (s *DaprStore) Delete(ctx context.Context, key, etag string) error {
	var err error
	if etag == "" {
		err = s.client.DeleteState(ctx, s.storeName, key, nil)
	} else {
		err = s.client.DeleteStateWithETag(ctx, s.storeName, key, &dapr.ETag{Value: etag}, nil, nil)
	}
	if err != nil {
		if isConflict(err, etag != "") {
			return fmt.Errorf("state delete %q: %w", key, ErrConflict)
		}
		return fmt.Errorf("state delete %q: %w", key, err)
	}
	return nil
}

// isConflict tells whether err, from a conditional write or delete, is its
// precondition failing. daprd answers an ETag mismatch with gRPC Aborted. A
// first-write (no ETag yet) that finds the key present fails inside
// state.redis's Lua script ("failed to set key <key>"), which the component
// returns as a plain error and daprd as Internal: that one message, and only
// for a conditional write, is a conflict too. Anything else (an invalid
// ETag, a failed TTL, an unreachable store) is an error, not a conflict.
func isConflict(err error, conditional bool) bool {
	if err == nil || !conditional {
		return false
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Aborted:
		return true
	case codes.Internal:
		msg := st.Message()
		return strings.Contains(msg, "failed to set key") && !strings.Contains(msg, " ttl")
	}
	return false
}
