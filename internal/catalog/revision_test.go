package catalog_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
)

// Issue 43 item 1: a write of a worker's record is conditional on the
// revision the workflow last committed: a late write of an older change
// (a stale Apply attempt) never replaces a newer record, a deleted
// worker's incarnation is never written back (tombstone), and only a new
// incarnation (a create in a new run) may write over the tombstone.
func TestStaleRecordWritesAreRefused(t *testing.T) {
	ctx := context.Background()
	c := catalog.New(state.NewMemoryStore())
	w := catalog.Worker{ID: "w1", Topic: "t", Status: catalog.StatusRunning, CodeVersion: 1, Revision: 1, Incarnation: "run-a"}
	if err := c.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorker(ctx, w); err != nil {
		t.Fatalf("a retry of the same write: %v", err)
	}
	stopped := w
	stopped.Status, stopped.Revision = catalog.StatusStopped, 2
	if err := c.SaveWorker(ctx, stopped); err != nil {
		t.Fatal(err)
	}
	// The create's write, late: it must not turn the stop back.
	if err := c.SaveWorker(ctx, w); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("late write of revision 1 over 2: %v, want ErrStale", err)
	}
	if got, _ := c.GetWorker(ctx, "w1"); got.Status != catalog.StatusStopped {
		t.Fatalf("record %+v, want the stop kept", got)
	}
	// Another incarnation never writes over a live record.
	other := w
	other.Incarnation, other.Revision = "run-b", 5
	if err := c.SaveWorker(ctx, other); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("another incarnation over a live record: %v, want ErrStale", err)
	}

	if err := c.RemoveWorker(ctx, stopped); err != nil {
		t.Fatal(err)
	}
	// The create's write, later still: the worker stays deleted.
	if err := c.SaveWorker(ctx, w); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("late write after delete: %v, want ErrStale", err)
	}
	if _, err := c.GetWorker(ctx, "w1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("GetWorker after delete: %v", err)
	}
	if ids, _ := c.WorkerIDs(ctx); slices.Contains(ids, "w1") {
		t.Fatalf("index after a late write: %v", ids)
	}
	if ws, _ := c.ListWorkers(ctx); len(ws) != 0 {
		t.Fatalf("list after delete: %+v", ws)
	}
	// A create in a new run (after a failed create) is a new incarnation.
	if err := c.SaveWorker(ctx, other); err != nil {
		t.Fatalf("new incarnation over the tombstone: %v", err)
	}
	if got, err := c.GetWorker(ctx, "w1"); err != nil || got.Incarnation != "run-b" {
		t.Fatalf("record %+v %v", got, err)
	}
	// A late delete of the old incarnation does not remove the new one.
	if err := c.RemoveWorker(ctx, stopped); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("late delete of another incarnation: %v, want ErrStale", err)
	}
	if _, err := c.GetWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
}

// Issue 43 item 3: a delete of a worker whose record was never written (a
// failed create's undo) leaves a tombstone too, so the create's own late
// write cannot bring it back.
func TestRemoveOfAnUnwrittenRecordRefusesItsLateWrite(t *testing.T) {
	ctx := context.Background()
	c := catalog.New(state.NewMemoryStore())
	w := catalog.Worker{ID: "w1", Topic: "t", Status: catalog.StatusRunning, CodeVersion: 1, Revision: 1, Incarnation: "run-a"}
	if err := c.RemoveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorker(ctx, w); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("late write after the undo: %v, want ErrStale", err)
	}
	if _, err := c.GetWorker(ctx, "w1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("GetWorker: %v", err)
	}
}

