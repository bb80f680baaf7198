package node_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/node/nodetest"
)

// Issue 43 item 1: a RUNNING record whose workflow has completed (a deleted
// worker written back by a late write) is not served: reconcile and Sync
// refuse it, and its topic's messages are not held back for it.
func TestReconcileRefusesARecordWhoseWorkflowCompleted(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	sha, err := f.Catalog.PutCode(ctx, []byte("good"))
	if err != nil {
		t.Fatal(err)
	}
	zombie := nodetest.Worker(catalog.StatusRunning, sha)
	live := zombie
	live.ID = "w2"
	for _, w := range []catalog.Worker{zombie, live} {
		if err := f.Catalog.SaveWorker(ctx, w); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var asked []string
	f.Node.SetWorkflowCheck(func(_ context.Context, id string) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, id)
		if id == "" {
			return false, errors.New("no id")
		}
		return id == zombie.ID, nil
	})
	if _, err := f.Node.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if f.Dispatcher.Attached(zombie.ID) || !f.Dispatcher.Attached(live.ID) {
		t.Fatalf("attached: zombie %v, live %v", f.Dispatcher.Attached(zombie.ID), f.Dispatcher.Attached(live.ID))
	}
	if err := f.Node.Sync(ctx, zombie.ID); err != nil || f.Dispatcher.Attached(zombie.ID) {
		t.Fatalf("Sync: %v, attached %v", err, f.Dispatcher.Attached(zombie.ID))
	}
	waitSubscribed(t, f, "in")
	f.Broker.Stream("in").In <- &runtimev1.TopicEventRequest{Id: "m1", Source: "test", Type: "in", SpecVersion: "1.0", Data: []byte("{}")}
	select {
	case a := <-f.Broker.Acks:
		if a.Status != dispatch.AckSuccess {
			t.Fatalf("ack %+v: the message waits for the refused worker", a)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no ack")
	}
	// A second pass over the same records does not ask Temporal again.
	mu.Lock()
	n := len(asked)
	mu.Unlock()
	if _, err := f.Node.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != n {
		t.Fatalf("asked again for unchanged records: %v", asked)
	}
}
