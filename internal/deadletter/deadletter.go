// Package deadletter owns the stored dead letters and their replay
// bookkeeping: when a worker exhausts its attempts on a message, the hot path
// publishes the event to "<topic>-dead" and stores it here (Add), so that the
// control API can list it and replay it to that one worker (List, Remove).
//
// Each dead letter is one key, workmanager/deadletter/<owner>/<hash of
// source and id>, where the owner is the worker id, or TopicOwner(topic) for
// a message no worker could take (undecodable, too large). Each owner has an
// index, workmanager/deadletters/<owner>, listing its entries oldest first
// ({key, event_id, reason, at_ms}); it is updated with ETag compare-and-swap
// so that nodes adding at the same time lose nothing. The index keeps at most
// MaxIndex entries: older ones are dropped from the store (they are still on
// the "-dead" topic). Entries and index expire after the store's TTL; the
// index records that TTL, so that a reader (the API) needs no configuration
// of its own to keep it.
package deadletter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// ReplayExtension is the CloudEvent extension naming the only worker a
// replayed event is for.
const ReplayExtension = "workmanagerreplay"

// MaxIndex caps an owner's index; the oldest entries are dropped beyond it.
const MaxIndex = 10000

// Size bounds, well under what daprd accepts in one save (its
// --max-body-size: 4 MiB by default, 16 MiB in the manifests), so that a
// dead letter is always stored and its event never comes back for ever:
// an owner's index is kept under MaxIndexBytes (the oldest entries are
// dropped, as beyond MaxIndex); an entry over MaxEntryBytes is stored
// without its event and raw bytes, its error cut (Truncated, not
// replayable); an id or source over MaxIDBytes is stored as
// "too-large-sha256:<hash>" (Truncated).
const (
	MaxIndexBytes = 1 << 20
	MaxEntryBytes = 2 << 20
	MaxIDBytes    = 1024
	// MaxTracebackBytes bounds the traceback of an entry cut to fit (the
	// hot path bounds it to 16 KiB before).
	MaxTracebackBytes = 16 << 10
)

const (
	entryPrefix = state.KeyPrefix + "deadletter/"
	indexPrefix = state.KeyPrefix + "deadletters/"
	topicOwner  = "_topic/"
)

// Entry is one dead letter.
type Entry struct {
	// Worker is "" for a message no worker could take (undecodable,
	// too_large).
	Worker string `json:"worker"`
	// Topic is the topic the message came from (not the -dead one).
	Topic string `json:"topic"`
	// Reason: worker_failed, timeout, lock_contention, undecodable,
	// too_large, not_runnable, panic...
	Reason   string `json:"reason"`
	Attempts int    `json:"attempts"`
	// Error is the last error, bounded in length by the caller.
	Error string `json:"error,omitempty"`
	// Traceback is where the last error happened, when the engine knew
	// (bounded and redacted by the caller); absent from entries stored
	// before it was kept.
	Traceback string `json:"traceback,omitempty"`
	EventID   string `json:"event_id"`
	Source    string `json:"source"`
	// Event is the original structured CloudEvent JSON (as published).
	Event json.RawMessage `json:"event,omitempty"`
	// Raw holds the bytes of a message that could not be decoded.
	Raw []byte `json:"raw,omitempty"`
	// AtMS is when the message was given up on (unix ms; Add fills in now
	// when 0).
	AtMS int64 `json:"at_ms"`
	// Truncated: the entry was too large to store whole (MaxEntryBytes,
	// MaxIDBytes): its event and raw bytes are left out, or its id or
	// source replaced by a hash.
	Truncated bool `json:"truncated,omitempty"`
}

// Owner is the index e belongs to: its worker, or TopicOwner(e.Topic).
func (e Entry) Owner() string {
	if e.Worker == "" {
		return TopicOwner(e.Topic)
	}
	return e.Worker
}

// TopicOwner is the owner of the dead letters of topic that no worker could
// take (Entry.Worker ""): pass it as the worker of List and Remove.
func TopicOwner(topic string) string { return topicOwner + topic }

// Filter selects entries; zero fields select everything.
type Filter struct {
	Reason   string
	EventIDs []string
	// Replayable selects only entries that carry their event (Entry.Event).
	Replayable bool
}

// ref is one index entry.
type ref struct {
	Key     string `json:"key"`
	EventID string `json:"event_id"`
	Reason  string `json:"reason"`
	AtMS    int64  `json:"at_ms"`
	// NoEvent: the entry has no Event (it cannot be replayed).
	NoEvent bool `json:"no_event,omitempty"`
}

