package catalog

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"

	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
)

// The per-tenant index: the ids of each tenant's workers (the tenant a
// worker id carries, tenant.Of), spread over TenantIndexPages keys, so that
// a tenant's list reads its own ids and records only, whatever other
// tenants hold (issue 32 item 6). SaveWorker and DeleteWorker keep it
// beside the global index. A tenant's index is built once from the global
// index the first time it is read (workers saved before it existed); its
// marker key says it was.
const (
	tenantIndexPrefix = state.KeyPrefix + "tenant-index/"
	// TenantIndexPages is the number of keys a tenant's ids are spread
	// over: a page holds about 1/TenantIndexPages of them (a tenant with
	// 50,000 workers: about 0.5 MiB a page).
	TenantIndexPages = 4
)

func tenantIndexKey(t string, page int) string {
	return tenantIndexPrefix + t + "/" + strconv.Itoa(page)
}

func tenantIndexBuiltKey(t string) string { return tenantIndexPrefix + t + "/built" }

func tenantIndexPage(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % TenantIndexPages)
}

func (c *Catalog) addToTenantIndex(ctx context.Context, id string) error {
	return state.UpdateJSON(ctx, c.store, tenantIndexKey(tenant.Of(id), tenantIndexPage(id)), func(ids *[]string) bool {
		if slices.Contains(*ids, id) {
			return false
		}
		*ids = append(*ids, id)
		return true
	})
}

func (c *Catalog) removeFromTenantIndex(ctx context.Context, id string) error {
	return state.UpdateJSON(ctx, c.store, tenantIndexKey(tenant.Of(id), tenantIndexPage(id)), func(ids *[]string) bool {
		i := slices.Index(*ids, id)
		if i < 0 {
			return false
		}
		*ids = slices.Delete(*ids, i, i+1)
		return true
	})
}

// TenantWorkerIDs returns the ids of tenant t's workers, sorted: its index
// pages (and, once, the global index to build them).
func (c *Catalog) TenantWorkerIDs(ctx context.Context, t string) ([]string, error) {
	if err := tenant.Validate(t); err != nil && t != tenant.Default {
		return nil, err
	}
	if err := c.buildTenantIndex(ctx, t); err != nil {
		return nil, err
	}
	var all []string
	for page := range TenantIndexPages {
		ids, _, err := state.GetJSON[[]string](ctx, c.store, tenantIndexKey(t, page))
		if err != nil {
			return nil, err
		}
		all = append(all, ids...)
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}

// buildTenantIndex adds the global index's ids of tenant t to its pages,
// unless its marker says that was done.
func (c *Catalog) buildTenantIndex(ctx context.Context, t string) error {
	if _, err := c.store.Get(ctx, tenantIndexBuiltKey(t)); err == nil {
		return nil
	} else if !errors.Is(err, state.ErrNotFound) {
		return err
	}
	ids, err := c.WorkerIDs(ctx)
	if err != nil {
		return err
	}
	byPage := map[int][]string{}
	for _, id := range ids {
		if tenant.Of(id) == t {
			byPage[tenantIndexPage(id)] = append(byPage[tenantIndexPage(id)], id)
		}
	}
	for page, add := range byPage {
		if err := state.UpdateJSON(ctx, c.store, tenantIndexKey(t, page), func(ids *[]string) bool {
			changed := false
			for _, id := range add {
				if !slices.Contains(*ids, id) {
					*ids = append(*ids, id)
					changed = true
				}
			}
			return changed
		}); err != nil {
			return err
		}
	}
	return c.store.Put(ctx, tenantIndexBuiltKey(t), []byte(`true`), state.PutOptions{})
}

// ListTenantWorkers returns up to limit of tenant t's workers whose ids
// sort after after, by id, and whether there are more: it reads t's index
// and the records it returns (one more, to tell whether a next page
// exists), never another tenant's.
func (c *Catalog) ListTenantWorkers(ctx context.Context, t, after string, limit int) ([]Worker, bool, error) {
	if limit <= 0 {
		return nil, false, fmt.Errorf("limit %d must be positive", limit)
	}
	ids, err := c.TenantWorkerIDs(ctx, t)
	if err != nil {
		return nil, false, err
	}
	return c.page(ctx, ids, after, limit)
}

// ListWorkersAfter is ListTenantWorkers over every tenant's workers: it
// reads the global index (IndexPages keys) and the records it returns.
func (c *Catalog) ListWorkersAfter(ctx context.Context, after string, limit int) ([]Worker, bool, error) {
	if limit <= 0 {
		return nil, false, fmt.Errorf("limit %d must be positive", limit)
	}
	ids, err := c.WorkerIDs(ctx)
	if err != nil {
		return nil, false, err
	}
	slices.Sort(ids)
	return c.page(ctx, slices.Compact(ids), after, limit)
}

// page reads the records of up to limit of the sorted ids after after (and
// of the next one, to tell whether there are more).
func (c *Catalog) page(ctx context.Context, ids []string, after string, limit int) ([]Worker, bool, error) {
	i, _ := slices.BinarySearch(ids, after)
	for i < len(ids) && ids[i] <= after {
		i++
	}
	out := make([]Worker, 0, min(limit, len(ids)-i))
	for ; i < len(ids); i++ {
		w, err := c.GetWorker(ctx, ids[i])
		if errors.Is(err, ErrNotFound) {
			continue // a delete in progress
		}
		if err != nil {
			return nil, false, err
		}
		if len(out) == limit {
			return out, true, nil
		}
		out = append(out, w)
	}
	return out, false, nil
}
