// Package state owns every access WorkManager makes to persistent key/value
// state: one small interface (Store), its Dapr implementation (go-sdk state
// API with ETags), an in-memory implementation for unit tests, and the
// wrappers that batch, read ahead (prefetch.go) or inject faults. Nothing
// else in the code base talks to the Dapr state API.
package state

import (
	"context"
	"errors"
	"strconv"
	"time"
)

// KeyPrefix namespaces every key WorkManager writes.
const KeyPrefix = "workmanager/"

var (
	// ErrNotFound: the key does not exist.
	ErrNotFound = errors.New("state: key not found")
	// ErrConflict: an ETag or first-write precondition failed; re-read and retry.
	ErrConflict = errors.New("state: concurrent modification")
)

// Item is one stored value with its ETag.
type Item struct {
	Value []byte
	ETag  string
}

// PutOptions are the preconditions and lifetime of a Put.
type PutOptions struct {
	// ETag, when set, makes the write succeed only if the stored ETag matches.
	ETag string
	// IfAbsent makes the write succeed only if the key does not exist yet.
	// A key created this way must afterwards always be written with its ETag
	// (state.redis keeps the key in first-write mode).
	IfAbsent bool
	// TTL, when positive, lets the store expire the key.
	TTL time.Duration
}

// Versioned is implemented by stores whose ETags may be versions: every
// write of a key makes its ETag the successor of the one before, from "1"
// for a key created. Dapr's state.redis keeps them so (a counter per key,
// HINCRBY). A writer that knows the ETag it wrote with then knows the
// key's ETag after its write without reading it: a write conditioned on
// that ETag succeeds only while nobody else wrote the key since — as long
// as the key is not deleted meanwhile (its counter would start again).
type Versioned interface {
	// NextETag returns the ETag a key has after a successful write
	// conditioned on etag ("": a create), and false when this store's
	// ETags are not known to be versions.
	NextETag(etag string) (string, bool)
}

// nextVersion is NextETag for version ETags.
func nextVersion(etag string) (string, bool) {
	if etag == "" {
		return "1", true
	}
	n, err := strconv.ParseUint(etag, 10, 63)
	if err != nil {
		return "", false
	}
	return strconv.FormatUint(n+1, 10), true
}

// Store is persistent key/value state with optimistic concurrency.
type Store interface {
	// Get returns ErrNotFound when the key is absent.
	Get(ctx context.Context, key string) (Item, error)
	// Put writes a value; a failed precondition returns ErrConflict.
	Put(ctx context.Context, key string, value []byte, opts PutOptions) error
	// Delete removes a key (no error if it is absent). A non-empty etag makes
	// the delete conditional.
	Delete(ctx context.Context, key, etag string) error
}
