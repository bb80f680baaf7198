package catalog

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// A blob is collected only once no worker's history names it and the
// grace period has passed; shared and re-used blobs stay, also blobs of
// histories written before the collection existed.
func TestSweepCodeCollectsUnreferencedBlobsAfterGrace(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := New(store)
	put := func(body string) string {
		sha, err := c.PutCode(ctx, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return sha
	}
	appendHistory := func(id, sha string, v int64) {
		if err := c.AppendHistory(ctx, id, HistoryEntry{Version: v, SHA256: sha, SourceKind: "content"}); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(sha string) bool {
		_, err := c.GetCode(ctx, sha)
		if err != nil && !errors.Is(err, state.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	sweep := func(after time.Duration) int {
		n, err := c.SweepCode(ctx, time.Hour, time.Now().Add(after))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	only, shared, legacy := put("only a"), put("shared by a and b"), put("stored before references")
	appendHistory("a", only, 1)
	appendHistory("a", shared, 2)
	appendHistory("a", only, 3) // a rollback: the same blob again
	appendHistory("b", shared, 1)
	appendHistory("old", legacy, 1)
	if err := c.SaveWorker(ctx, Worker{ID: "b"}); err != nil { // b is in the index: its history counts
		t.Fatal(err)
	}

	for _, id := range []string{"a", "old"} {
		if err := c.DeleteWorker(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if n := sweep(30 * time.Minute); n != 0 || !exists(only) {
		t.Fatalf("within the grace period: %d deleted, only-a exists %v", n, exists(only))
	}
	if n := sweep(2 * time.Hour); n != 2 || exists(only) || !exists(shared) || exists(legacy) {
		t.Fatalf("after the grace period: %d deleted; exists: only-a %v, shared %v, legacy %v", n, exists(only), exists(shared), exists(legacy))
	}
	if n := sweep(3 * time.Hour); n != 0 {
		t.Fatalf("a second sweep deleted %d", n)
	}

	// b's delete orphans the shared blob; a create of the same code within
	// the grace period (PutCode, then its history) keeps it.
	if err := c.DeleteWorker(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	put("shared by a and b")
	appendHistory("c", shared, 1)
	if err := c.SaveWorker(ctx, Worker{ID: "c"}); err != nil {
		t.Fatal(err)
	}
	if n := sweep(2 * time.Hour); n != 0 || !exists(shared) {
		t.Fatalf("a blob used again was collected (%d deleted)", n)
	}
	for page := range OrphanPages {
		orphans, _, err := state.GetJSON[map[string]time.Time](ctx, store, orphansPrefix+strconv.Itoa(page))
		if err != nil || len(orphans) != 0 {
			t.Fatalf("orphan index page %d: %v, %v", page, orphans, err)
		}
	}
}

// hookStore runs onHistory once, when the sweep's history scan reads the
// history of worker "other".
type hookStore struct {
	*state.MemoryStore
	onHistory func()
}

func (s *hookStore) Get(ctx context.Context, key string) (state.Item, error) {
	if key == historyHeadKey("other") && s.onHistory != nil {
		f := s.onHistory
		s.onHistory = nil
		f()
	}
	return s.MemoryStore.Get(ctx, key)
}

// Issue 33 item 7: a create that stores a candidate blob again while a
// sweep scans the histories (the new worker has no history yet: it gets
// one only after its engine load) keeps it: the sweep deletes only what is
// still listed as it read it, and only the blob as it was before the scan.
func TestSweepKeepsABlobStoredAgainDuringTheScan(t *testing.T) {
	for name, again := range map[string]func(c *Catalog, store *hookStore, body string){
		// PutCode as a create runs it: the blob, then off the index.
		"PutCode": func(c *Catalog, _ *hookStore, body string) {
			if _, err := c.PutCode(context.Background(), []byte(body)); err != nil {
				t.Fatal(err)
			}
		},
		// Only the blob written, its index update not yet made.
		"blob only": func(_ *Catalog, store *hookStore, body string) {
			if err := store.MemoryStore.Put(context.Background(), codePrefix+SHA256([]byte(body)), []byte(body), state.PutOptions{}); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			store := &hookStore{MemoryStore: state.NewMemoryStore()}
			c := New(store)
			body := "shared code"
			sha, err := c.PutCode(ctx, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if err := c.AppendHistory(ctx, "gone", HistoryEntry{Version: 1, SHA256: sha}); err != nil {
				t.Fatal(err)
			}
			if err := c.SaveWorker(ctx, Worker{ID: "other"}); err != nil { // a worker whose history the sweep reads
				t.Fatal(err)
			}
			if err := c.DeleteWorker(ctx, "gone"); err != nil {
				t.Fatal(err)
			}
			store.onHistory = func() { again(c, store, body) }
			n, err := c.SweepCode(ctx, time.Hour, time.Now().Add(2*time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.GetCode(ctx, sha); n != 0 || err != nil {
				t.Fatalf("the blob stored again during the scan was collected: %d deleted, %v", n, err)
			}
		})
	}
}

// failDeleteOnce is a store whose first Delete of one key fails.
type failDeleteOnce struct {
	state.Store
	key    string
	failed bool
}

func (f *failDeleteOnce) Delete(ctx context.Context, key, etag string) error {
	if key == f.key && !f.failed {
		f.failed = true
		return errors.New("store unavailable")
	}
	return f.Store.Delete(ctx, key, etag)
}

// Put fails the first write of the key's tombstone (the removal of a
// worker's record, issue 43 item 1).
func (f *failDeleteOnce) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	if key == f.key && !f.failed && bytes.Contains(value, []byte(`"deleted":true`)) {
		f.failed = true
		return errors.New("store unavailable")
	}
	return f.Store.Put(ctx, key, value, opts)
}

// Issue 33 item 7: DeleteWorker itself marks the worker's code before it
// removes anything, so a delete cut off after the history went and retried
// (reading no history) still leaves the blob to the sweep.
func TestDeleteWorkerCutOffAfterTheHistoryStillCollectsTheCode(t *testing.T) {
	ctx := context.Background()
	store := &failDeleteOnce{Store: state.NewMemoryStore(), key: workerKey("w")}
	c := New(store)
	sha, err := c.PutCode(ctx, []byte("code of w"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AppendHistory(ctx, "w", HistoryEntry{Version: 1, SHA256: sha}); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorker(ctx, Worker{ID: "w"}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteWorker(ctx, "w"); err == nil {
		t.Fatal("the first delete should fail after removing the history")
	}
	if err := c.DeleteWorker(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.SweepCode(ctx, time.Hour, time.Now().Add(2*time.Hour)); n != 1 || err != nil {
		t.Fatalf("swept %d, %v; want the blob collected", n, err)
	}
}

// ReadAheadForPutCode reads the orphan index beside the caller's check: a
// blob listed there is taken off it when stored, one not listed is stored,
// and a body is stored under its own SHA-256 whatever page was read ahead.
func TestPutCodeReadAheadTakesAListedBlobOffTheIndex(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := New(store)
	body := []byte("shared code")
	sha := SHA256(body)
	if err := c.orphanCode(ctx, []HistoryEntry{{SHA256: sha}}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.PutCode(c.ReadAheadForPutCode(ctx, sha), body); got != sha || err != nil {
		t.Fatalf("listed: %s %v", got, err)
	}
	listed, _, err := state.GetJSON[map[string]time.Time](ctx, store, orphansKey(sha))
	if _, ok := listed[sha]; ok || err != nil {
		t.Fatalf("the blob stored is still a candidate: %v %v", listed, err)
	}
	if b, err := c.GetCode(ctx, sha); err != nil || !bytes.Equal(b, body) {
		t.Fatalf("stored: %q %v", b, err)
	}

	other := []byte("new code")
	if got, err := c.PutCode(c.ReadAheadForPutCode(ctx, SHA256(other)), other); got != SHA256(other) || err != nil {
		t.Fatalf("not listed: %s %v", got, err)
	}
	if _, err := c.GetCode(ctx, SHA256(other)); err != nil {
		t.Fatal(err)
	}

	wrong := SHA256([]byte("another body"))
	if got, err := c.PutCode(c.ReadAheadForPutCode(ctx, wrong), body); got != sha || err != nil {
		t.Fatalf("a body read ahead under another's SHA-256: stored as %s, %v", got, err)
	}
	if _, err := c.GetCode(ctx, wrong); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("something was stored under the wrong SHA-256: %v", err)
	}
}

// readSignal closes read once a read of key (single or bulk) has answered.
type readSignal struct {
	*state.MemoryStore
	key  string
	once sync.Once
	read chan struct{}
}

func (r *readSignal) Get(ctx context.Context, key string) (state.Item, error) {
	it, err := r.MemoryStore.Get(ctx, key)
	if key == r.key {
		r.once.Do(func() { close(r.read) })
	}
	return it, err
}

func (r *readSignal) GetMany(ctx context.Context, keys []string) ([]state.Result, error) {
	res, err := r.MemoryStore.GetMany(ctx, keys)
	if slices.Contains(keys, r.key) {
		r.once.Do(func() { close(r.read) })
	}
	return res, err
}

// A page of the orphan index that changes between its read ahead
// (ReadAheadForPutCode) and the store (another blob listed on it): the write over the page as read
// fails its condition, and the blob is taken off the page as it is now,
// the other candidate kept.
func TestPutCodeReadAheadOverAPageChangedMeanwhile(t *testing.T) {
	ctx := context.Background()
	body := []byte("listed again")
	sha := SHA256(body)
	store := &readSignal{MemoryStore: state.NewMemoryStore(), key: orphansKey(sha), read: make(chan struct{})}
	c := New(store)
	if err := c.orphanCode(ctx, []HistoryEntry{{SHA256: sha}}); err != nil {
		t.Fatal(err)
	}
	var neighbour string // a blob listed on the same page
	for i := 0; neighbour == ""; i++ {
		if s := SHA256([]byte(strconv.Itoa(i))); orphansKey(s) == orphansKey(sha) {
			neighbour = s
		}
	}
	ahead := c.ReadAheadForPutCode(ctx, sha)
	<-store.read
	if err := c.orphanCode(ctx, []HistoryEntry{{SHA256: neighbour}}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.PutCode(ahead, body); got != sha || err != nil {
		t.Fatalf("store: %s %v", got, err)
	}
	page, _, err := state.GetJSON[map[string]time.Time](ctx, store.MemoryStore, orphansKey(sha))
	if _, listed := page[sha]; listed || err != nil {
		t.Fatalf("the blob stored is still listed: %v %v", page, err)
	}
	if _, listed := page[neighbour]; !listed {
		t.Fatalf("the candidate listed meanwhile was lost: %v", page)
	}
	if b, err := c.GetCode(ctx, sha); err != nil || !bytes.Equal(b, body) {
		t.Fatalf("stored: %q %v", b, err)
	}
}
