// Package batch owns group commit: concurrent calls to a remote service
// queue while one call is in flight and go out together as the next call,
// so that under load many callers share one round trip, and a caller alone
// waits for nothing but its own call. The state store (delivery records)
// and the publisher (worker outputs) use it.
package batch

import "sync"

// Coalescer hands the requests added while a batch is in flight to Run as
// the next batch (at most Max requests; 0: 64). The caller that finds it
// idle runs the first batch on its own goroutine; a batch that leaves
// requests queued hands the next one to a new goroutine, so no caller
// serves the others for long. Run must settle every request of its batch
// (callers wait on their own completion signal). The zero value needs Run.
type Coalescer[T any] struct {
	Run func(batch []*T)
	Max int

	mu      sync.Mutex
	pending []*T
	busy    bool
}

// Add queues r for the next batch, running that batch now when no batch is
// in flight.
func (c *Coalescer[T]) Add(r *T) {
	c.mu.Lock()
	c.pending = append(c.pending, r)
	if c.busy {
		c.mu.Unlock()
		return
	}
	c.busy = true
	c.mu.Unlock()
	c.flush()
}

// Queued is how many requests wait for the next batch.
func (c *Coalescer[T]) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

func (c *Coalescer[T]) flush() {
	limit := c.Max
	if limit <= 0 {
		limit = 64
	}
	c.mu.Lock()
	n := min(len(c.pending), limit)
	batch := make([]*T, n)
	copy(batch, c.pending)
	rest := copy(c.pending, c.pending[n:])
	clear(c.pending[rest:])
	c.pending = c.pending[:rest]
	c.mu.Unlock()
	c.Run(batch)
	c.mu.Lock()
	if len(c.pending) == 0 {
		c.busy = false
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	go c.flush()
}
