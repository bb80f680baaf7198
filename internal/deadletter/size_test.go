package deadletter

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/state"
)

// storeLimit is daprd's default --max-body-size: a larger save is refused.
const storeLimit = 4 << 20

// Issue 43, item 10: a dead letter too large for the store (an event with
// an 8.5 MiB id) was never written, and its event was answered RETRY for
// ever. It is stored cut down to what fits (its event left out, its id
// replaced by a hash), every time, and can be listed and removed.
func TestDeadLetterTooLargeForTheStoreIsStoredTruncated(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	s := NewStore(state.WithMaxValueBytes(st, storeLimit), 0)
	id := strings.Repeat("i", 8<<20+512<<10)
	e := entry("w1", id, "timeout", 1)
	for i := range 2 { // a redelivery adds it again: same outcome, one entry
		if err := s.Add(ctx, e); err != nil {
			t.Fatalf("Add %d of a dead letter with an 8.5 MiB id: %v", i+1, err)
		}
	}
	got, err := s.List(ctx, "w1", Filter{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("%d entries, want 1", len(got))
	}
	g := got[0]
	if len(g.EventID) > 1024 || g.EventID == id || !g.Truncated || g.Reason != "timeout" || g.Attempts != 3 {
		t.Fatalf("stored entry: id of %d bytes, truncated %v, reason %q, attempts %d", len(g.EventID), g.Truncated, g.Reason, g.Attempts)
	}
	if n, _ := s.Count(ctx, "w1", Filter{Replayable: true}); n != 0 {
		t.Fatalf("an entry without its event counts as replayable (%d)", n)
	}
	if err := s.Remove(ctx, "w1", g); err != nil {
		t.Fatal(err)
	}
	if len(st.Keys()) != 0 {
		t.Fatalf("left behind: %d keys", len(st.Keys()))
	}
}

// Issue 43, item 10: an owner's index of ordinary ids grew past what the
// store takes long before its 10,000-entry cap, and from then on no dead
// letter of that owner could be added. The index is bounded by bytes too:
// the oldest entries are dropped to keep it well under the store's limit.
func TestIndexBoundedByBytes(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemoryStore()
	s := NewStore(state.WithMaxValueBytes(st, storeLimit), 0)
	// An index just under the store's limit, of ordinary (400-byte) ids, under the 10,000-entry cap.
	var x index
	size := 0
	for i := 0; ; i++ {
		r := ref{Key: entryKey("w1", "shop", fmt.Sprint(i)), EventID: fmt.Sprintf("%0400d", i), Reason: "timeout", AtMS: int64(i + 1)}
		b, _ := json.Marshal(r)
		if size+len(b)+64 > storeLimit {
			break
		}
		size += len(b) + 1
		x.Entries = append(x.Entries, r)
	}
	b, _ := json.Marshal(x)
	if err := st.Put(ctx, indexKey("w1"), b, state.PutOptions{IfAbsent: true}); err != nil {
		t.Fatal(err)
	}
	t.Logf("index of %d entries, %d bytes", len(x.Entries), len(b))
	for i := range 3 {
		if err := s.Add(ctx, entry("w1", fmt.Sprintf("%0300d", 1_000_000+i), "timeout", int64(1_000_000+i))); err != nil {
			t.Fatalf("Add %d to a full index: %v", i+1, err)
		}
	}
	it, err := st.Get(ctx, indexKey("w1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(it.Value) > MaxIndexBytes {
		t.Fatalf("index of %d bytes, over %d", len(it.Value), MaxIndexBytes)
	}
	if n, _ := s.Count(ctx, "w1", Filter{EventIDs: []string{fmt.Sprintf("%0300d", 1_000_002)}}); n != 1 {
		t.Fatal("the newest entry is not indexed")
	}
}
