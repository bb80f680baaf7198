package catalog_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
)

// TestTenantIndex: issue 32 item 6. SaveWorker and DeleteWorker keep each
// tenant's index; workers saved before it existed are found once, from the
// global index, the first time their tenant's index is read; pages of a
// tenant's list hold only its workers.
func TestTenantIndex(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := catalog.New(store)
	var acme, globex []string
	for range 5 {
		a, g := tenant.WorkerID("acme", uuid.New()), tenant.WorkerID("globex", uuid.New())
		acme, globex = append(acme, a), append(globex, g)
		for _, id := range []string{a, g} {
			if err := c.SaveWorker(ctx, catalog.Worker{ID: id, Topic: "t"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	def := uuid.NewString() // the default tenant's ids are bare
	if err := c.SaveWorker(ctx, catalog.Worker{ID: def, Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	// Workers from before the tenant index: drop its keys.
	for _, k := range store.Keys() {
		if strings.Contains(k, "tenant-index/") {
			if err := store.Delete(ctx, k, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	later := tenant.WorkerID("acme", uuid.New())
	if err := c.SaveWorker(ctx, catalog.Worker{ID: later, Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	acme = append(acme, later)
	slices.Sort(acme)
	slices.Sort(globex)
	for tn, want := range map[string][]string{"acme": acme, "globex": globex, tenant.Default: {def}, "initech": nil} {
		got, err := c.TenantWorkerIDs(ctx, tn)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("%s: %v %v, want %v", tn, got, err, want)
		}
	}
	if err := c.DeleteWorker(ctx, acme[0]); err != nil {
		t.Fatal(err)
	}
	got, _ := c.TenantWorkerIDs(ctx, "acme")
	if !slices.Equal(got, acme[1:]) {
		t.Fatalf("after a delete: %v, want %v", got, acme[1:])
	}
	ws, more, err := c.ListTenantWorkers(ctx, "acme", acme[1], 2)
	if err != nil || !more || len(ws) != 2 || ws[0].ID != acme[2] || ws[1].ID != acme[3] {
		t.Fatalf("page after %s: %v %v %v", acme[1], ws, more, err)
	}
	ws, more, err = c.ListTenantWorkers(ctx, "acme", acme[3], 10)
	if err != nil || more || len(ws) != 2 {
		t.Fatalf("last page: %v %v %v", ws, more, err)
	}
	all, more, err := c.ListWorkersAfter(ctx, "", 100)
	if err != nil || more || len(all) != len(acme)-1+len(globex)+1 {
		t.Fatalf("every tenant: %d %v %v", len(all), more, err)
	}
}
