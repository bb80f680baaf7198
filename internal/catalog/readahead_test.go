package catalog_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
)

// A change's history keys, read ahead (ReadAheadForApply), cost no read of
// their own: of a create's and a reload's writes only the record's check
// reads on its own. What they write is what they wrote without it.
func TestReadAheadLeavesOnlyTheRecordsReadOnTheWay(t *testing.T) {
	store := &bulkCounter{MemoryStore: state.NewMemoryStore()}
	c := catalog.New(store)
	bg := context.Background()
	w := catalog.Worker{ID: "w", Topic: "t", Incarnation: "i", Revision: 1, Status: catalog.StatusRunning, CodeSHA256: "a", CodeVersion: 1}
	change := func(w catalog.Worker, h catalog.HistoryEntry) {
		t.Helper()
		ctx := c.ReadAheadForApply(bg, w, &h)
		read, err := c.CheckWrite(ctx, w)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AppendHistory(ctx, w.ID, h); err != nil {
			t.Fatal(err)
		}
		if err := c.SaveWorkerOver(ctx, w, read); err != nil {
			t.Fatal(err)
		}
		if got := store.reads(); len(got) != 1 || !strings.HasSuffix(got[0], "/"+w.ID) {
			t.Fatalf("%s: single reads %v; want only the record's", h.Action, got)
		}
	}
	now := time.Now().UTC()
	change(w, catalog.HistoryEntry{Version: 1, SHA256: "a", SourceKind: "content", Action: catalog.HistoryCreate, CreatedAt: now, Revision: 1})
	w.Revision, w.CodeVersion, w.CodeSHA256 = 2, 2, "b"
	change(w, catalog.HistoryEntry{Version: 2, SHA256: "b", SourceKind: "content", Action: catalog.HistoryLoadCode, CreatedAt: now, Revision: 2})
	h, err := c.History(bg, "w")
	if err != nil || len(h) != 2 || h[0].SHA256 != "a" || h[1].SHA256 != "b" {
		t.Fatalf("history: %+v %v", h, err)
	}
	if got, err := c.GetWorker(bg, "w"); err != nil || got.Revision != 2 || got.CodeSHA256 != "b" {
		t.Fatalf("record: %+v %v", got, err)
	}
	if ids, err := c.WorkerIDs(bg); err != nil || len(ids) != 1 {
		t.Fatalf("index: %v %v", ids, err)
	}
}
