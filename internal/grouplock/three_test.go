package grouplock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/state"
)

// Three nodes with three callers each share one group for a second, with
// kept holds, waiter markers, looks and Tell as in production (timings
// scaled down ten times): no two leases overlap, the tokens of the leases,
// in the order they ran, only grow, every node gets its turns and no
// caller gives up (ErrContended: a node starved past its backoff). One
// marker slot serves two waiting nodes: the one without it marks at its
// next look once the other took the lock. Run for 3 s without the race
// detector (a probe, not kept): about 900 leases a node with Tell,
// 550–680 without.
func TestThreeNodesShareAGroup(t *testing.T) {
	mem := state.NewMemoryStore()
	var nodesMu sync.Mutex
	nodes := map[string]*Locks{}
	for _, name := range []string{"a", "b", "c"} {
		nodes[name] = New(mem, Config{Node: name, RetryBase: 50 * time.Millisecond, MaxRetries: 6, MaxAge: 30 * time.Second,
			KeepFor: 256, TokenBlock: 256, FairEvery: 10 * time.Millisecond,
			Tell: func(_ context.Context, node, group string) {
				nodesMu.Lock()
				n := nodes[node]
				nodesMu.Unlock()
				if n != nil {
					n.Freed(group)
				}
			}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var (
		mu        sync.Mutex
		inside    bool
		tokens    []int64
		got       = map[string]int{}
		contended = map[string]int{}
		wg        sync.WaitGroup
	)
	for name, l := range nodes {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					ls, err := l.Acquire(ctx, "g", name+"/w")
					if err != nil {
						if errors.Is(err, ErrContended) {
							mu.Lock()
							contended[name]++
							mu.Unlock()
						}
						continue
					}
					mu.Lock()
					if inside {
						t.Errorf("%s's lease %d overlaps another", name, ls.Token)
					}
					inside = true
					tokens = append(tokens, ls.Token)
					got[name]++
					mu.Unlock()
					time.Sleep(time.Millisecond) // the call
					mu.Lock()
					inside = false
					mu.Unlock()
					if err := ls.Release(context.Background()); err != nil {
						t.Error(err)
					}
				}
			}()
		}
	}
	wg.Wait()
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("lease %d's token %d after %d", i, tokens[i], tokens[i-1])
		}
	}
	for name := range nodes {
		if got[name] == 0 || contended[name] != 0 {
			t.Errorf("node %s: %d leases, %d acquisitions gave up (all: %v, gave up: %v)", name, got[name], contended[name], got, contended)
		}
	}
	t.Logf("leases by node %v", got)
}
