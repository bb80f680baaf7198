package catalog

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"golang.org/x/sync/errgroup"

	"github.com/virtufin/workmanager/internal/state"
)

// A worker's history is kept one key per version, so that no state value
// and no answer grows with the number of versions (issue 43 item 6: the
// single array of earlier versions was rewritten whole by every code load,
// past gRPC's 4 MiB answer limit after about 2,000 loads and daprd's
// 16 MiB write limit after about 7,000):
//
//	workers/<id>/history/<version>  one HistoryEntry (a few hundred bytes)
//	workers/<id>/history/head       {"high": N}: no entry key above N exists
//
// The head is raised before an entry is written, so a delete (and code
// collection) knows every key to read or remove without a prefix listing,
// which the Dapr state API does not have. The versions a reader shows come
// from the worker record (1..Worker.CodeVersion): History needs neither a
// scan nor the head.
//
// Data of earlier versions: the one-array key workers/<id>/history (legacy)
// is read as well as the per-version keys and merged with them (an entry of
// a version in both: the one of the higher revision, the per-version one on
// a tie), so a worker whose history is still the array shows all of it. The
// array is migrated lazily: the next AppendHistory copies its entries to
// their keys, then deletes it (conditionally on the ETag it read: an array
// an older node appended to meanwhile is kept, read, and migrated by the
// next append). Reads never write.
const (
	// MaxHistoryPage bounds the entries of one HistoryPage (and of one
	// GetWorkerHistory answer).
	MaxHistoryPage = 1000
	// historyReadBatch bounds the keys of one bulk read.
	historyReadBatch = 100
	// historyParallel bounds the reads or deletes of single keys in flight.
	historyParallel = 8
)

func legacyHistoryKey(id string) string { return workersPrefix + id + "/history" }
func historyHeadKey(id string) string   { return workersPrefix + id + "/history/head" }
func historyEntryKey(id string, v int64) string {
	return workersPrefix + id + "/history/" + strconv.FormatInt(v, 10)
}

// historyHead bounds the entry keys of a worker's history.
type historyHead struct {
	High int64 `json:"high"`
}

// AppendHistory records a code load, before its record is saved (the
// commit point). The entry of a version is the last one written for it: a
// retry writes the same entry again (no write: same entry, one entry), and
// the entry of a load that was cut off before its record was saved
// (History does not show it) is replaced by the next load, which takes the
// same number; the blob it named becomes a candidate for collection. An
// entry is never replaced by one of a lower revision (ErrStale): a late
// attempt of the cut-off load does not overwrite the load that took its
// number. It writes at most the head and the version's key, whatever the
// number of versions (and moves a legacy array first, once).
func (c *Catalog) AppendHistory(ctx context.Context, id string, e HistoryEntry) error {
	if e.Version < 1 {
		return fmt.Errorf("history entry of worker %s has version %d: versions start at 1", id, e.Version)
	}
	if err := c.migrateLegacyHistory(ctx, id); err != nil {
		return err
	}
	if err := c.raiseHistoryHead(ctx, id, e.Version); err != nil {
		return err
	}
	replaced, err := c.putHistoryEntry(ctx, id, e)
	if err != nil {
		return err
	}
	if replaced != "" {
		// Possibly still named by another version: the sweep keeps a blob
		// any history names, so marking it is safe.
		return c.orphanCode(ctx, []HistoryEntry{{SHA256: replaced}})
	}
	return nil
}

// putHistoryEntry writes e at its version's key unless the same entry is
// there (a retry) or one of a higher revision (ErrStale), with the key's
// ETag (create-if-absent for a new key). It returns the blob of the entry it
// replaced when that named other code.
func (c *Catalog) putHistoryEntry(ctx context.Context, id string, e HistoryEntry) (string, error) {
	key := historyEntryKey(id, e.Version)
	b, err := json.Marshal(e)
	if err != nil {
		return "", fmt.Errorf("encode history entry %d of worker %s: %w", e.Version, id, err)
	}
	for conflicts := 0; ; conflicts++ {
		if err := state.ConflictBackoff(ctx, conflicts); err != nil {
			return "", err
		}
		cur, etag, err := state.GetJSON[HistoryEntry](ctx, c.store, key)
		if err != nil {
			return "", err
		}
		replaced := ""
		if etag != "" {
			switch {
			case sameEntry(cur, e): // a retry (its revision aside: a node of an older version writes none)
				return "", nil
			case cur.Revision > e.Revision:
				return "", fmt.Errorf("%w: version %d of worker %s was written by revision %d, the write is of revision %d",
					ErrStale, e.Version, id, cur.Revision, e.Revision)
			case cur.SHA256 != e.SHA256:
				replaced = cur.SHA256
			}
		}
		err = c.store.Put(ctx, key, b, state.PutOptions{ETag: etag, IfAbsent: etag == ""})
		if !errors.Is(err, state.ErrConflict) {
			return replaced, err
		}
	}
}

