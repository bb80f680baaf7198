package batch

import (
	"runtime"
	"sync"
	"testing"
)

type req struct {
	n    int
	done chan struct{}
}

// Requests added while a batch runs go out together, at most Max at a time,
// and every request is run exactly once.
func TestCoalescerBatchesWhileBusy(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	ran := map[int]int{}
	hold := make(chan struct{})
	first := make(chan struct{})
	var c Coalescer[req]
	c.Max = 4
	c.Run = func(b []*req) {
		mu.Lock()
		sizes = append(sizes, len(b))
		for _, r := range b {
			ran[r.n]++
		}
		mu.Unlock()
		if b[0].n == 0 {
			close(first)
			<-hold // the first batch is in flight while the others queue
		}
		for _, r := range b {
			close(r.done)
		}
	}
	reqs := make([]*req, 11)
	for i := range reqs {
		reqs[i] = &req{n: i, done: make(chan struct{})}
	}
	go c.Add(reqs[0])
	<-first
	for _, r := range reqs[1:] {
		go c.Add(r)
	}
	for c.Queued() < 10 {
		runtime.Gosched()
	}
	close(hold)
	for _, r := range reqs {
		<-r.done
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 4 || sizes[0] != 1 || sizes[1] != 4 || sizes[2] != 4 || sizes[3] != 2 {
		t.Fatalf("batch sizes %v, want [1 4 4 2]", sizes)
	}
	for i := range reqs {
		if ran[i] != 1 {
			t.Fatalf("request %d ran %d times", i, ran[i])
		}
	}
}
