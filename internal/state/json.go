package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// GetJSON reads the JSON value at key into a T, with its ETag. An absent
// key gives the zero T and an empty ETag.
func GetJSON[T any](ctx context.Context, s Store, key string) (T, string, error) {
	var v T
	it, err := s.Get(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return v, "", nil
	}
	if err != nil {
		return v, "", err
	}
	if err := json.Unmarshal(it.Value, &v); err != nil {
		return v, "", fmt.Errorf("decode %s: %w", key, err)
	}
	return v, it.ETag, nil
}

// UpdateJSON changes the JSON value at key with optimistic concurrency: it
// reads it (the zero T when absent), lets change modify it, and writes it
// back conditioned on the ETag it read (first-write when the key was absent),
// starting over on ErrConflict, after a growing randomised pause (see
// ConflictBackoff), until ctx ends. change returning false leaves the key as
// it is.
func UpdateJSON[T any](ctx context.Context, s Store, key string, change func(*T) bool) error {
	for conflicts := 0; ; conflicts++ {
		if err := ConflictBackoff(ctx, conflicts); err != nil {
			return err
		}
		v, etag, err := GetJSON[T](ctx, s, key)
		if err != nil {
			return err
		}
		if !change(&v) {
			return nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		err = s.Put(ctx, key, b, PutOptions{ETag: etag, IfAbsent: etag == ""})
		if !errors.Is(err, ErrConflict) {
			return err
		}
	}
}

// Conflict backoff: the pause before retry n (n ≥ 1) is drawn uniformly
// from [0, min(ConflictBackoffBase·2ⁿ⁻¹, ConflictBackoffMax)) ("full
// jitter"), so writers that collided spread out instead of colliding again.
const (
	ConflictBackoffBase = 2 * time.Millisecond
	ConflictBackoffMax  = 50 * time.Millisecond
)

// ConflictBackoff waits before the retry that follows conflicts failed
// attempts (none before the first attempt); it returns ctx's error if ctx
// ends first.
func ConflictBackoff(ctx context.Context, conflicts int) error {
	if conflicts == 0 {
		return ctx.Err()
	}
	limit := ConflictBackoffMax
	if conflicts < 8 {
		limit = min(ConflictBackoffBase<<(conflicts-1), ConflictBackoffMax)
	}
	t := time.NewTimer(rand.N(limit) + 1)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
