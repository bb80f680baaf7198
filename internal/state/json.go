package state

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// starting over on ErrConflict until ctx ends. change returning false leaves
// the key as it is.
func UpdateJSON[T any](ctx context.Context, s Store, key string, change func(*T) bool) error {
	for {
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
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
