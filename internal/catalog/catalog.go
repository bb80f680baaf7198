// Package catalog owns what a worker is and how it is persisted: the worker
// record (config and status), its code-version history, the content-addressed
// code blobs and the short-lived staging area for code uploaded through the
// API. It validates worker specs and stores everything through state.Store
// under the "workmanager/" key namespace.
package catalog

import (
	"cmp"
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

// Status is a worker's desired state.
type Status string

const (
	StatusRunning Status = "RUNNING"
	StatusStopped Status = "STOPPED"
)

// Worker is the persisted configuration of one worker.
type Worker struct {
	ID          string    `json:"id"`
	MIMEType    string    `json:"mime_type"`
	Topic       string    `json:"topic"`
	Group       string    `json:"group,omitempty"`
	Status      Status    `json:"status"`
	CodeVersion int64     `json:"code_version"`
	CodeSHA256  string    `json:"code_sha256"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	// MaxAttempts is how often the worker runs one message before giving
	// up on it (dead letter); 0: the cluster default.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// RetryBackoff is the wait before the next attempt; 0: the cluster
	// default.
	RetryBackoff time.Duration `json:"retry_backoff,omitempty"`
}

// CodeRef says where a code version came from; the body itself lives in the
// store under its SHA-256.
type CodeRef struct {
	SHA256 string `json:"sha256"`
	// SourceKind is "content" or "url".
	SourceKind string `json:"source_kind"`
	URL        string `json:"url,omitempty"`
}

// HistoryEntry is one code load.
type HistoryEntry struct {
	Version    int64     `json:"version"`
	SHA256     string    `json:"sha256"`
	SourceKind string    `json:"source_kind"`
	URL        string    `json:"url,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
}

// ErrNotFound: no such worker.
var ErrNotFound = errors.New("worker not found")

// StagingTTL bounds how long uploaded code waits for its workflow to take it.
const StagingTTL = 15 * time.Minute

const (
	workersPrefix = state.KeyPrefix + "workers/"
	indexKey      = state.KeyPrefix + "index"
	codePrefix    = state.KeyPrefix + "code/"
	stagingPrefix = state.KeyPrefix + "staging/"
)

// Catalog reads and writes workers, history and code.
type Catalog struct {
	store state.Store
}

// New returns a Catalog over store.
func New(store state.Store) *Catalog { return &Catalog{store: store} }

// SHA256 returns the lowercase hex SHA-256 of b.
func SHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func workerKey(id string) string  { return workersPrefix + id }
func historyKey(id string) string { return workersPrefix + id + "/history" }

// SaveWorker writes the record and makes sure the worker is in the index.
func (c *Catalog) SaveWorker(ctx context.Context, w Worker) error {
	b, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("encode worker %s: %w", w.ID, err)
	}
	if err := c.store.Put(ctx, workerKey(w.ID), b, state.PutOptions{}); err != nil {
		return err
	}
	return c.updateIndex(ctx, func(ids []string) ([]string, bool) {
		if slices.Contains(ids, w.ID) {
			return ids, false
		}
		return append(ids, w.ID), true
	})
}