// raiseHistoryHead makes the head at least v (a read, and a write only
// when it grows).
func (c *Catalog) raiseHistoryHead(ctx context.Context, id string, v int64) error {
	return state.UpdateJSON(ctx, c.store, historyHeadKey(id), func(h *historyHead) bool {
		if h.High >= v {
			return false
		}
		h.High = v
		return true
	})
}

// migrateLegacyHistory moves a legacy history array onto the per-version
// keys and deletes it (one read when there is none). An entry the
// per-version keys already hold a newer revision of stays as it is.
func (c *Catalog) migrateLegacyHistory(ctx context.Context, id string) error {
	legacy, etag, err := state.GetJSON[[]HistoryEntry](ctx, c.store, legacyHistoryKey(id))
	if err != nil || etag == "" {
		return err
	}
	if err := c.raiseHistoryHead(ctx, id, lastVersion(legacy)); err != nil {
		return err
	}
	var replaced []HistoryEntry
	for _, e := range legacy {
		if e.Version < 1 {
			replaced = append(replaced, e) // no key of its own: left to collection
			continue
		}
		sha, err := c.putHistoryEntry(ctx, id, e)
		switch {
		case errors.Is(err, ErrStale):
			replaced = append(replaced, e) // a later load took the number
		case err != nil:
			return fmt.Errorf("moving the history of worker %s to one key per version: %w", id, err)
		case sha != "":
			replaced = append(replaced, HistoryEntry{SHA256: sha})
		}
	}
	if err := c.orphanCode(ctx, replaced); err != nil {
		return err
	}
	if err := c.store.Delete(ctx, legacyHistoryKey(id), etag); err != nil && !errors.Is(err, state.ErrConflict) {
		return err // a conflict: an older node appended meanwhile; read along, moved next time
	}
	return nil
}

func sameEntry(a, b HistoryEntry) bool {
	return a.Version == b.Version && a.SHA256 == b.SHA256 && a.SourceKind == b.SourceKind && a.URL == b.URL && a.CreatedAt.Equal(b.CreatedAt) &&
		a.Actor == b.Actor && a.Action == b.Action && a.RollbackTo == b.RollbackTo
}

// History returns the code loads of a worker that its record reached,
// oldest first: the entries up to the record's code version. An entry
// above it is a load in progress or one that failed before its record
// was saved (the API answered it as failed); the next load takes its
// number and replaces it. A worker without a record (not created yet, or
// deleted) has none. The record is read first, so a load that commits
// meanwhile is either shown whole or not at all. It reads every version:
// callers that answer a request take HistoryPage.
func (c *Catalog) History(ctx context.Context, id string) ([]HistoryEntry, error) {
	var all []HistoryEntry
	for after := int64(0); ; {
		page, next, err := c.HistoryPage(ctx, id, after, MaxHistoryPage)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if next == 0 {
			return all, nil
		}
		after = next
	}
}

// HistoryPage returns the shown entries (as History) of the versions after
// `after`, at most limit (1..MaxHistoryPage) of them, oldest first, and the
// version to pass as `after` for the next page (0: this was the last). A
// page reads at most limit entry keys, one bulk read per historyReadBatch.
func (c *Catalog) HistoryPage(ctx context.Context, id string, after int64, limit int) ([]HistoryEntry, int64, error) {
	if limit < 1 || limit > MaxHistoryPage {
		return nil, 0, fmt.Errorf("history page of %d entries: want 1..%d", limit, MaxHistoryPage)
	}
	if after < 0 {
		return nil, 0, fmt.Errorf("history page after version %d: want 0 or more", after)
	}
	w, _, err := c.stored(ctx, id)
	if err != nil || w == nil || w.Deleted || after >= w.CodeVersion {
		return nil, 0, err
	}
	legacy, _, err := state.GetJSON[[]HistoryEntry](ctx, c.store, legacyHistoryKey(id))
	if err != nil {
		return nil, 0, err
	}
	to := min(after+int64(limit), w.CodeVersion)
	entries, err := c.readHistory(ctx, id, after+1, to, legacy)
	if err != nil {
		return nil, 0, err
	}
	if to == w.CodeVersion {
		return entries, 0, nil
	}
	return entries, to, nil
}