// A change of a live worker (a stop, a start, a reload: its incarnation's
// record is there) reads its record once and no index page: the record is
// written only after its ids were indexed, and only a delete takes them
// out. A create, a create over a tombstone (a new incarnation) and a save
// whose record was removed meanwhile index the worker as before.
func TestSavingALiveWorkerReadsNoIndex(t *testing.T) {
	ctx := context.Background()
	store, c, w := savedLive(t)
	if r := store.reads(); !slices.ContainsFunc(r, func(k string) bool { return strings.Contains(k, "index") }) {
		t.Fatalf("a create read %v: no index page", r)
	}

	stopped := w
	stopped.Status, stopped.Revision = catalog.StatusStopped, 2
	read, err := c.CheckWrite(ctx, stopped)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorkerOver(ctx, stopped, read); err != nil {
		t.Fatal(err)
	}
	if r := store.reads(); len(r) != 1 || !strings.HasSuffix(r[0], "workers/w1") {
		t.Fatalf("a stop read %v, want its record once", r)
	}
	// Written over by another change since CheckWrite read it: the write
	// is refused on its ETag, the record read again and admitted.
	started := stopped
	started.Status, started.Revision = catalog.StatusRunning, 3
	read, err = c.CheckWrite(ctx, started)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorker(ctx, started); err != nil {
		t.Fatal(err)
	}
	store.reads()
	if err := c.SaveWorkerOver(ctx, started, read); err != nil {
		t.Fatalf("the same change over a record written since: %v", err)
	}
	late := stopped
	if err := c.SaveWorkerOver(ctx, late, read); !errors.Is(err, catalog.ErrStale) {
		t.Fatalf("a late stop over a read older than the start: %v, want ErrStale", err)
	}
	if got, _ := c.GetWorker(ctx, "w1"); got.Status != catalog.StatusRunning || got.Revision != 3 {
		t.Fatalf("record %+v, want the start's", got)
	}
	if ids, _ := c.WorkerIDs(ctx); !slices.Equal(ids, []string{"w1"}) {
		t.Fatalf("index %v, want w1", ids)
	}

	// Deleted, then created again in a new run: indexed again.
	if err := c.RemoveWorker(ctx, started); err != nil {
		t.Fatal(err)
	}
	again := catalog.Worker{ID: "w1", Topic: "t", Status: catalog.StatusRunning, Revision: 1, Incarnation: "run-b"}
	if err := c.SaveWorker(ctx, again); err != nil {
		t.Fatal(err)
	}
	if ids, _ := c.WorkerIDs(ctx); !slices.Equal(ids, []string{"w1"}) {
		t.Fatalf("index after a create over the tombstone %v, want w1", ids)
	}
	if ws, _, _ := c.ListTenantWorkers(ctx, tenant.Of("w1"), "", 10); len(ws) != 1 {
		t.Fatalf("tenant list %v, want w1", ws)
	}

	// A record removed (not tombstoned) between the read and the write:
	// the save indexes it again.
	read, err = c.CheckWrite(ctx, again)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteWorker(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, state.KeyPrefix+"workers/w1", ""); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorkerOver(ctx, again, read); err != nil {
		t.Fatal(err)
	}
	if ids, _ := c.WorkerIDs(ctx); !slices.Equal(ids, []string{"w1"}) {
		t.Fatalf("index after a save over a removed record %v, want w1", ids)
	}
}

