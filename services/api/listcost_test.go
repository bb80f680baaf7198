package api

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"go.temporal.io/sdk/mocks"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// countingStore counts reads and keeps their keys; the catalog reads
// keys concurrently (a store without bulk reads: catalog.getMany).
type countingStore struct {
	state.Store
	gets atomic.Int64
	mu   sync.Mutex
	keys []string
}

func (c *countingStore) Get(ctx context.Context, key string) (state.Item, error) {
	c.gets.Add(1)
	c.mu.Lock()
	c.keys = append(c.keys, key)
	c.mu.Unlock()
	return c.Store.Get(ctx, key)
}

// TestListWorkersCostsWhatItReturns: issue 32 item 6. With 2,000 workers
// of globex in the catalog, acme's page_size=1 ListWorkers reads acme's
// index and the records of its page only (it was 2,000+ reads: every
// record of every tenant), reads no globex record, and pages through
// acme's workers in id order.
func TestListWorkersCostsWhatItReturns(t *testing.T) {
	s, mem := newServer(t, mocks.NewClient(t))
	ctx := context.Background()
	cat := catalog.New(mem)
	for i := range 2000 {
		if err := cat.SaveWorker(ctx, catalog.Worker{ID: tenant.WorkerID("globex", uuid.New()), Tenant: "globex", Topic: "globex.t"}); err != nil {
			t.Fatal(err)
		}
		if i < 3 {
			if err := cat.SaveWorker(ctx, catalog.Worker{ID: tenant.WorkerID("acme", uuid.New()), Tenant: "acme", Topic: fmt.Sprintf("acme.t%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	counting := &countingStore{Store: mem}
	s.catalog = catalog.New(counting)
	acme := as(auth.RoleReader, "acme")

	var seen []string
	token := ""
	for page := 0; ; page++ {
		before := counting.gets.Load()
		counting.keys = nil
		resp, err := s.ListWorkers(acme, &pb.ListWorkersRequest{PageSize: 1, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		reads := counting.gets.Load() - before
		for _, k := range counting.keys {
			if strings.Contains(k, "globex.") {
				t.Fatalf("acme's list read globex's %s", k)
			}
		}
		// The first list builds acme's index once from the global one
		// (catalog.IndexPages reads, the legacy index, an update per page);
		// then: a marker, the index pages and
		// at most two records.
		limit := int64(1 + catalog.TenantIndexPages + 2)
		if page == 0 {
			limit += catalog.IndexPages + 1 + catalog.TenantIndexPages
		}
		t.Logf("page %d: %d state reads", page, reads)
		if reads > limit {
			t.Fatalf("page %d of a page_size=1 list cost %d state reads, want at most %d", page, reads, limit)
		}
		for _, w := range resp.GetWorkers() {
			seen = append(seen, w.GetWorkerId())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		if page > 5 {
			t.Fatal("too many pages")
		}
	}
	if len(seen) != 3 {
		t.Fatalf("acme's workers: %v", seen)
	}
	for i, id := range seen {
		if !strings.HasPrefix(id, "acme.") || i > 0 && seen[i-1] >= id {
			t.Fatalf("acme's workers, in id order: %v", seen)
		}
	}
}