// GetWorker returns ErrNotFound for an unknown id.
func (c *Catalog) GetWorker(ctx context.Context, id string) (Worker, error) {
	it, err := c.store.Get(ctx, workerKey(id))
	if errors.Is(err, state.ErrNotFound) {
		return Worker{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return Worker{}, err
	}
	var w Worker
	if err := json.Unmarshal(it.Value, &w); err != nil {
		return Worker{}, fmt.Errorf("decode worker %s: %w", id, err)
	}
	return w, nil
}

// DeleteWorker removes the record, its history and its index entry. Code
// blobs are content-addressed and may be shared, so they stay.
func (c *Catalog) DeleteWorker(ctx context.Context, id string) error {
	if err := c.updateIndex(ctx, func(ids []string) ([]string, bool) {
		i := slices.Index(ids, id)
		if i < 0 {
			return ids, false
		}
		return slices.Delete(ids, i, i+1), true
	}); err != nil {
		return err
	}
	if err := c.store.Delete(ctx, historyKey(id), ""); err != nil {
		return err
	}
	return c.store.Delete(ctx, workerKey(id), "")
}

// ListWorkers returns every worker in the index, in creation order.
func (c *Catalog) ListWorkers(ctx context.Context) ([]Worker, error) {
	ids, err := c.WorkerIDs(ctx)
	if err != nil {
		return nil, err
	}
	return c.GetWorkers(ctx, ids)
}

// WorkerIDs returns the ids in the index, in creation order.
func (c *Catalog) WorkerIDs(ctx context.Context) ([]string, error) {
	ids, _, err := state.GetJSON[[]string](ctx, c.store, indexKey)
	return ids, err
}

// GetWorkers returns the records of ids, in order, leaving out the ones that
// do not exist (any more).
func (c *Catalog) GetWorkers(ctx context.Context, ids []string) ([]Worker, error) {
	out := make([]Worker, 0, len(ids))
	for _, id := range ids {
		w, err := c.GetWorker(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue // index written before the record, or a delete in progress
		}
		if err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// AppendHistory records a code load. The entry of a version is the last
// one written for it: a retry writes the same entry again, and a version
// number that an interrupted change used before is corrected, never left
// showing another SHA-256. Entries stay ordered by version.
func (c *Catalog) AppendHistory(ctx context.Context, id string, e HistoryEntry) error {
	return state.UpdateJSON(ctx, c.store, historyKey(id), func(entries *[]HistoryEntry) bool {
		i, found := slices.BinarySearchFunc(*entries, e.Version, func(x HistoryEntry, v int64) int { return cmp.Compare(x.Version, v) })
		switch {
		case found && sameEntry((*entries)[i], e):
			return false
		case found:
			(*entries)[i] = e
		default:
			*entries = slices.Insert(*entries, i, e)
		}
		return true
	})
}

func sameEntry(a, b HistoryEntry) bool {
	return a.Version == b.Version && a.SHA256 == b.SHA256 && a.SourceKind == b.SourceKind && a.URL == b.URL && a.CreatedAt.Equal(b.CreatedAt)
}

// History returns the code loads of a worker, oldest first.
func (c *Catalog) History(ctx context.Context, id string) ([]HistoryEntry, error) {
	entries, _, err := state.GetJSON[[]HistoryEntry](ctx, c.store, historyKey(id))
	return entries, err
}

// updateIndex applies change to the index with optimistic concurrency.
func (c *Catalog) updateIndex(ctx context.Context, change func([]string) ([]string, bool)) error {
	return state.UpdateJSON(ctx, c.store, indexKey, func(ids *[]string) bool {
		next, changed := change(*ids)
		*ids = next
		return changed
	})
}

// PutCode stores a code body under its SHA-256 (idempotent).
func (c *Catalog) PutCode(ctx context.Context, body []byte) (string, error) {
	sha := SHA256(body)
	return sha, c.store.Put(ctx, codePrefix+sha, body, state.PutOptions{})
}

// GetCode returns the body stored under sha, verifying it.
func (c *Catalog) GetCode(ctx context.Context, sha string) ([]byte, error) {
	return c.getVerified(ctx, codePrefix+sha, sha)
}

// StageCode keeps an uploaded body for StagingTTL until a workflow takes it.
func (c *Catalog) StageCode(ctx context.Context, body []byte) (string, error) {
	sha := SHA256(body)
	return sha, c.store.Put(ctx, stagingPrefix+sha, body, state.PutOptions{TTL: StagingTTL})
}

// GetStaged returns a staged body, verifying it.
func (c *Catalog) GetStaged(ctx context.Context, sha string) ([]byte, error) {
	return c.getVerified(ctx, stagingPrefix+sha, sha)
}

// DeleteStaged drops a staged body.
func (c *Catalog) DeleteStaged(ctx context.Context, sha string) error {
	return c.store.Delete(ctx, stagingPrefix+sha, "")
}

func (c *Catalog) getVerified(ctx context.Context, key, sha string) ([]byte, error) {
	it, err := c.store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	if got := SHA256(it.Value); got != sha {
		return nil, fmt.Errorf("code %s is corrupt in the store (sha256 %s)", sha, got)
	}
	return it.Value, nil
}
