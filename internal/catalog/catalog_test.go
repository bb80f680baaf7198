package catalog_test

import (
	"context"
	"errors"
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
	now := time.Now().UTC()
	for _, v := range []int64{1, 2, 2} { // appending a version twice is a no-op
		if err := c.AppendHistory(ctx, "a", catalog.HistoryEntry{Version: v, SHA256: "x", SourceKind: "content", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if h, _ := c.History(ctx, "a"); len(h) != 2 || h[1].Version != 2 {
		t.Fatalf("history %v", h)
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
