package catalog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
)

// listChunks lists the whole index in chunks of at most maxBytes and
// checks each chunk's size.
func listChunks(t *testing.T, c *catalog.Catalog, maxBytes int) (all []string, chunks int) {
	t.Helper()
	cur := catalog.IndexCursor{}
	for !cur.Done() {
		chunks++
		if chunks > 100_000 {
			t.Fatal("listing does not end")
		}
		ch, err := c.WorkerIDsChunk(context.Background(), cur, maxBytes)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(ch.IDs)
		if len(ch.IDs) > 1 && len(b) > maxBytes {
			t.Fatalf("chunk of %d bytes, more than %d", len(b), maxBytes)
		}
		if ch.Next.Page < cur.Page || (ch.Next.Page == cur.Page && ch.Next.After <= cur.After) {
			t.Fatalf("cursor went from %+v to %+v", cur, ch.Next)
		}
		all = append(all, ch.IDs...)
		cur = ch.Next
	}
	return all, chunks
}

// Issue 43 item 6: a page of the index at a million workers (62,500 ids,
// 2.4 MB) is listed in chunks of at most IndexChunkBytes, every id once.
func TestWorkerIDsChunkBoundsAMillionWorkersPage(t *testing.T) {
	store := state.NewMemoryStore()
	ids := make([]string, 62_500)
	for i := range ids {
		ids[i] = fmt.Sprintf("acme.%032d", len(ids)-i) // not in order on the page
	}
	b, _ := json.Marshal(ids)
	if len(b) < 2<<20 {
		t.Fatalf("page of %d bytes: not over 2 MiB", len(b))
	}
	if err := store.Put(context.Background(), state.KeyPrefix+"index/3", b, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	all, chunks := listChunks(t, catalog.New(store), catalog.IndexChunkBytes)
	if want := len(b)/catalog.IndexChunkBytes + catalog.IndexPages; chunks > want+1 {
		t.Errorf("%d chunks, want at most %d", chunks, want+1)
	}
	slices.Sort(ids)
	if !slices.Equal(all, ids) {
		t.Fatalf("listed %d ids, want the %d on the page", len(all), len(ids))
	}
}

// The cursor names the last id taken, not a position: ids deleted or
// added after it while the index is listed neither shift nor hide the
// others; a deleted cursor id is no obstacle; an id longer than the bound
// comes alone; the one-key index of earlier versions is migrated.
func TestWorkerIDsChunkCursor(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := catalog.New(store)
	var want []string
	for i := range 40 {
		id := fmt.Sprintf("w%02d", i)
		want = append(want, id)
		if err := c.SaveWorker(ctx, catalog.Worker{ID: id, Topic: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	legacy, _ := json.Marshal([]string{"old"})
	if err := store.Put(ctx, state.KeyPrefix+"index", legacy, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	want = append(want, "old")
	all, _ := listChunks(t, c, 20)
	slices.Sort(all)
	slices.Sort(want)
	if !slices.Equal(all, want) {
		t.Fatalf("listed %v, want %v", all, want)
	}

	// Take a first chunk of the page of w05, then delete every id of it
	// and add one after it: the rest of the page is listed, and the new one.
	page := -1
	for p := range catalog.IndexPages {
		ch, err := c.WorkerIDsChunk(ctx, catalog.IndexCursor{Page: p}, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(ch.IDs, "w05") {
			page = p
		}
	}
	first, err := c.WorkerIDsChunk(ctx, catalog.IndexCursor{Page: page}, 8) // one id
	if err != nil || len(first.IDs) != 1 || first.Next.Page != page {
		t.Fatalf("first chunk %+v %v", first, err)
	}
	rest, err := c.WorkerIDsChunk(ctx, first.Next, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteWorker(ctx, first.IDs[0]); err != nil {
		t.Fatal(err)
	}
	again, err := c.WorkerIDsChunk(ctx, first.Next, 1<<20)
	if err != nil || !slices.Equal(again.IDs, rest.IDs) || again.Next != (catalog.IndexCursor{Page: page + 1}) {
		t.Fatalf("after deleting the cursor's id: %+v %v, want %v", again, err, rest.IDs)
	}

	big := fmt.Sprintf("%0100d", 7)
	if err := c.SaveWorker(ctx, catalog.Worker{ID: big, Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	all, _ = listChunks(t, c, 10)
	if !slices.Contains(all, big) {
		t.Fatalf("an id longer than the bound is not listed")
	}
	if done, err := c.WorkerIDsChunk(ctx, catalog.IndexCursor{Page: catalog.IndexPages}, 10); err != nil || len(done.IDs) != 0 || !done.Next.Done() {
		t.Fatalf("listing past the end: %+v %v", done, err)
	}
}
