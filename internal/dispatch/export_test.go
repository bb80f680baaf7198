package dispatch

import "time"

// Draining reports whether Drain has begun (tests wait on it instead of
// sleeping).
func (d *Dispatcher) Draining() bool { return d.draining.Load() }

// Queued is how many messages wait in worker id's queue (0 when it is not
// attached).
func (d *Dispatcher) Queued(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.workers[id]; w != nil {
		return len(w.queue)
	}
	return 0
}

// Waiting is how many offers wait for room in worker id's queue.
func (d *Dispatcher) Waiting(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.workers[id]; w != nil {
		return int(w.waiting.Load())
	}
	return 0
}

// Stopped is closed when worker id is detached (nil when it is not
// attached).
func (d *Dispatcher) Stopped(id string) <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w := d.workers[id]; w != nil {
		return w.stopped
	}
	return nil
}

// Concurrency is concurrency, for tests.
var Concurrency = concurrency

// SetInstanceCloseBound sets how long a background close may take, until
// the test ends.
func SetInstanceCloseBound(t interface{ Cleanup(func()) }, d time.Duration) {
	old := instanceCloseBound
	instanceCloseBound = d
	t.Cleanup(func() { instanceCloseBound = old })
}
