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
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
	"golang.org/x/sync/errgroup"
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
	// Name is the worker's unique name ("" when created without one).
	Name string `json:"name,omitempty"`
	// RequestID is the CreateWorker request id that created the worker.
	RequestID string `json:"request_id,omitempty"`
	// AllowedOutputs and GatewayTargets are the worker's policy
	// (internal/workerpolicy); empty: the defaults.
	AllowedOutputs []string `json:"allowed_outputs,omitempty"`
	GatewayTargets []string `json:"gateway_targets,omitempty"`
	// Tenant owns the worker ("" in records written before tenants: the
	// default tenant); the worker id carries it too (internal/tenant).
	Tenant string `json:"tenant,omitempty"`
	// TopicPrefix confines the worker's input and output topics (the
	// tenant's prefix when it was created; "" for any topic).
	TopicPrefix string `json:"topic_prefix,omitempty"`
	// Revision numbers the writes of the record within its incarnation
	// (the entity workflow hands out a new one for every change it
	// applies): a write older than the stored record's is refused
	// (ErrStale). 0 in records written before revisions.
	Revision int64 `json:"revision,omitempty"`
	// Incarnation is the run id of the workflow run that created the
	// worker ("" before incarnations): a write of another incarnation never
	// replaces the record, and a tombstone refuses every write of its own.
	Incarnation string `json:"incarnation,omitempty"`
	// Deleted marks a tombstone: what stays of a deleted worker's record,
	// so that a late write of its incarnation is refused. GetWorker
	// answers ErrNotFound for it.
	Deleted bool `json:"deleted,omitempty"`
	// Retired lists the deleted incarnations of the id (the last
	// maxRetired): none of them is ever written again. SaveWorker keeps it.
	Retired []string `json:"retired,omitempty"`
	// Existed marks the tombstone of a worker that was created and then
	// deleted (MarkDeleted), not of a create that failed and was undone:
	// its id (a name's, a request id's) is never created again, also once
	// Temporal's retention has purged its workflow. Absent in tombstones
	// written before (those ids are free once Temporal forgot them).
	Existed bool `json:"existed,omitempty"`
	// Placement is what the worker asks of the nodes that serve it (nil:
	// the cluster's defaults; internal/placement).
	Placement *Placement `json:"placement,omitempty"`
	// MaxConcurrency and MaxProcesses are the worker's own bounds of its
	// engine's concurrency (CreateWorker's max_concurrency and
	// max_processes: events an async Python worker runs at once, runner
	// processes a plain one gets on demand); 0, and in records written
	// before them: the cluster's defaults.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	MaxProcesses   int `json:"max_processes,omitempty"`
	// GroupKey names the CloudEvent attribute or extension whose value
	// keys the worker's group lock (grouplock.KeyedName): executions of
	// one key exclude each other, different keys run in parallel; an event
	// without it takes the whole group's lock. "": the group's lock for
	// every event.
	GroupKey string `json:"group_key,omitempty"`
	// TimeoutMS is the longest one event may run in the worker
	// (CreateWorker's timeout_ms), capped by each node's WORKER_TIMEOUT;
	// 0, and in records written before it: WORKER_TIMEOUT.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// Placement is what a worker asks of the nodes that serve its topic.
type Placement struct {
	// Replicas is how many nodes serve the worker's topic (nil: the
	// cluster's PLACEMENT_REPLICAS; 0: every node that can run it). A
	// topic takes the largest of its workers'.
	Replicas *int `json:"replicas,omitempty"`
	// Require lists the labels (NODE_LABELS) a node must have to run the
	// worker.
	Require map[string]string `json:"require,omitempty"`
}

// maxRetired bounds Worker.Retired (an id is created again only after a
// failed create, once per request).
const maxRetired = 32

// TenantName is w's tenant, the default one for records older than
// tenants.
func (w Worker) TenantName() string {
	if w.Tenant == "" {
		return tenant.Default
	}
	return w.Tenant
}

