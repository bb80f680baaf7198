// Package delivery owns the per-message delivery record: for one CloudEvent
// (keyed by its source and id), which workers are done with it, which gave
// up on it (dead-lettered), and how many attempts each made so far. The hot
// path reads it once before running a message and writes it once after, so
// that a redelivery skips the workers already done (idempotency per event
// and worker), attempt counts survive node restarts and move with the
// message between nodes, and the ack can wait for every worker of the topic
// cluster-wide. Records expire after a TTL.
package delivery

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Outcome is where one worker stands with one message.
type Outcome string

const (
	// Pending: not finished yet (zero or more failed attempts).
	Pending Outcome = ""
	// Done: processed successfully; never run again.
	Done Outcome = "done"
	// Dead: attempts exhausted; sent to <topic>-dead; never run again
	// (unless replayed).
	Dead Outcome = "dead"
)

// Worker is one worker's progress with one message.
type Worker struct {
	Outcome  Outcome `json:"o,omitempty"`
	Attempts int     `json:"a,omitempty"`
	// NotRunnable counts deliveries that reached a node which could not run
	// the worker; FirstNotRunnableMS is when that first happened.
	NotRunnable        int   `json:"nr,omitempty"`
	FirstNotRunnableMS int64 `json:"nrf,omitempty"`
	// NextMS is the earliest time (unix ms) of the next attempt (backoff).
	NextMS int64 `json:"n,omitempty"`
	// Reason and Error are the last attempt's dead-letter reason and
	// public error text, kept only when the attempts are used up and the
	// dead letter was not recorded: the delivery that records it then
	// says why the attempts failed, not a generic reason.
	Reason string `json:"r,omitempty"`
	Error  string `json:"e,omitempty"`
}

// Terminal reports whether the worker is finished with the message.
func (w Worker) Terminal() bool { return w.Outcome == Done || w.Outcome == Dead }

// Record is everything known about one message.
type Record struct {
	Workers map[string]Worker `json:"w"`
	etag    string
}

// Get returns the state of worker id (the zero Worker when unknown).
func (r *Record) Get(id string) Worker { return r.Workers[id] }

// Set replaces the state of worker id.
func (r *Record) Set(id string, w Worker) {
	if r.Workers == nil {
		r.Workers = map[string]Worker{}
	}
	r.Workers[id] = w
}

// Key is the state key of the record of the event with source and id.
func Key(source, id string) string {
	h := sha256.Sum256([]byte(source + "\x00" + id))
	return state.KeyPrefix + "delivery/" + hex.EncodeToString(h[:16])
}

// Store reads and writes delivery records.
type Store struct {
	st  state.Store
	ttl time.Duration
}

// NewStore keeps records in st for ttl (0: forever).
func NewStore(st state.Store, ttl time.Duration) *Store { return &Store{st: st, ttl: ttl} }

// Load returns the record under key (an empty one when there is none yet).
func (s *Store) Load(ctx context.Context, key string) (Record, error) {
	it, err := s.st.Get(ctx, key)
	if errors.Is(err, state.ErrNotFound) {
		return Record{}, nil
	}
	if err != nil {
		return Record{}, fmt.Errorf("delivery record: %w", err)
	}
	var r Record
	if err := json.Unmarshal(it.Value, &r); err != nil {
		// A record that cannot be read must not block the message forever:
		// start over (at worst a worker runs a message again).
		r = Record{}
	}
	r.etag = it.ETag
	return r, nil
}

// maxConflicts bounds the re-read-and-merge rounds of Update.
const maxConflicts = 8

// Update applies change to the record r (as loaded) and saves it guarded by
// its ETag; when another node wrote the record meanwhile it re-reads it and
// applies change again. It returns the record as saved.
func (s *Store) Update(ctx context.Context, key string, r Record, change func(*Record)) (Record, error) {
	for conflicts := range maxConflicts {
		if err := state.ConflictBackoff(ctx, conflicts); err != nil {
			return r, fmt.Errorf("delivery record: %w", err)
		}
		change(&r)
		b := r.appendJSON(make([]byte, 0, 128))
		err := s.st.Put(ctx, key, b, state.PutOptions{ETag: r.etag, IfAbsent: r.etag == "", TTL: s.ttl})
		if err == nil {
			return r, nil
		}
		if !errors.Is(err, state.ErrConflict) {
			return r, fmt.Errorf("delivery record: %w", err)
		}
		if r, err = s.Load(ctx, key); err != nil {
			return r, err
		}
	}
	return r, fmt.Errorf("delivery record %s: still changing after %d tries: %w", key, maxConflicts, state.ErrConflict)
}

// Reset forgets worker id's progress with the message under key (a replay
// of a dead letter: the worker runs it again with fresh attempts).
func (s *Store) Reset(ctx context.Context, key, id string) error {
	r, err := s.Load(ctx, key)
	if err != nil {
		return err
	}
	if _, ok := r.Workers[id]; !ok {
		return nil
	}
	_, err = s.Update(ctx, key, r, func(r *Record) { delete(r.Workers, id) })
	return err
}
