package catalog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/state"
)

func TestWorkersIndexAndHistory(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := catalog.New(store)
	if _, err := c.GetWorker(ctx, "nope"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("GetWorker of unknown: %v", err)
	}
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b", "c", "d"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.SaveWorker(ctx, catalog.Worker{ID: id, Topic: "t", Status: catalog.StatusRunning}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ws, err := c.ListWorkers(ctx)
	if err != nil || len(ws) != 4 {
		t.Fatalf("list %v %v", ws, err)
	}
	// History shows the versions the record reached (issue 43 item 7).
	if err := c.SaveWorker(ctx, catalog.Worker{ID: "a", Topic: "t", Status: catalog.StatusRunning, CodeVersion: 4}); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, v := range []int64{1, 2, 2} { // appending a version twice is a no-op
		if err := c.AppendHistory(ctx, "a", catalog.HistoryEntry{Version: v, SHA256: "x", SourceKind: "content", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if h, _ := c.History(ctx, "a"); len(h) != 2 || h[1].Version != 2 {
		t.Fatalf("history %v", h)
	}
	// A version written again with other code (a change that was cut off
	// before its record was saved, then the number used again) shows the
	// code written last, never the stale one; entries stay in order.
	for _, e := range []catalog.HistoryEntry{{Version: 2, SHA256: "y", SourceKind: "url", CreatedAt: now}, {Version: 4, SHA256: "w"}, {Version: 3, SHA256: "z"}} {
		if err := c.AppendHistory(ctx, "a", e); err != nil {
			t.Fatal(err)
		}
	}
	h, _ := c.History(ctx, "a")
	var got []string
	for _, e := range h {
		got = append(got, fmt.Sprintf("%d=%s", e.Version, e.SHA256))
	}
	if strings.Join(got, ",") != "1=x,2=y,3=z,4=w" {
		t.Fatalf("history %v", got)
	}
	if err := c.DeleteWorker(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ws, _ := c.ListWorkers(ctx); len(ws) != 3 {
		t.Fatalf("after delete: %v", ws)
	}
	if h, _ := c.History(ctx, "a"); len(h) != 0 {
		t.Fatalf("history survived delete: %v", h)
	}
}

func TestCodeIsContentAddressedAndVerified(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := catalog.New(store)
	body := []byte("def process(e): pass\n")
	sha, err := c.StageCode(ctx, body)
	if err != nil || sha != catalog.SHA256(body) {
		t.Fatal(sha, err)
	}
	if got, err := c.GetStaged(ctx, sha); err != nil || string(got) != string(body) {
		t.Fatal(err)
	}
	if _, err := c.PutCode(ctx, body); err != nil {
		t.Fatal(err)
	}
	// A body altered in the store is refused.
	_ = store.Put(ctx, state.KeyPrefix+"code/"+sha, []byte("tampered"), state.PutOptions{})
	if _, err := c.GetCode(ctx, sha); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("tampered code accepted: %v", err)
	}
}

func TestValidateSpec(t *testing.T) {
	mimes := []string{"text/x-python"}
	for _, c := range []struct{ mime, topic, group, want string }{
		{"text/x-python", "orders", "", ""},
		{"text/x-python", "orders.v1/eu", "g-1", ""},
		{"", "t", "", "mime_type is empty"},
		{"text/x-cobol", "t", "", `unknown mime_type "text/x-cobol" (supported: [text/x-python])`},
		{"text/x-python", "", "", "topic is empty"},
		{"text/x-python", "has space", "", "topic \"has space\" must match"},
		{"text/x-python", "workmanager.lifecycle", "", "reserved for lifecycle events"},
		{"text/x-python", "workmanager.probe", "", "reserved for the nodes' broker probes"},
		{"text/x-python", "t", "bad group!", "group \"bad group!\" must match"},
	} {
		err := catalog.ValidateSpec(c.mime, c.topic, c.group, mimes)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("ValidateSpec(%q, %q, %q) = %v, want %q", c.mime, c.topic, c.group, err, c.want)
		}
	}
}

func TestValidateRetryPolicy(t *testing.T) {
	for _, c := range []struct {
		attempts  int
		backoffMS int64
		want      string
	}{
		{0, 0, ""},
		{1, 1, ""},
		{100, 3_600_000, ""},
		{-1, 0, "retry_policy.max_attempts -1 must be 0 (cluster default) or 1..100"},
		{101, 0, "retry_policy.max_attempts 101"},
		{3, -1, "retry_policy.backoff_ms -1 must be 0 (cluster default) to 3600000"},
		{3, 3_600_001, "retry_policy.backoff_ms 3600001"},
	} {
		err := catalog.ValidateRetryPolicy(c.attempts, c.backoffMS)
		if c.want == "" && err != nil || c.want != "" && (!errors.Is(err, catalog.ErrInvalidSpec) || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("ValidateRetryPolicy(%d, %d) = %v, want %q", c.attempts, c.backoffMS, err, c.want)
		}
	}
}

func TestValidateTopic(t *testing.T) {
	for topic, want := range map[string]string{"orders": "", "orders.v1/eu": "", "": "topic is empty", "a b": `topic "a b" must match`} {
		err := catalog.ValidateTopic(topic)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("ValidateTopic(%q) = %v, want %q", topic, err, want)
		}
	}
}

// The retry policy is part of the stored record and survives a round trip;
// a record written before it existed reads as the cluster default.
func TestRetryPolicyIsStored(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := catalog.New(store)
	w := catalog.Worker{ID: "r", Topic: "t", Status: catalog.StatusRunning, MaxAttempts: 7, RetryBackoff: 1500 * time.Millisecond}
	if err := c.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetWorker(ctx, "r")
	if err != nil || got.MaxAttempts != 7 || got.RetryBackoff != 1500*time.Millisecond {
		t.Fatalf("read back %+v %v", got, err)
	}
	if err := store.Put(ctx, "workmanager/workers/old", []byte(`{"id":"old","topic":"t","status":"RUNNING"}`), state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if old, err := c.GetWorker(ctx, "old"); err != nil || old.MaxAttempts != 0 || old.RetryBackoff != 0 {
		t.Fatalf("old record %+v %v", old, err)
	}
}

// The index is spread over IndexPages keys; every id is on exactly one
// page, a full list is their union, and the one-key index of earlier
// versions is moved onto the pages on first read.
func TestIndexPagesAndLegacyMigration(t *testing.T) {
	ctx := context.Background()
	store := state.NewMemoryStore()
	c := catalog.New(store)
	legacy := []string{"old-1", "old-2"}
	b, _ := json.Marshal(legacy)
	if err := store.Put(ctx, state.KeyPrefix+"index", b, state.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 200 {
		id := fmt.Sprintf("w-%03d", i)
		want = append(want, id)
		if err := c.SaveWorker(ctx, catalog.Worker{ID: id, Topic: "t", Status: catalog.StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
	want = append(want, legacy...)
	seen, used := map[string]int{}, 0
	for page := range catalog.IndexPages {
		ids, err := c.WorkerIDsPage(ctx, page)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 0 {
			used++
		}
		for _, id := range ids {
			seen[id]++
		}
	}
	for _, id := range want {
		if seen[id] != 1 {
			t.Errorf("%s is on %d pages, want 1", id, seen[id])
		}
	}
	if len(seen) != len(want) || used < catalog.IndexPages/2 {
		t.Fatalf("%d ids on %d pages, want %d spread over most of %d", len(seen), used, len(want), catalog.IndexPages)
	}
	if _, err := store.Get(ctx, state.KeyPrefix+"index"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("the legacy index is still there: %v", err)
	}
	if _, err := c.WorkerIDsPage(ctx, catalog.IndexPages); err == nil {
		t.Fatal("a page out of range must be an error")
	}
}

// bulkCounter counts a Bulk store's GetMany calls and the keys of each,
// and its single reads (gets), whose keys it keeps (read).
type bulkCounter struct {
	*state.MemoryStore
	mu    sync.Mutex
	calls []int
	gets  int
	read  []string
	bulk  []string
}

func (b *bulkCounter) Get(ctx context.Context, key string) (state.Item, error) {
	b.mu.Lock()
	b.gets++
	b.read = append(b.read, key)
	b.mu.Unlock()
	return b.MemoryStore.Get(ctx, key)
}

// reads returns the keys read singly since the last call.
func (b *bulkCounter) reads() []string { return b.drain(&b.read) }

// bulkReads returns the keys read in bulk since the last call.
func (b *bulkCounter) bulkReads() []string { return b.drain(&b.bulk) }

// drain empties one of b's lists and returns what it held.
func (b *bulkCounter) drain(keys *[]string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := *keys
	*keys = nil
	return r
}

func (b *bulkCounter) GetMany(ctx context.Context, keys []string) ([]state.Result, error) {
	b.mu.Lock()
	b.calls = append(b.calls, len(keys))
	b.bulk = append(b.bulk, keys...)
	b.mu.Unlock()
	return b.MemoryStore.GetMany(ctx, keys)
}

// WorkerIDs reads the index's pages in one round trip (and the legacy
// index, to migrate it), every id once.
func TestWorkerIDsReadsThePagesInOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	store := &bulkCounter{MemoryStore: state.NewMemoryStore()}
	c := catalog.New(store)
	want := map[string]bool{}
	for i := range 230 {
		id := fmt.Sprintf("w%03d", i)
		want[id] = true
		if err := c.SaveWorker(ctx, catalog.Worker{ID: id, Topic: "t", Status: catalog.StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
	store.calls, store.gets = nil, 0
	ids, err := c.WorkerIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, id := range ids {
		if got[id] {
			t.Fatalf("%s listed twice", id)
		}
		got[id] = true
	}
	if !maps.Equal(got, want) {
		t.Fatalf("%d ids, want the 230 saved", len(got))
	}
	if fmt.Sprint(store.calls) != fmt.Sprint([]int{catalog.IndexPages}) || store.gets != 1 {
		t.Fatalf("bulk reads %v and %d single reads, want one bulk read of the %d pages and one read (the legacy index)", store.calls, store.gets, catalog.IndexPages)
	}
}

// GetWorkers reads the records in bulk, at most 100 a round trip, in the
// order asked, leaving out ids without a record and deleted workers.
func TestGetWorkersReadsInBulk(t *testing.T) {
	ctx := context.Background()
	store := &bulkCounter{MemoryStore: state.NewMemoryStore()}
	c := catalog.New(store)
	var ids []string
	for i := range 230 {
		id := fmt.Sprintf("w%03d", i)
		ids = append(ids, id)
		if err := c.SaveWorker(ctx, catalog.Worker{ID: id, Topic: "t", Status: catalog.StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteWorker(ctx, "w007"); err != nil {
		t.Fatal(err)
	}
	store.calls = nil
	ws, err := c.GetWorkers(ctx, append(ids, "absent"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 229 || ws[0].ID != "w000" || ws[7].ID != "w008" || ws[228].ID != "w229" {
		t.Fatalf("%d records, first %s, eighth %s: want 229 in order without w007", len(ws), ws[0].ID, ws[7].ID)
	}
	if len(store.calls) != 3 || store.calls[0] != 100 || store.calls[2] != 31 {
		t.Fatalf("bulk reads of %v keys, want 100, 100 and 31", store.calls)
	}
}