// HistoryVersion returns the shown entry of version v (false when the
// history shows no such version), reading one key (and the legacy array).
func (c *Catalog) HistoryVersion(ctx context.Context, id string, v int64) (HistoryEntry, bool, error) {
	if v < 1 {
		return HistoryEntry{}, false, nil
	}
	entries, _, err := c.HistoryPage(ctx, id, v-1, 1)
	if err != nil || len(entries) == 0 || entries[0].Version != v {
		return HistoryEntry{}, false, err
	}
	return entries[0], true, nil
}

// allHistory is every entry of a worker's history, also those of loads
// that did not reach the record (code collection must see their blobs),
// and the highest version a key may exist for.
func (c *Catalog) allHistory(ctx context.Context, id string) ([]HistoryEntry, int64, error) {
	legacy, _, err := state.GetJSON[[]HistoryEntry](ctx, c.store, legacyHistoryKey(id))
	if err != nil {
		return nil, 0, err
	}
	head, _, err := state.GetJSON[historyHead](ctx, c.store, historyHeadKey(id))
	if err != nil {
		return nil, 0, err
	}
	high := max(head.High, lastVersion(legacy))
	entries, err := c.readHistory(ctx, id, 1, high, legacy)
	if err != nil {
		return nil, 0, err
	}
	// Legacy entries outside 1..high (version 0) still name blobs.
	for _, e := range legacy {
		if e.Version < 1 {
			entries = append(entries, e)
		}
	}
	return entries, head.High, nil
}

// readHistory reads the entries of versions from..to (a missing key is
// skipped), merged with the legacy array's entries in that range, ordered
// by version.
func (c *Catalog) readHistory(ctx context.Context, id string, from, to int64, legacy []HistoryEntry) ([]HistoryEntry, error) {
	var out []HistoryEntry
	for lo := from; lo <= to; lo += historyReadBatch {
		hi := min(lo+historyReadBatch-1, to)
		keys := make([]string, 0, hi-lo+1)
		for v := lo; v <= hi; v++ {
			keys = append(keys, historyEntryKey(id, v))
		}
		res, err := c.getMany(ctx, keys)
		if err != nil {
			return nil, err
		}
		for i, r := range res {
			if errors.Is(r.Err, state.ErrNotFound) {
				continue
			}
			if r.Err != nil {
				return nil, r.Err
			}
			var e HistoryEntry
			if err := json.Unmarshal(r.Value, &e); err != nil {
				return nil, fmt.Errorf("decode %s: %w", keys[i], err)
			}
			out = append(out, e)
		}
	}
	for _, e := range legacy {
		if e.Version < from || e.Version > to {
			continue
		}
		i, found := slices.BinarySearchFunc(out, e.Version, func(x HistoryEntry, v int64) int { return cmp.Compare(x.Version, v) })
		switch {
		case !found:
			out = slices.Insert(out, i, e)
		case e.Revision > out[i].Revision:
			out[i] = e
		}
	}
	return out, nil
}

// deleteHistory removes every key of a worker's history: the entries
// 1..high and the legacy array (historyParallel at a time), and the head
// last, so that a delete cut off half-way and retried still knows the
// range. The work is one delete per version the worker ever had.
func (c *Catalog) deleteHistory(ctx context.Context, id string, high int64) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(historyParallel)
	g.Go(func() error { return c.store.Delete(gctx, legacyHistoryKey(id), "") })
	for v := int64(1); v <= high; v++ {
		g.Go(func() error { return c.store.Delete(gctx, historyEntryKey(id, v), "") })
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("deleting the history of worker %s: %w", id, err)
	}
	return c.store.Delete(ctx, historyHeadKey(id), "")
}

// getMany reads keys in one round trip on a Bulk store, historyParallel
// at a time otherwise; an absent key's Err wraps state.ErrNotFound.
func (c *Catalog) getMany(ctx context.Context, keys []string) ([]state.Result, error) {
	if b, ok := c.store.(state.Bulk); ok {
		return b.GetMany(ctx, keys)
	}
	out := make([]state.Result, len(keys))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(historyParallel)
	for i, k := range keys {
		g.Go(func() error {
			it, err := c.store.Get(gctx, k)
			out[i] = state.Result{Item: it, Err: err}
			return nil
		})
	}
	_ = g.Wait()
	return out, ctx.Err()
}

// lastVersion is the highest version of entries (0 for none).
func lastVersion(entries []HistoryEntry) int64 {
	var v int64
	for _, e := range entries {
		v = max(v, e.Version)
	}
	return v
}