// CodeRef says where a code version came from; the body itself lives in the
// store under its SHA-256.
type CodeRef struct {
	SHA256 string `json:"sha256"`
	// SourceKind is "content" or "url".
	SourceKind string `json:"source_kind"`
	URL        string `json:"url,omitempty"`
	// RollbackTo, when set, is the version whose code this ref loads again:
	// the code is read from the code store by SHA256 (SourceKind and URL
	// are that version's).
	RollbackTo int64 `json:"rollback_to,omitempty"`
	// Actor is who asked for the change (the caller's identity).
	Actor string `json:"actor,omitempty"`
	// GroupKey, when set, is the worker's group key from this version on
	// ("" removes it; nil keeps it): LoadCode changes it with the code.
	GroupKey *string `json:"group_key,omitempty"`
}

// HistoryEntry is one code load.
type HistoryEntry struct {
	Version    int64     `json:"version"`
	SHA256     string    `json:"sha256"`
	SourceKind string    `json:"source_kind"`
	URL        string    `json:"url,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	// Actor is who made the change; empty in entries written before
	// identities were recorded.
	Actor string `json:"actor,omitempty"`
	// Action is HistoryCreate, HistoryLoadCode or HistoryRollback (empty in
	// older entries: a create for version 1, a load otherwise).
	Action string `json:"action,omitempty"`
	// RollbackTo is, for a rollback, the version whose code it loads again.
	RollbackTo int64 `json:"rollback_to,omitempty"`
	// Revision is the record revision (Worker.Revision) of the change that
	// wrote the entry: an entry is replaced only by one of a revision as
	// high (AppendHistory). 0 in entries written before.
	Revision int64 `json:"revision,omitempty"`
	// Placement is, for a create, what the worker asked of placement (nil:
	// the cluster's defaults, or an entry written before placement).
	Placement *Placement `json:"placement,omitempty"`
	// MaxConcurrency and MaxProcesses are, for a create, the worker's
	// (Worker.MaxConcurrency, Worker.MaxProcesses; 0: the defaults).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	MaxProcesses   int `json:"max_processes,omitempty"`
	// GroupKey is the worker's group key from this version on
	// (Worker.GroupKey; "" also in entries written before group keys).
	GroupKey string `json:"group_key,omitempty"`
	// TimeoutMS is, for a create, the worker's (Worker.TimeoutMS; 0: the
	// node's WORKER_TIMEOUT).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// History actions.
const (
	HistoryCreate   = "create"
	HistoryLoadCode = "load_code"
	HistoryRollback = "rollback"
)

// ErrNotFound: no such worker.
var ErrNotFound = errors.New("worker not found")

// ErrStale: a write of a worker's record that the stored record has
// overtaken (an older revision, another incarnation, or a deleted worker's
// incarnation): a late attempt of a change the workflow has moved past.
var ErrStale = errors.New("stale worker record write")

// StagingTTL bounds how long uploaded code waits for its workflow to take it.
const StagingTTL = 15 * time.Minute

const (
	workersPrefix = state.KeyPrefix + "workers/"
	indexPrefix   = state.KeyPrefix + "index/"
	legacyIndex   = state.KeyPrefix + "index" // one key for every id, before the pages
	codePrefix    = state.KeyPrefix + "code/"
	stagingPrefix = state.KeyPrefix + "staging/"
)

// IndexPages is the number of keys the worker index is spread over (by a
// hash of the id): each key, and each page recovery carries, holds about
// 1/IndexPages of the ids, so neither a state value nor a workflow payload
// grows past a few hundred KiB below a million workers, while a full list
// stays IndexPages reads.
const IndexPages = 16

func indexKey(page int) string { return indexPrefix + strconv.Itoa(page) }

// indexPage is the page that holds id.
func indexPage(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % IndexPages)
}

// Catalog reads and writes workers, history and code.
type Catalog struct {
	store state.Store
}

// New returns a Catalog over store.
func New(store state.Store) *Catalog { return &Catalog{store: state.WithPrefetch(store)} }

// ReadAheadForApply starts reading, in one bulk read, the keys a change of
// w with history entry h (nil: none) reads after the record: the history
// head, the version's entry and the legacy history key, and for a create
// the index pages it joins. The returned context's reads of them take
// what that read found (state.Prefetch); every write they lead to is
// conditional on it, as before. The record itself is not read ahead: its
// read, after the node's lock (node.Apply), decides whether the node acts
// at all (CheckWrite), and must see a change that overtook this one.
func (c *Catalog) ReadAheadForApply(ctx context.Context, w Worker, h *HistoryEntry) context.Context {
	if h == nil || h.Version < 1 {
		return ctx
	}
	keys := []string{legacyHistoryKey(w.ID), historyHeadKey(w.ID), historyEntryKey(w.ID, h.Version)}
	if h.Action == HistoryCreate {
		keys = append(keys, indexKey(indexPage(w.ID)), tenantIndexKey(tenant.Of(w.ID), tenantIndexPage(w.ID)))
	}
	return state.Prefetch(ctx, c.store, keys)
}

// SHA256 returns the lowercase hex SHA-256 of b.
func SHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func workerKey(id string) string { return workersPrefix + id }

// SaveWorker makes sure the worker is in the index and in its tenant's,
// then writes the record: the commit point, so a record is never left
// unindexed (an index entry without a record is skipped by every list).
// The write is conditional (ETag-guarded): it is refused with ErrStale
// when the stored record has moved past w (CheckWrite), so a late attempt
// of an older change never replaces a newer record or brings a deleted
// worker back.
func (c *Catalog) SaveWorker(ctx context.Context, w Worker) error {
	cur, etag, err := c.stored(ctx, w.ID)
	if err != nil {
		return err
	}
	return c.saveOver(ctx, w, cur, etag)
}

// Read is a worker's stored record as CheckWrite read it, for
// SaveWorkerOver.
type Read struct {
	cur  *Worker // nil: none
	etag string
}

// SaveWorkerOver is SaveWorker of w over r, the record CheckWrite read
// for the same change: the record is not read again. The write is
// conditional on r's ETag, so a record written since is read again and
// admitted (or refused) as SaveWorker would.
func (c *Catalog) SaveWorkerOver(ctx context.Context, w Worker, r Read) error {
	return c.saveOver(ctx, w, r.cur, r.etag)
}

// indexed is whether w's ids are in the index and its tenant's already:
// cur, the stored record, is w's incarnation, live. A record is written
// only after its ids were indexed (saveOver), and only a delete takes
// them out, which tombstones the record after (RemoveWorker), so that a
// change of a live worker — a stop, a start, a reload — reads no index
// page (two round trips, and a page grows with the catalog).
func indexed(cur *Worker, w Worker) bool {
	return cur != nil && !cur.Deleted && cur.Incarnation == w.Incarnation
}

func (c *Catalog) saveOver(ctx context.Context, w Worker, cur *Worker, etag string) error {
	if err := admit(cur, w); err != nil {
		return err
	}
	done := false // w's ids indexed by this call
	index := func() error {
		if done || indexed(cur, w) {
			return nil
		}
		if err := c.updateIndex(ctx, indexPage(w.ID), func(ids []string) ([]string, bool) {
			if slices.Contains(ids, w.ID) {
				return ids, false
			}
			return append(ids, w.ID), true
		}); err != nil {
			return err
		}
		done = true
		return c.addToTenantIndex(ctx, w.ID)
	}
	if err := index(); err != nil {
		return err
	}
	var err error
	for conflicts := 0; ; conflicts++ {
		if conflicts > 0 {
			if err := state.ConflictBackoff(ctx, conflicts); err != nil {
				return err
			}
			if cur, etag, err = c.stored(ctx, w.ID); err != nil {
				return err
			}
			if err := admit(cur, w); err != nil {
				return err
			}
			// What was written meanwhile may not be w's live record
			// any more (a record removed, not tombstoned): index it.
			if err := index(); err != nil {
				return err
			}
		}
		w.Retired = nil
		if cur != nil {
			w.Retired = cur.Retired
		}
		b, err := json.Marshal(w)
		if err != nil {
			return fmt.Errorf("encode worker %s: %w", w.ID, err)
		}
		err = c.store.Put(ctx, workerKey(w.ID), b, state.PutOptions{ETag: etag, IfAbsent: etag == ""})
		if !errors.Is(err, state.ErrConflict) {
			return err
		}
	}
}

// CheckWrite returns ErrStale when the stored record has moved past w: a
// newer revision of w's incarnation, another live incarnation, or w's
// incarnation deleted.
// The record it read is returned for SaveWorkerOver.
func (c *Catalog) CheckWrite(ctx context.Context, w Worker) (Read, error) {
	cur, etag, err := c.stored(ctx, w.ID)
	if err != nil {
		return Read{}, err
	}
	return Read{cur: cur, etag: etag}, admit(cur, w)
}

// CheckRemove returns ErrStale when the record is another, live
// incarnation's than w's (RemoveWorker would refuse it).
func (c *Catalog) CheckRemove(ctx context.Context, w Worker) error {
	cur, _, err := c.stored(ctx, w.ID)
	if err != nil {
		return err
	}
	return removable(cur, w)
}

// removable is CheckRemove of w over cur, the stored record (nil: none).
func removable(cur *Worker, w Worker) error {
	if cur != nil && !cur.Deleted && cur.Incarnation != w.Incarnation {
		return fmt.Errorf("%w: worker %s is incarnation %q, not %q", ErrStale, w.ID, cur.Incarnation, w.Incarnation)
	}
	return nil
}

// admit is CheckWrite of w over cur, the stored record (nil: none).
func admit(cur *Worker, w Worker) error {
	switch {
	case cur == nil:
		return nil
	case slices.Contains(cur.Retired, w.Incarnation):
		return fmt.Errorf("%w: worker %s (incarnation %q) was deleted", ErrStale, w.ID, w.Incarnation)
	case cur.Deleted:
		return nil // a create of a new incarnation
	case cur.Incarnation != w.Incarnation:
		return fmt.Errorf("%w: worker %s is incarnation %q, not %q", ErrStale, w.ID, cur.Incarnation, w.Incarnation)
	case w.Revision < cur.Revision:
		return fmt.Errorf("%w: worker %s is at revision %d, the write is of revision %d", ErrStale, w.ID, cur.Revision, w.Revision)
	}
	return nil
}

// stored reads worker id's key as it is: its record or tombstone (nil when
// absent) and ETag.
func (c *Catalog) stored(ctx context.Context, id string) (*Worker, string, error) {
	it, err := c.store.Get(ctx, workerKey(id))
	if errors.Is(err, state.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	var w Worker
	if err := json.Unmarshal(it.Value, &w); err != nil {
		return nil, "", fmt.Errorf("decode worker %s: %w", id, err)
	}
	return &w, it.ETag, nil
}

// GetWorker returns ErrNotFound for an unknown id (or a deleted one).
func (c *Catalog) GetWorker(ctx context.Context, id string) (Worker, error) {
	w, _, err := c.stored(ctx, id)
	if err != nil {
		return Worker{}, err
	}
	if w == nil || w.Deleted {
		return Worker{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return *w, nil
}

// DeleteWorker is RemoveWorker of the incarnation the catalog holds.
func (c *Catalog) DeleteWorker(ctx context.Context, id string) error {
	cur, _, err := c.stored(ctx, id)
	if err != nil {
		return err
	}
	w := Worker{ID: id}
	if cur != nil {
		w.Incarnation = cur.Incarnation
	}
	return c.RemoveWorker(ctx, w)
}

// RemoveWorker removes w's history and index entries and replaces its
// record with a tombstone that refuses every later write of w's
// incarnation (kept for ever: a small value per deleted worker), also when
// no record was written (a failed create's undo). It is refused with
// ErrStale when the record is another, live incarnation's. Code blobs are
// content-addressed and may be shared: the worker's become candidates for
// SweepCode, which deletes those no history names any more once a grace
// period has passed.
func (c *Catalog) RemoveWorker(ctx context.Context, w Worker) error {
	id := w.ID
	// The keys the steps below read first (the record, the history's
	// head and legacy array, the two index pages) in one bulk read; each
	// write over them is conditional on the ETag read, so a value read
	// ahead is as safe as one read later (state.Prefetch).
	ctx = state.Prefetch(ctx, c.store, []string{workerKey(id), legacyHistoryKey(id), historyHeadKey(id),
		indexKey(indexPage(id)), tenantIndexKey(tenant.Of(id), tenantIndexPage(id))})
	// The record read for the check is what the tombstone is first
	// written over (conditional on its ETag: a record written since is
	// read again), not read a second time.
	cur, etag, err := c.stored(ctx, id)
	if err != nil {
		return err
	}
	if err := removable(cur, w); err != nil {
		return err
	}
	history, high, err := c.allHistory(ctx, id)
	if err != nil {
		return err
	}
	// The worker's code is marked for collection before anything is
	// removed: a delete cut off half-way and retried reads only what is
	// left of the history, and its blobs must already be marked by then. Marking
	// is safe early: the sweep deletes only blobs no history names.
	if err := c.orphanCode(ctx, history); err != nil {
		return err
	}
	// The index entries and the history go side by side: each step may
	// run again after a cut-off (an entry already gone is not written; a
	// key already deleted is deleted again), and the tombstone, last,
	// waits for all three.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return c.updateIndex(gctx, indexPage(id), func(ids []string) ([]string, bool) {
			i := slices.Index(ids, id)
			if i < 0 {
				return ids, false
			}
			return slices.Delete(ids, i, i+1), true
		})
	})
	g.Go(func() error { return c.removeFromTenantIndex(gctx, id) })
	g.Go(func() error { return c.deleteHistory(gctx, id, high) })
	if err := g.Wait(); err != nil {
		return err
	}
	for conflicts := 0; ; conflicts++ {
		if conflicts > 0 {
			if err := state.ConflictBackoff(ctx, conflicts); err != nil {
				return err
			}
			if cur, etag, err = c.stored(ctx, id); err != nil {
				return err
			}
		}
		tomb := Worker{ID: id, Incarnation: w.Incarnation, Revision: w.Revision, Tenant: w.Tenant, Deleted: true}
		if cur != nil {
			if !cur.Deleted && cur.Incarnation != w.Incarnation {
				return fmt.Errorf("%w: worker %s is incarnation %q, not %q", ErrStale, id, cur.Incarnation, w.Incarnation)
			}
			if cur.Deleted && slices.Contains(cur.Retired, w.Incarnation) {
				return nil
			}
			tomb.Revision, tomb.Retired = max(tomb.Revision, cur.Revision), slices.Clone(cur.Retired)
		}
		if !slices.Contains(tomb.Retired, w.Incarnation) {
			tomb.Retired = append(tomb.Retired, w.Incarnation)
		}
		tomb.Retired = tomb.Retired[max(0, len(tomb.Retired)-maxRetired):]
		b, err := json.Marshal(tomb)
		if err != nil {
			return err
		}
		err = c.store.Put(ctx, workerKey(id), b, state.PutOptions{ETag: etag, IfAbsent: etag == ""})
		if !errors.Is(err, state.ErrConflict) {
			return err
		}
	}
}

// ListWorkers returns every worker in the index, oldest first.
func (c *Catalog) ListWorkers(ctx context.Context) ([]Worker, error) {
	ids, err := c.WorkerIDs(ctx)
	if err != nil {
		return nil, err
	}
	ws, err := c.GetWorkers(ctx, ids)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(ws, func(a, b Worker) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return ws, nil
}

// WorkerIDs returns the ids of every page of the index, the pages read
// in one round trip on a Bulk store (after the legacy index's migration,
// as WorkerIDsPage does for page 0).
func (c *Catalog) WorkerIDs(ctx context.Context) ([]string, error) {
	if err := c.migrateLegacyIndex(ctx); err != nil {
		return nil, err
	}
	keys := make([]string, IndexPages)
	for page := range IndexPages {
		keys[page] = indexKey(page)
	}
	res, err := c.getMany(ctx, keys)
	if err != nil {
		return nil, err
	}
	var all []string
	for page, r := range res {
		if errors.Is(r.Err, state.ErrNotFound) {
			continue // a page nothing was ever added to
		}
		if r.Err != nil {
			return nil, r.Err
		}
		var ids []string
		if err := json.Unmarshal(r.Item.Value, &ids); err != nil {
			return nil, fmt.Errorf("decode %s: %w", keys[page], err)
		}
		all = append(all, ids...)
	}
	return all, nil
}

// WorkerIDsPage returns the ids on one page (0..IndexPages-1) of the index.
func (c *Catalog) WorkerIDsPage(ctx context.Context, page int) ([]string, error) {
	if page < 0 || page >= IndexPages {
		return nil, fmt.Errorf("index page %d out of range 0..%d", page, IndexPages-1)
	}
	if page == 0 {
		if err := c.migrateLegacyIndex(ctx); err != nil {
			return nil, err
		}
	}
	ids, _, err := state.GetJSON[[]string](ctx, c.store, indexKey(page))
	return ids, err
}

// migrateLegacyIndex moves the ids of the one-key index of earlier
// versions onto the pages and deletes it (a no-op once done). Every full
// listing and recovery read page 0 first, so no id is missed.
func (c *Catalog) migrateLegacyIndex(ctx context.Context) error {
	legacy, etag, err := state.GetJSON[[]string](ctx, c.store, legacyIndex)
	if err != nil || etag == "" {
		return err
	}
	for _, id := range legacy {
		if err := c.updateIndex(ctx, indexPage(id), func(ids []string) ([]string, bool) {
			if slices.Contains(ids, id) {
				return ids, false
			}
			return append(ids, id), true
		}); err != nil {
			return err
		}
	}
	if err := c.store.Delete(ctx, legacyIndex, etag); err != nil && !errors.Is(err, state.ErrConflict) {
		return err // a conflict: another node migrated it meanwhile
	}
	return nil
}

// GetWorkers returns the records of ids, in order, leaving out the ones that
// do not exist (any more).
// They are read getWorkersChunk at a time, each chunk in one round trip
// on a Bulk store (the catalog's scans: a node's convergence and
// reconcile, the API's list).
func (c *Catalog) GetWorkers(ctx context.Context, ids []string) ([]Worker, error) {
	out := make([]Worker, 0, len(ids))
	for chunk := range slices.Chunk(ids, getWorkersChunk) {
		keys := make([]string, len(chunk))
		for i, id := range chunk {
			keys[i] = workerKey(id)
		}
		res, err := c.getMany(ctx, keys)
		if err != nil {
			return nil, err
		}
		for i, r := range res {
			if errors.Is(r.Err, state.ErrNotFound) {
				continue // index written before the record, or a delete in progress
			}
			if r.Err != nil {
				return nil, r.Err
			}
			var w Worker
			if err := json.Unmarshal(r.Item.Value, &w); err != nil {
				return nil, fmt.Errorf("decode worker %s: %w", chunk[i], err)
			}
			if !w.Deleted {
				out = append(out, w)
			}
		}
	}
	return out, nil
}

// getWorkersChunk is how many records GetWorkers reads in one round trip.
const getWorkersChunk = 100

// updateIndex applies change to one page of the index with optimistic
// concurrency.
func (c *Catalog) updateIndex(ctx context.Context, page int, change func([]string) ([]string, bool)) error {
	return state.UpdateJSON(ctx, c.store, indexKey(page), func(ids *[]string) bool {
		next, changed := change(*ids)
		*ids = next
		return changed
	})
}

// PutCode stores a code body under its SHA-256 (idempotent). A blob that
// was waiting to be collected is kept: it is about to be referenced again.
func (c *Catalog) PutCode(ctx context.Context, body []byte) (string, error) {
	sha := SHA256(body)
	// Off the collection index first: a sweep that runs between the two
	// steps then finds nothing of this body due (codegc.go).
	if err := c.unorphan(ctx, sha); err != nil {
		return sha, err
	}
	return sha, c.store.Put(ctx, codePrefix+sha, body, state.PutOptions{})
}

// ReadAheadForPutCode starts reading the orphan index page that would
// list sha (state.Prefetch): a PutCode of that body in the returned
// context then takes it off the index (one read, a write only when it was
// listed) without a read on its path. A caller starts it before the work
// that decides whether the body is stored at all (an engine's check).
// Reading the page that much earlier (at most the check's time, which the
// activity's timeout bounds) changes nothing a sweep does: it deletes only
// candidates listed longer than its grace ago (hours), which the read
// finds, and keeps a blob listed after the read once the change's history
// names it; a page changed since fails the write's condition and is read
// again.
func (c *Catalog) ReadAheadForPutCode(ctx context.Context, sha string) context.Context {
	return state.Prefetch(ctx, c.store, []string{orphansKey(sha)})
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
