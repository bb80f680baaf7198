package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
)

// BenchmarkSaveLiveWorker is what a change of a live worker (a stop)
// costs the catalog on a store of no latency, in a tenant of n workers:
// "indexed" reads its record once and writes it (SaveWorkerOver after
// CheckWrite, today's); "index-read" also reads and checks its index
// page and its tenant's (what every change did before: a page holds
// about n/IndexPages ids, a tenant's page n/TenantIndexPages), the
// baseline in the same run.
func BenchmarkSaveLiveWorker(b *testing.B) {
	for _, n := range []int{100, 10000, 50000} {
		ctx := context.Background()
		store := state.NewMemoryStore()
		c := New(store)
		pages := map[string][]string{}
		for i := range n {
			id := fmt.Sprintf("worker-%06d", i)
			pages[indexKey(indexPage(id))] = append(pages[indexKey(indexPage(id))], id)
			tk := tenantIndexKey(tenant.Of(id), tenantIndexPage(id))
			pages[tk] = append(pages[tk], id)
		}
		for k, ids := range pages {
			v, _ := json.Marshal(ids)
			if err := store.Put(ctx, k, v, state.PutOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		w := Worker{ID: "worker-000042", Topic: "t", Status: StatusRunning, Revision: 1, Incarnation: "run-a"}
		if err := c.SaveWorker(ctx, w); err != nil {
			b.Fatal(err)
		}
		for _, mode := range []string{"indexed", "index-read"} {
			b.Run(fmt.Sprintf("%s/tenant-of-%d", mode, n), func(b *testing.B) {
				for b.Loop() {
					w.Revision++
					r, err := c.CheckWrite(ctx, w)
					if err != nil {
						b.Fatal(err)
					}
					if mode == "index-read" {
						if err := c.updateIndex(ctx, indexPage(w.ID), func(ids []string) ([]string, bool) { return ids, false }); err != nil {
							b.Fatal(err)
						}
						if err := c.addToTenantIndex(ctx, w.ID); err != nil {
							b.Fatal(err)
						}
					}
					if err := c.SaveWorkerOver(ctx, w, r); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