// index is the value of an owner's index key.
type index struct {
	// TTLMS is the TTL (ms) of the entries and of the index, as last
	// written by Add (0: kept).
	TTLMS   int64 `json:"ttl_ms,omitempty"`
	Entries []ref `json:"entries"`
}

func (f Filter) match(r ref) bool {
	return (f.Reason == "" || r.Reason == f.Reason) &&
		(len(f.EventIDs) == 0 || slices.Contains(f.EventIDs, r.EventID)) &&
		(!f.Replayable || !r.NoEvent)
}

// live reports whether r's entry has not expired yet.
func (x *index) live(r ref, nowMS int64) bool {
	return x.TTLMS <= 0 || r.AtMS+x.TTLMS > nowMS
}

// Store keeps dead letters in a state.Store.
type Store struct {
	st       state.Store
	ttl      time.Duration
	maxIndex int
	now      func() time.Time
	replay   replayKey // the replay marker's key (replay.go)
}

// NewStore keeps dead letters in st for ttl (0: kept until removed or
// dropped by the MaxIndex cap). Readers that never Add may pass 0: the TTL
// in use is recorded in each index.
func NewStore(st state.Store, ttl time.Duration) *Store {
	return &Store{st: st, ttl: ttl, maxIndex: MaxIndex, now: time.Now}
}

func entryKey(owner, source, id string) string {
	h := sha256.Sum256([]byte(boundedID(source) + "\x00" + boundedID(id)))
	return entryPrefix + owner + "/" + hex.EncodeToString(h[:16])
}

// boundedID is s, or its hash when s is over MaxIDBytes.
func boundedID(s string) string {
	if len(s) <= MaxIDBytes {
		return s
	}
	h := sha256.Sum256([]byte(s))
	return "too-large-sha256:" + hex.EncodeToString(h[:])
}

// fit bounds e to what the store takes (see MaxEntryBytes) and returns its
// encoding.
func fit(e *Entry) ([]byte, error) {
	if id, src := boundedID(e.EventID), boundedID(e.Source); id != e.EventID || src != e.Source {
		e.EventID, e.Source, e.Truncated = id, src, true
	}
	b, err := json.Marshal(e)
	if err != nil || len(b) <= MaxEntryBytes {
		return b, err
	}
	e.Event, e.Raw, e.Truncated = nil, nil, true
	if len(e.Error) > MaxIDBytes {
		e.Error = e.Error[:MaxIDBytes]
	}
	if len(e.Traceback) > MaxTracebackBytes {
		e.Traceback = e.Traceback[len(e.Traceback)-MaxTracebackBytes:]
	}
	return json.Marshal(e)
}

// refBytes is r's share of its index's encoding.
func refBytes(r ref) int {
	b, _ := json.Marshal(r)
	return len(b) + 1
}

func indexKey(owner string) string { return indexPrefix + owner }

// Add stores e (overwriting a dead letter of the same owner, source and id,
// which keeps one index entry, moved to the end) and appends it to its
// owner's index. Index entries older than the TTL and, beyond MaxIndex, the
// oldest ones are dropped. An error may leave the entry stored but not
// indexed; adding it again repairs that.
func (s *Store) Add(ctx context.Context, e Entry) error {
	owner := e.Owner()
	if owner == topicOwner {
		return errors.New("dead letter: neither worker nor topic is set")
	}
	if e.AtMS == 0 {
		e.AtMS = s.now().UnixMilli()
	}
	b, err := fit(&e)
	if err != nil {
		return fmt.Errorf("dead letter %s: %w", e.EventID, err)
	}
	key := entryKey(owner, e.Source, e.EventID)
	if err := s.st.Put(ctx, key, b, state.PutOptions{TTL: s.ttl}); err != nil {
		return fmt.Errorf("dead letter %s: %w", e.EventID, err)
	}
	r := ref{Key: key, EventID: e.EventID, Reason: e.Reason, AtMS: e.AtMS, NoEvent: len(e.Event) == 0}
	var dropped []string
	err = s.update(ctx, owner, true, func(x *index) bool {
		nowMS := s.now().UnixMilli()
		x.TTLMS = s.ttl.Milliseconds()
		dropped = dropped[:0]
		kept := x.Entries[:0]
		for _, old := range x.Entries {
			switch {
			case old.Key == key:
			case !x.live(old, nowMS):
			default:
				kept = append(kept, old)
			}
		}
		kept = append(kept, r)
		over := max(len(kept)-s.maxIndex, 0)
		size := 64 // the index's own fields
		for i := len(kept) - 1; i >= over; i-- {
			if size += refBytes(kept[i]); size > MaxIndexBytes && i < len(kept)-1 {
				over = i + 1 // the older entries do not fit
				break
			}
		}
		for _, old := range kept[:over] {
			dropped = append(dropped, old.Key)
		}
		kept = kept[over:]
		x.Entries = kept
		return true
	})
	if err != nil {
		return err
	}
	// Best effort: an entry left behind is unreachable and expires with
	// its TTL.
	for _, k := range dropped {
		_ = s.st.Delete(ctx, k, "")
	}
	return nil
}

