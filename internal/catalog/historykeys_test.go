package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Issue 43 item 6: a worker's history is one key per version, so no single
// state value grows with the number of versions.

// loadN appends versions from..to of worker id (blob "sha-<v>") and saves
// the record at each, as a node's Apply does.
func loadN(t *testing.T, c *Catalog, id string, from, to int64) {
	t.Helper()
	ctx := context.Background()
	for v := from; v <= to; v++ {
		sha := fmt.Sprintf("sha-%d", v)
		e := HistoryEntry{Version: v, SHA256: sha, SourceKind: "url", URL: "https://code.example/w.py", CreatedAt: time.Unix(v, 0).UTC(),
			Actor: "ops", Action: HistoryLoadCode, Revision: v}
		if err := c.AppendHistory(ctx, id, e); err != nil {
			t.Fatal(err)
		}
		if err := c.SaveWorker(ctx, Worker{ID: id, CodeVersion: v, CodeSHA256: sha, Revision: v, Status: StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
}

// largestPut records the largest value written to the store.
type largestPut struct {
	*state.MemoryStore
	mu  sync.Mutex
	max int
	key string
}

func (s *largestPut) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	s.mu.Lock()
	if len(value) > s.max {
		s.max, s.key = len(value), key
	}
	s.mu.Unlock()
	return s.MemoryStore.Put(ctx, key, value, opts)
}

func (s *largestPut) reset() (int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, k := s.max, s.key
	s.max, s.key = 0, ""
	return m, k
}

// The largest value a code load writes is the same after 2,000 versions as
// after 10: before, the whole history was one value rewritten by every
// load (4.29 MB after 2,000 URL loads, over daprd's 16 MiB near 7,000).
func TestALoadsWritesDoNotGrowWithTheVersions(t *testing.T) {
	store := &largestPut{MemoryStore: state.NewMemoryStore()}
	c := New(store)
	loadN(t, c, "w", 1, 10)
	store.reset()
	loadN(t, c, "w", 11, 11)
	early, earlyKey := store.reset()
	loadN(t, c, "w", 12, 2000)
	store.reset()
	loadN(t, c, "w", 2001, 2001)
	late, lateKey := store.reset()
	// A few more digits in the version, revision and times are all that may grow.
	if late > early+32 {
		t.Fatalf("the largest value load 11 wrote is %d bytes (%s), load 2,001's is %d bytes (%s): a load's write grows with the history",
			early, earlyKey, late, lateKey)
	}
	if late > 2048 {
		t.Fatalf("load 2,001 wrote a value of %d bytes (%s)", late, lateKey)
	}
	if h, err := c.History(context.Background(), "w"); err != nil || len(h) != 2001 {
		t.Fatalf("history: %d entries, %v; want 2001", len(h), err)
	}
}

func TestHistoryIsOneKeyPerVersionWithAHead(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := New(store)
	loadN(t, c, "w", 1, 3)
	for v := int64(1); v <= 3; v++ {
		e, _, err := state.GetJSON[HistoryEntry](ctx, store, historyEntryKey("w", v))
		if err != nil || e.Version != v || e.SHA256 != fmt.Sprintf("sha-%d", v) {
			t.Fatalf("key of version %d: %+v, %v", v, e, err)
		}
	}
	if h, _, err := state.GetJSON[historyHead](ctx, store, historyHeadKey("w")); err != nil || h.High != 3 {
		t.Fatalf("head: %+v, %v; want high 3", h, err)
	}
	if _, err := store.Get(ctx, legacyHistoryKey("w")); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("the one-array key was written: %v", err)
	}
	if e, ok, err := c.HistoryVersion(ctx, "w", 2); err != nil || !ok || e.SHA256 != "sha-2" {
		t.Fatalf("version 2: %+v %v %v", e, ok, err)
	}
	for _, v := range []int64{0, 4, -1} {
		if _, ok, err := c.HistoryVersion(ctx, "w", v); err != nil || ok {
			t.Fatalf("version %d: %v %v, want none", v, ok, err)
		}
	}
}

// The same entry written twice (a retried Apply) is one entry and no
// second write.
func TestAppendingTheSameEntryAgainWritesNothing(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := New(store)
	e := HistoryEntry{Version: 1, SHA256: "a", SourceKind: "content", CreatedAt: time.Now().UTC(), Revision: 1}
	if err := c.AppendHistory(ctx, "w", e); err != nil {
		t.Fatal(err)
	}
	before, _ := store.Get(ctx, historyEntryKey("w", 1))
	head, _ := store.Get(ctx, historyHeadKey("w"))
	if err := c.AppendHistory(ctx, "w", e); err != nil {
		t.Fatal(err)
	}
	if after, _ := store.Get(ctx, historyEntryKey("w", 1)); after.ETag != before.ETag {
		t.Fatal("the retry rewrote the entry")
	}
	if after, _ := store.Get(ctx, historyHeadKey("w")); after.ETag != head.ETag {
		t.Fatal("the retry rewrote the head")
	}
	if err := c.SaveWorker(ctx, Worker{ID: "w", CodeVersion: 1, CodeSHA256: "a", Revision: 1}); err != nil {
		t.Fatal(err)
	}
	if h, err := c.History(ctx, "w"); err != nil || len(h) != 1 {
		t.Fatalf("history %+v, %v; want one entry", h, err)
	}
	if err := c.AppendHistory(ctx, "w", HistoryEntry{Version: 0, SHA256: "a"}); err == nil {
		t.Fatal("an entry of version 0 was accepted")
	}
}

func TestHistoryPages(t *testing.T) {
	ctx := context.Background()
	c := New(state.NewMemoryStore())
	loadN(t, c, "w", 1, 2500)
	// An entry above the record (a load cut off before its record) is
	// never on a page.
	if err := c.AppendHistory(ctx, "w", HistoryEntry{Version: 2501, SHA256: "failed", Revision: 2501}); err != nil {
		t.Fatal(err)
	}
	var got []int64
	var sizes []int
	for after := int64(0); ; {
		page, next, err := c.HistoryPage(ctx, "w", after, MaxHistoryPage)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(page))
		for _, e := range page {
			got = append(got, e.Version)
		}
		if next == 0 {
			break
		}
		if next != page[len(page)-1].Version {
			t.Fatalf("next %d after a page ending at %d", next, page[len(page)-1].Version)
		}
		after = next
	}
	if fmt.Sprint(sizes) != "[1000 1000 500]" {
		t.Fatalf("page sizes %v, want [1000 1000 500]", sizes)
	}
	for i, v := range got {
		if v != int64(i+1) {
			t.Fatalf("entry %d is version %d: not oldest first without gaps", i, v)
		}
	}
	if page, next, err := c.HistoryPage(ctx, "w", 2497, 7); err != nil || len(page) != 3 || next != 0 {
		t.Fatalf("last short page: %d entries, next %d, %v", len(page), next, err)
	}
	if page, next, err := c.HistoryPage(ctx, "w", 2500, 7); err != nil || len(page) != 0 || next != 0 {
		t.Fatalf("page past the end: %d entries, next %d, %v", len(page), next, err)
	}
	for _, limit := range []int{0, -1, MaxHistoryPage + 1} {
		if _, _, err := c.HistoryPage(ctx, "w", 0, limit); err == nil {
			t.Fatalf("a page of %d entries was accepted", limit)
		}
	}
	if page, next, err := c.HistoryPage(ctx, "unknown", 0, 10); err != nil || len(page) != 0 || next != 0 {
		t.Fatalf("unknown worker: %v %d %v", page, next, err)
	}
}

