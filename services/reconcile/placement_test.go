package reconcile_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/services/reconcile"
)

// scans counts the reads of the catalog index's first page: one a
// convergence.
type scans struct {
	state.Store
	mu sync.Mutex
	n  int
}

func (s *scans) Get(ctx context.Context, key string) (state.Item, error) {
	if key == "workmanager/index/0" {
		s.mu.Lock()
		s.n++
		s.mu.Unlock()
	}
	return s.Store.Get(ctx, key)
}

func (s *scans) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// A burst of record changes (one a create on a new topic) makes one
// convergence at once and one at the end of the gap, not one a change;
// the last change is never lost: what it placed here is attached.
func TestPlacedConvergesAtMostOnceAGap(t *testing.T) {
	sc := &scans{}
	f := nodetest.NewOnStore(t, func(s state.Store) state.Store { sc.Store = s; return sc })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps := placement.NewStore(f.Store)
	fol := &placement.Follower{Self: "me", Store: ps, Replicas: 1, Alive: func() []string { return []string{"me", "other"} }}
	f.Node.SetPlacement(fol)
	place := func(nodes ...string) {
		if _, err := ps.Update(ctx, func(r *placement.Record) bool {
			if r.Topics == nil {
				r.Topics = map[string]placement.TopicPlacement{}
			}
			r.Topics["in"] = placement.TopicPlacement{Nodes: nodes, Replicas: 1}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := fol.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	place("other")
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := nodetest.Worker(catalog.StatusRunning, sha)
	w.Group = ""
	if err := f.Catalog.SaveWorker(ctx, w); err != nil {
		t.Fatal(err)
	}
	p := &reconcile.Placed{Follower: fol, Node: f.Node, MinGap: time.Second, SubscribeWait: time.Second}
	go p.Run(ctx, time.Hour)
	p.Changed()
	for deadline := time.Now().Add(10 * time.Second); sc.count() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no convergence 10 s after a change")
		}
	}
	// Changes spaced out within the gap: each would have made a
	// convergence of its own.
	for range 5 {
		time.Sleep(20 * time.Millisecond)
		p.Changed()
	}
	place("me") // the last change of the burst places the topic here
	p.Changed()
	deadline := time.Now().Add(10 * time.Second)
	for !f.Dispatcher.Attached(w.ID) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker of the topic placed here by the burst's last change is not attached after 10 s (%d convergences)", sc.count())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Two convergences read the index twice; the node's first attach
	// reads it once more (expectOnce). One convergence a change: 8.
	if n := sc.count(); n > 3 {
		t.Fatalf("a change, then 6 within a second: %d reads of the index, want 3 (a convergence at once, one at the end of the gap, the first attach's)", n)
	}
}