// List returns worker's entries that match f, oldest first, at most limit
// of them (limit <= 0: all). worker is a worker id, or TopicOwner(topic).
// Entries that expired meanwhile are left out.
func (s *Store) List(ctx context.Context, worker string, f Filter, limit int) ([]Entry, error) {
	x, _, err := s.read(ctx, worker)
	if err != nil {
		return nil, err
	}
	nowMS := s.now().UnixMilli()
	var out []Entry
	for _, r := range x.Entries {
		if limit > 0 && len(out) >= limit {
			break
		}
		if !f.match(r) || !x.live(r, nowMS) {
			continue
		}
		it, err := s.st.Get(ctx, r.Key)
		if errors.Is(err, state.ErrNotFound) {
			continue // expired, or removed meanwhile
		}
		if err != nil {
			return out, fmt.Errorf("dead letter %s: %w", r.EventID, err)
		}
		var e Entry
		if err := json.Unmarshal(it.Value, &e); err != nil {
			return out, fmt.Errorf("dead letter %s: decode %s: %w", r.EventID, r.Key, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// Count is how many of worker's entries match f (from the index alone).
func (s *Store) Count(ctx context.Context, worker string, f Filter) (int, error) {
	x, _, err := s.read(ctx, worker)
	if err != nil {
		return 0, err
	}
	nowMS := s.now().UnixMilli()
	n := 0
	for _, r := range x.Entries {
		if f.match(r) && x.live(r, nowMS) {
			n++
		}
	}
	return n, nil
}

// Remove drops e from worker's index and deletes it (no error when it is
// gone already). An error after the index was updated leaves the entry
// unreachable until it expires.
func (s *Store) Remove(ctx context.Context, worker string, e Entry) error {
	key := entryKey(worker, e.Source, e.EventID)
	err := s.update(ctx, worker, false, func(x *index) bool {
		i := slices.IndexFunc(x.Entries, func(r ref) bool { return r.Key == key })
		if i < 0 {
			return false
		}
		x.Entries = slices.Delete(x.Entries, i, i+1)
		return true
	})
	if err != nil {
		return err
	}
	if err := s.st.Delete(ctx, key, ""); err != nil {
		return fmt.Errorf("dead letter %s: %w", e.EventID, err)
	}
	return nil
}

func (s *Store) read(ctx context.Context, owner string) (index, string, error) {
	var x index
	it, err := s.st.Get(ctx, indexKey(owner))
	if errors.Is(err, state.ErrNotFound) {
		return x, "", nil
	}
	if err != nil {
		return x, "", fmt.Errorf("dead letter index %s: %w", owner, err)
	}
	if err := json.Unmarshal(it.Value, &x); err != nil {
		return x, "", fmt.Errorf("dead letter index %s: decode: %w", owner, err)
	}
	return x, it.ETag, nil
}

// maxConflicts bounds the re-read-and-retry rounds of an index update.
const maxConflicts = 64

// update applies change to owner's index and writes it guarded by its ETag
// (first write when absent; only when create is set; an index left empty
// is deleted, guarded the same way), re-reading and
// retrying after a conflict with a short random pause so that concurrent
// writers spread out. change returning false leaves the index as it is.
func (s *Store) update(ctx context.Context, owner string, create bool, change func(*index) bool) error {
	key := indexKey(owner)
	for i := range maxConflicts {
		x, etag, err := s.read(ctx, owner)
		if err != nil {
			return err
		}
		if etag == "" && !create {
			return nil
		}
		if !change(&x) {
			return nil
		}
		if len(x.Entries) == 0 && etag != "" {
			err = s.st.Delete(ctx, key, etag)
		} else {
			b, merr := json.Marshal(x)
			if merr != nil {
				return fmt.Errorf("dead letter index %s: %w", owner, merr)
			}
			err = s.st.Put(ctx, key, b, state.PutOptions{ETag: etag, IfAbsent: etag == "", TTL: time.Duration(x.TTLMS) * time.Millisecond})
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, state.ErrConflict) {
			return fmt.Errorf("dead letter index %s: %w", owner, err)
		}
		if err := state.ConflictBackoff(ctx, i+1); err != nil {
			return err
		}
	}
	return fmt.Errorf("dead letter index %s: still changing after %d tries: %w", owner, maxConflicts, state.ErrConflict)
}
