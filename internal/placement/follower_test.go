package placement_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/state"
)

// Concurrent first questions to a follower that has read nothing yet
// (a node's first Reconcile asks for many workers at once) all answer
// by the record: one of them reads it, and none that skipped its own read
// because that one was fresh answers by the fallback ranking from the
// empty view it loaded before.
func TestConcurrentFirstQuestionsAnswerByTheRecord(t *testing.T) {
	ctx := context.Background()
	alive := []string{"me", "other", "third"}
	topic := ""
	for i := 0; topic == ""; i++ { // a topic the fallback ranking would serve here
		if c := fmt.Sprintf("t%d", i); slices.Contains(placement.Fallback(alive, nil, c, 2), "me") {
			topic = c
		}
	}
	store := placement.NewStore(state.NewMemoryStore())
	if _, err := store.Update(ctx, func(r *placement.Record) bool {
		r.Topics = map[string]placement.TopicPlacement{topic: {Nodes: []string{"other", "third"}, Replicas: 2}}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for round := range 500 {
		f := &placement.Follower{Self: "me", Store: store, Replicas: 2, Alive: func() []string { return alive }}
		var wg sync.WaitGroup
		served := make(chan bool, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				served <- f.Serves(ctx, topic)
			}()
		}
		wg.Wait()
		close(served)
		for s := range served {
			if s {
				t.Fatalf("round %d: a topic the record places on other nodes was served here", round)
			}
		}
	}
}
