package catalog

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/virtufin/workmanager/internal/state"
	"golang.org/x/sync/errgroup"
)

// Code blobs are content-addressed (code/<sha256>) and shared by every
// worker whose history names them. A worker's delete puts the blobs of its
// history in the orphan index, a candidate list spread over OrphanPages
// keys, with the time each became a candidate. SweepCode takes the
// candidates older than a grace period, reads every worker's history, and
// deletes those no history names. Nothing is written per code load: the
// cost is reading every worker's history when a sweep finds candidates
// (one bulk read per 100 versions, history.go; after deletes, at most every
// sweep interval).
//
// A create or reload of the same code finds the blob: PutCode stores it
// again and takes it off the index. A sweep reads each due blob's ETag
// before its history scan (a create in progress has no history yet: it
// reaches the index only after its engine load), then takes the due
// entries off the index, keeping only those still listed as it read them,
// and deletes a blob only with the ETag it read: a PutCode during the scan
// either took the entry off the index (the blob is kept) or wrote the blob
// again (the conditional delete fails, the blob is kept). Left open: a
// whole sweep that fits between PutCode's write and its index update (a
// few milliseconds), once per grace period.
const (
	orphansPrefix = state.KeyPrefix + "code-orphans/"
	// OrphanPages is the number of keys the orphan index is spread over.
	OrphanPages = 16
)

func orphansKey(sha string) string {
	h := fnv.New32a()
	h.Write([]byte(sha))
	return orphansPrefix + strconv.Itoa(int(h.Sum32()%OrphanPages))
}

// orphanCode lists the blobs of a deleted worker's history as candidates.
// Candidates already listed keep their time (and cost no write).
func (c *Catalog) orphanCode(ctx context.Context, history []HistoryEntry) error {
	byKey := map[string][]string{}
	for _, e := range history {
		if e.SHA256 != "" {
			byKey[orphansKey(e.SHA256)] = append(byKey[orphansKey(e.SHA256)], e.SHA256)
		}
	}
	now := time.Now().UTC()
	// The pages are read in one bulk read and updated side by side.
	ctx = state.Prefetch(ctx, c.store, slices.Collect(maps.Keys(byKey)))
	g, gctx := errgroup.WithContext(ctx)
	for key, shas := range byKey {
		g.Go(func() error {
			return state.UpdateJSON(gctx, c.store, key, func(m *map[string]time.Time) bool {
				changed := false
				for _, sha := range shas {
					if _, ok := (*m)[sha]; !ok {
						if *m == nil {
							*m = map[string]time.Time{}
						}
						(*m)[sha] = now
						changed = true
					}
				}
				return changed
			})
		})
	}
	return g.Wait()
}

// unorphan takes sha off the orphan index (one read; a write only when it
// was listed).
func (c *Catalog) unorphan(ctx context.Context, sha string) error {
	return state.UpdateJSON(ctx, c.store, orphansKey(sha), func(m *map[string]time.Time) bool {
		if _, ok := (*m)[sha]; !ok {
			return false
		}
		delete(*m, sha)
		return true
	})
}

// SweepCode deletes the candidate blobs listed longer than grace ago that
// no worker's history names, takes the ones still named off the index, and
// returns how many blobs it deleted. Several sweepers may run at once:
// deletes are idempotent.
func (c *Catalog) SweepCode(ctx context.Context, grace time.Duration, now time.Time) (int, error) {
	due := map[string]map[string]time.Time{} // index key -> sha -> listed at
	etags := map[string]string{}             // sha -> the blob's ETag before the scan ("" when gone)
	for page := range OrphanPages {
		key := orphansPrefix + strconv.Itoa(page)
		m, _, err := state.GetJSON[map[string]time.Time](ctx, c.store, key)
		if err != nil {
			return 0, err
		}
		for sha, since := range m {
			if now.Sub(since) >= grace {
				if due[key] == nil {
					due[key] = map[string]time.Time{}
				}
				due[key][sha] = since
			}
		}
	}
	if len(due) == 0 {
		return 0, nil
	}
	for _, shas := range due {
		for sha := range shas {
			it, err := c.store.Get(ctx, codePrefix+sha)
			switch {
			case err == nil:
				etags[sha] = it.ETag
			case !errors.Is(err, state.ErrNotFound):
				return 0, err
			}
		}
	}
	used, err := c.referencedCode(ctx)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for key, shas := range due {
		// Take the due entries off the index first, keeping those listed
		// again (or taken off by PutCode) since the index was read: only
		// the ones taken here may be deleted.
		var claimed []string
		if err := state.UpdateJSON(ctx, c.store, key, func(m *map[string]time.Time) bool {
			claimed = claimed[:0]
			for sha, since := range shas {
				if t, ok := (*m)[sha]; ok && t.Equal(since) {
					delete(*m, sha)
					claimed = append(claimed, sha)
				}
			}
			return len(claimed) > 0
		}); err != nil {
			return deleted, err
		}
		for _, sha := range claimed {
			if used[sha] || etags[sha] == "" {
				continue
			}
			err := c.store.Delete(ctx, codePrefix+sha, etags[sha])
			switch {
			case errors.Is(err, state.ErrConflict):
				continue // stored again during the sweep: in use
			case err != nil:
				// Listed again, so that a later sweep tries once more.
				_ = c.orphanCode(ctx, []HistoryEntry{{SHA256: sha}})
				return deleted, err
			}
			deleted++
		}
	}
	return deleted, nil
}

// referencedCode is the set of blobs some worker's history names.
func (c *Catalog) referencedCode(ctx context.Context) (map[string]bool, error) {
	ids, err := c.WorkerIDs(ctx)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, id := range ids {
		h, _, err := c.allHistory(ctx, id)
		if err != nil {
			return nil, err
		}
		for _, e := range h {
			used[e.SHA256] = true
		}
	}
	return used, nil
}

// SweepLoop runs SweepCode every grace/4 (at least every second, at most
// every hour) until ctx ends, logging what it deleted and its failures.
// grace 0 disables collection.
func (c *Catalog) SweepLoop(ctx context.Context, log *slog.Logger, grace time.Duration) {
	if grace <= 0 {
		return
	}
	t := time.NewTicker(min(max(grace/4, time.Second), time.Hour))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := c.SweepCode(ctx, grace, time.Now())
		switch {
		case err != nil && ctx.Err() == nil:
			log.Warn("collecting unreferenced code blobs failed; retrying at the next sweep", "err", err)
		case n > 0:
			log.Info("collected unreferenced code blobs", "deleted", n, "grace", grace)
		}
	}
}
