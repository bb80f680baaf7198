package state

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	dapr "github.com/dapr/go-sdk/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DaprStore is a Store backed by a Dapr state component.
type DaprStore struct {
	client    dapr.Client
	storeName string
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

// Put implements Store.
func (s *DaprStore) Put(ctx context.Context, key string, value []byte, opts PutOptions) error {
	var meta map[string]string
	if opts.TTL > 0 {
		meta = map[string]string{"ttlInSeconds": strconv.Itoa(int(opts.TTL.Seconds() + 0.999))}
	}
	etag := opts.ETag
	var so []dapr.StateOption
	if opts.IfAbsent || etag != "" {
		// first-write with an empty ETag creates the key only if it is absent.
		so = append(so, dapr.WithConcurrency(dapr.StateConcurrencyFirstWrite))
	}
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