// putLegacy writes a history as earlier versions did: one JSON array.
func putLegacy(t *testing.T, store state.Store, id string, entries []HistoryEntry) {
	t.Helper()
	b, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Put(context.Background(), legacyHistoryKey(id), b, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
}

func versions(t *testing.T, c *Catalog, id string) string {
	t.Helper()
	h, err := c.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range h {
		out = append(out, fmt.Sprintf("%d=%s", e.Version, e.SHA256))
	}
	return strings.Join(out, ",")
}

// A worker whose history is still the array of earlier versions shows all
// of it, in pages too; its next append moves it onto the per-version keys
// whole and deletes the array.
func TestLegacyHistoryArrayIsReadAndMovedByTheNextAppend(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := New(store)
	putLegacy(t, store, "w", []HistoryEntry{
		{Version: 1, SHA256: "a", SourceKind: "content"},
		{Version: 2, SHA256: "b", SourceKind: "content"},
		{Version: 3, SHA256: "c", SourceKind: "content"},
		{Version: 4, SHA256: "failed", SourceKind: "content", Revision: 4}, // a load cut off before its record
	})
	if err := c.SaveWorker(ctx, Worker{ID: "w", CodeVersion: 3, CodeSHA256: "c", Revision: 3}); err != nil {
		t.Fatal(err)
	}
	if got := versions(t, c, "w"); got != "1=a,2=b,3=c" {
		t.Fatalf("legacy history: %q", got)
	}
	if page, next, err := c.HistoryPage(ctx, "w", 1, 1); err != nil || len(page) != 1 || page[0].SHA256 != "b" || next != 2 {
		t.Fatalf("a page of the legacy history: %+v %d %v", page, next, err)
	}
	// The next load takes the failed load's number.
	if err := c.AppendHistory(ctx, "w", HistoryEntry{Version: 4, SHA256: "d", SourceKind: "content", Revision: 5}); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorker(ctx, Worker{ID: "w", CodeVersion: 4, CodeSHA256: "d", Revision: 5}); err != nil {
		t.Fatal(err)
	}
	if got := versions(t, c, "w"); got != "1=a,2=b,3=c,4=d" {
		t.Fatalf("history after the append: %q", got)
	}
	if _, err := store.Get(ctx, legacyHistoryKey("w")); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("the array is still stored: %v", err)
	}
	for v, sha := range map[int64]string{1: "a", 2: "b", 3: "c", 4: "d"} {
		if e, _, err := state.GetJSON[HistoryEntry](ctx, store, historyEntryKey("w", v)); err != nil || e.SHA256 != sha {
			t.Fatalf("key of version %d: %+v %v", v, e, err)
		}
	}
	listed, _, err := state.GetJSON[map[string]time.Time](ctx, store, orphansKey("failed"))
	if _, ok := listed["failed"]; !ok || err != nil {
		t.Fatalf("the replaced legacy entry's blob is not a candidate for collection (%v)", err)
	}
	// An array an older node wrote next to the keys (a rolling upgrade) is
	// read along and moved too.
	putLegacy(t, store, "w", []HistoryEntry{{Version: 5, SHA256: "e", SourceKind: "content", Revision: 6}})
	if err := c.SaveWorker(ctx, Worker{ID: "w", CodeVersion: 5, CodeSHA256: "e", Revision: 6}); err != nil {
		t.Fatal(err)
	}
	if got := versions(t, c, "w"); got != "1=a,2=b,3=c,4=d,5=e" {
		t.Fatalf("history with an older node's array: %q", got)
	}
	if err := c.DeleteWorker(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if left := historyKeys(store, "w"); len(left) != 0 {
		t.Fatalf("keys left after the delete: %v", left)
	}
}

func historyKeys(store *state.MemoryStore, id string) []string {
	var out []string
	for _, k := range store.Keys() {
		if strings.HasPrefix(k, legacyHistoryKey(id)) {
			out = append(out, k)
		}
	}
	return out
}

func TestDeleteRemovesEveryHistoryKey(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := New(store)
	loadN(t, c, "w", 1, 250)
	if err := c.AppendHistory(ctx, "w", HistoryEntry{Version: 251, SHA256: "failed", Revision: 251}); err != nil {
		t.Fatal(err)
	}
	loadN(t, c, "other", 1, 2)
	if err := c.DeleteWorker(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if left := historyKeys(store, "w"); len(left) != 0 {
		t.Fatalf("%d keys left after the delete, e.g. %v", len(left), left[0])
	}
	if got := versions(t, c, "other"); got != "1=sha-1,2=sha-2" {
		t.Fatalf("another worker's history: %q", got)
	}
}

// failingStore fails the first operation of each listed kind and key
// (once), as a store that goes away mid-way.
type failingStore struct {
	*state.MemoryStore
	mu       sync.Mutex
	putKey   string
	delKey   string
	failures int
}

func (s *failingStore) Put(ctx context.Context, key string, value []byte, opts state.PutOptions) error {
	s.mu.Lock()
	fail := key == s.putKey
	if fail {
		s.putKey = ""
		s.failures++
	}
	s.mu.Unlock()
	if fail {
		return errors.New("store unavailable")
	}
	return s.MemoryStore.Put(ctx, key, value, opts)
}

func (s *failingStore) Delete(ctx context.Context, key, etag string) error {
	s.mu.Lock()
	fail := key == s.delKey
	if fail {
		s.delKey = ""
		s.failures++
	}
	s.mu.Unlock()
	if fail {
		return errors.New("store unavailable")
	}
	return s.MemoryStore.Delete(ctx, key, etag)
}

// A delete that fails half-way through the history's keys is retried: the
// retry still finds the keys left (the head goes last), removes them all,
// and every blob the worker named is collected.
func TestDeleteCutOffMidHistoryIsFinishedByItsRetry(t *testing.T) {
	ctx := context.Background()
	store := &failingStore{MemoryStore: state.NewMemoryStore()}
	c := New(store)
	const n = 40
	for v := int64(1); v <= n; v++ {
		if _, err := c.PutCode(ctx, []byte(fmt.Sprintf("code %d", v))); err != nil {
			t.Fatal(err)
		}
		sha := SHA256([]byte(fmt.Sprintf("code %d", v)))
		if err := c.AppendHistory(ctx, "w", HistoryEntry{Version: v, SHA256: sha, Revision: v}); err != nil {
			t.Fatal(err)
		}
		if err := c.SaveWorker(ctx, Worker{ID: "w", CodeVersion: v, CodeSHA256: sha, Revision: v}); err != nil {
			t.Fatal(err)
		}
	}
	store.delKey = historyEntryKey("w", n/2)
	if err := c.DeleteWorker(ctx, "w"); err == nil {
		t.Fatal("the delete should fail half-way")
	}
	if store.failures != 1 {
		t.Fatal("the store did not fail")
	}
	if err := c.DeleteWorker(ctx, "w"); err != nil {
		t.Fatal(err)
	}
	if left := historyKeys(store.MemoryStore, "w"); len(left) != 0 {
		t.Fatalf("keys left after the retried delete: %v", left)
	}
	if got, err := c.SweepCode(ctx, time.Hour, time.Now().Add(2*time.Hour)); got != n || err != nil {
		t.Fatalf("swept %d, %v; want all %d blobs of the deleted worker", got, err, n)
	}
}

// A move of a legacy array that fails half-way leaves the history whole
// (array and keys are read together); the retried append finishes it.
func TestLegacyMoveCutOffMidWayLosesNothing(t *testing.T) {
	ctx := context.Background()
	store := &failingStore{MemoryStore: state.NewMemoryStore()}
	c := New(store)
	putLegacy(t, store, "w", []HistoryEntry{{Version: 1, SHA256: "a"}, {Version: 2, SHA256: "b"}, {Version: 3, SHA256: "c"}})
	if err := c.SaveWorker(ctx, Worker{ID: "w", CodeVersion: 3, CodeSHA256: "c", Revision: 3}); err != nil {
		t.Fatal(err)
	}
	store.putKey = historyEntryKey("w", 2)
	next := HistoryEntry{Version: 4, SHA256: "d", Revision: 4}
	if err := c.AppendHistory(ctx, "w", next); err == nil {
		t.Fatal("the append should fail while moving the array")
	}
	if got := versions(t, c, "w"); got != "1=a,2=b,3=c" {
		t.Fatalf("history after the cut-off move: %q", got)
	}
	if err := c.AppendHistory(ctx, "w", next); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveWorker(ctx, Worker{ID: "w", CodeVersion: 4, CodeSHA256: "d", Revision: 4}); err != nil {
		t.Fatal(err)
	}
	if got := versions(t, c, "w"); got != "1=a,2=b,3=c,4=d" {
		t.Fatalf("history after the retry: %q", got)
	}
	if _, err := store.Get(ctx, legacyHistoryKey("w")); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("the array is still stored: %v", err)
	}
}
