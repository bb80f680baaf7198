package catalog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Issue 43 item 7: the history shows only the versions the record reached.
// A load cut off between its history entry and its record (the commit
// point) leaves an entry that History does not show, and the next load,
// which takes the same number, replaces it; a late write of the cut-off
// load (a lower revision) never replaces the entry of a later one, and the
// blob an entry named before it was replaced becomes a candidate for
// collection.
func TestHistoryShowsOnlyAppliedVersions(t *testing.T) {
	ctx := context.Background()
	c := New(state.NewMemoryStore())
	show := func() string {
		t.Helper()
		h, err := c.History(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range h {
			out = append(out, fmt.Sprintf("%d=%s", e.Version, e.SHA256))
		}
		return strings.Join(out, ",")
	}
	add := func(v, rev int64, sha string) error {
		return c.AppendHistory(ctx, "w", HistoryEntry{Version: v, SHA256: sha, SourceKind: "content", CreatedAt: time.Now().UTC(), Revision: rev})
	}
	save := func(v, rev int64, sha string) {
		t.Helper()
		if err := c.SaveWorker(ctx, Worker{ID: "w", CodeVersion: v, CodeSHA256: sha, Revision: rev, Status: StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
	if err := add(1, 1, "a"); err != nil {
		t.Fatal(err)
	}
	if got := show(); got != "" {
		t.Fatalf("history before the create's record: %q, want none", got)
	}
	save(1, 1, "a")
	if err := add(2, 2, "failed"); err != nil { // its record is never saved
		t.Fatal(err)
	}
	if got := show(); got != "1=a" {
		t.Fatalf("history after a load cut off before its record: %q, want 1=a", got)
	}
	if err := add(2, 3, "b"); err != nil { // the next load, same number
		t.Fatal(err)
	}
	save(2, 3, "b")
	if got := show(); got != "1=a,2=b" {
		t.Fatalf("history: %q, want 1=a,2=b", got)
	}
	if err := add(2, 2, "failed"); !errors.Is(err, ErrStale) {
		t.Fatalf("late write of the cut-off load: %v, want ErrStale", err)
	}
	if got := show(); got != "1=a,2=b" {
		t.Fatalf("history after the late write: %q, want 1=a,2=b", got)
	}
	listed, _, err := state.GetJSON[map[string]time.Time](ctx, c.store, orphansKey("failed"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := listed["failed"]; !ok {
		t.Fatal("the replaced entry's blob is not a candidate for collection")
	}
	// A deleted worker has no history to show.
	if err := c.DeleteWorker(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if got := show(); got != "" {
		t.Fatalf("history of a deleted worker: %q", got)
	}
}