// A delete reads the worker's record once (in the bulk read of the keys
// it reads first): its tombstone is written over the read its check
// made. A record written between the two (a late change of the same
// incarnation, a new incarnation) fails the tombstone's write on its ETag
// and is read again: the first is tombstoned all the same, the second
// refused as stale and kept.
func TestRemovingAWorkerReadsItsRecordOnce(t *testing.T) {
	ctx := context.Background()
	for _, between := range []string{"", "late change", "new incarnation"} {
		store := &writeBetween{bulkCounter: &bulkCounter{MemoryStore: state.NewMemoryStore()}}
		c := catalog.New(store)
		w := catalog.Worker{ID: "w1", Topic: "t", Status: catalog.StatusRunning, Revision: 1, Incarnation: "run-a"}
		if err := c.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
		store.reads()
		store.bulkReads()
		var written catalog.Worker
		if between != "" {
			written = w
			written.Revision = 2
			if between == "new incarnation" {
				written.Revision, written.Incarnation = 1, "run-b"
			}
			// Written while the delete takes the worker out of its
			// index, after its check read the record (a new incarnation
			// after another delete's tombstone, as a create in a new run
			// writes one).
			store.hook = func() {
				other := catalog.New(store.MemoryStore)
				if between == "new incarnation" {
					if err := other.RemoveWorker(ctx, w); err != nil {
						t.Error(err)
					}
				}
				if err := other.SaveWorker(ctx, written); err != nil {
					t.Error(err)
				}
			}
		}
		err := c.RemoveWorker(ctx, w)
		var recordReads int
		for _, k := range append(store.reads(), store.bulkReads()...) {
			if strings.HasSuffix(k, "workers/w1") {
				recordReads++
			}
		}
		got, gerr := c.GetWorker(ctx, "w1")
		switch between {
		case "":
			if err != nil || recordReads != 1 || !errors.Is(gerr, catalog.ErrNotFound) {
				t.Fatalf("a delete: err %v, the record read %d times (want once), then %+v %v (want none)", err, recordReads, got, gerr)
			}
		case "late change":
			if err != nil || recordReads != 2 || !errors.Is(gerr, catalog.ErrNotFound) {
				t.Fatalf("a delete over a late change: err %v, the record read %d times (want twice), then %+v %v (want none)", err, recordReads, got, gerr)
			}
		case "new incarnation":
			if !errors.Is(err, catalog.ErrStale) || gerr != nil || got.Incarnation != "run-b" {
				t.Fatalf("a delete over a new incarnation: err %v (want ErrStale), then %+v %v (want run-b's record)", err, got, gerr)
			}
		}
	}
}

// writeBetween runs hook once, before the first write of an index page
// (a delete takes its worker out of its index after its check read the
// record). The delete writes its two index pages side by side: the
// other waits until the hook has run.
type writeBetween struct {
	*bulkCounter
	mu   sync.Mutex
	hook func()
}

func (s *writeBetween) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	if strings.Contains(key, "index") {
		s.mu.Lock()
		if h := s.hook; h != nil {
			s.hook = nil
			h()
		}
		s.mu.Unlock()
	}
	return s.bulkCounter.Put(ctx, key, value, opts)
}

// A delete reads everything it needs in bulk: the record, the history's
// head and legacy array and both index pages in one read at its start,
// the history's entries in another and the collection index's pages in a
// third; no key is read on its own (each single read was a round trip on
// the delete's path: sixteen of them for a worker with two versions).
func TestRemovingAWorkerReadsInBulk(t *testing.T) {
	ctx := context.Background()
	store, c, w := savedLive(t)
	for v, body := range []string{"v1", "v2 in another orphan page, likely"} {
		sha, err := c.PutCode(ctx, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AppendHistory(ctx, w.ID, catalog.HistoryEntry{Version: int64(v + 1), SHA256: sha, SourceKind: "content"}); err != nil {
			t.Fatal(err)
		}
	}
	store.reads()
	store.bulkReads()
	if err := c.RemoveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	single, bulk := store.reads(), store.bulkReads()
	if len(single) != 0 || !slices.ContainsFunc(bulk, func(k string) bool { return strings.HasSuffix(k, "workers/w1") }) {
		t.Fatalf("a delete read %q on their own (want none) and %q in bulk (want the record among them)", single, bulk)
	}
	if _, err := c.GetWorker(ctx, w.ID); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("after the delete: %v, want not found", err)
	}
	if h, _, err := c.HistoryPage(ctx, w.ID, 0, 10); err != nil || len(h) != 0 {
		t.Fatalf("history after the delete: %v %v, want none", h, err)
	}
	if ids, err := c.WorkerIDs(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("index after the delete: %v %v, want empty", ids, err)
	}
}

// savedLive is a catalog over a store that counts its reads, holding one
// live worker, w1 (created: the reads of its create are counted).
func savedLive(t *testing.T) (*bulkCounter, *catalog.Catalog, catalog.Worker) {
	t.Helper()
	store := &bulkCounter{MemoryStore: state.NewMemoryStore()}
	c := catalog.New(store)
	w := catalog.Worker{ID: "w1", Topic: "t", Status: catalog.StatusRunning, Revision: 1, Incarnation: "run-a"}
	if err := c.SaveWorker(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	return store, c, w
}
