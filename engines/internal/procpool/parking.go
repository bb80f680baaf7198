package procpool

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/virtufin/workmanager/engines"
)

// Key identifies what a parked process was started and loaded with: a Load
// takes it only for the same worker and code and everything the process
// itself was given (its environment names group and topic). The timeout
// and the gateway targets are enforced on the node's side, per call.
type Key struct {
	worker, group, topic string
	code                 [sha256.Size]byte
}

// KeyOf is the Key of a process started for spec with code.
func KeyOf(spec engines.Spec, code []byte) Key {
	return Key{worker: spec.WorkerID, group: spec.Group, topic: spec.Topic, code: sha256.Sum256(code)}
}

// Parking keeps processes that an engine's Check started and loaded with a
// worker's code, for the Load of the same worker and code that usually
// follows within moments (CreateWorker and LoadCode check the code, then
// load it): the Load takes the parked process as its first one instead of
// starting another, so a create starts one process instead of two and the
// worker's module-level code runs once. A process not taken within TTL is
// retired; at most Max are parked, the oldest is retired first. The zero
// Parking (or TTL or Max not positive) parks nothing. Safe for concurrent
// use.
type Parking[K comparable, P Process] struct {
	TTL time.Duration
	Max int

	mu     sync.Mutex
	parked []*parked[K, P] // oldest first
	// discarding counts the processes Discard retires in the background;
	// closed (Close began) makes Discard retire at once instead.
	discarding sync.WaitGroup
	closed     bool
}

type parked[K comparable, P Process] struct {
	key   K
	p     P
	timer *time.Timer
}

// Park keeps p under key; with parking off it retires p. A process parked
// under the same key before is retired (the newer one is kept).
func (pk *Parking[K, P]) Park(key K, p P) {
	if pk.TTL <= 0 || pk.Max <= 0 {
		p.Retire()
		return
	}
	e := &parked[K, P]{key: key, p: p}
	var evicted []P
	pk.mu.Lock()
	if old := pk.remove(func(o *parked[K, P]) bool { return o.key == key }); old != nil {
		evicted = append(evicted, old.p)
	}
	for len(pk.parked) >= pk.Max {
		evicted = append(evicted, pk.removeAt(0).p)
	}
	pk.parked = append(pk.parked, e)
	e.timer = time.AfterFunc(pk.TTL, func() {
		pk.mu.Lock()
		gone := pk.remove(func(o *parked[K, P]) bool { return o == e })
		pk.mu.Unlock()
		if gone != nil {
			gone.p.Retire()
		}
	})
	pk.mu.Unlock()
	for _, p := range evicted {
		p.Retire()
	}
}

// Discard retires p in the background instead of parking it (a Check
// whose Load runs on another node, engines.Spec.LoadsElsewhere): the
// check's answer is in, and waiting for the process's exit (its sandbox's
// teardown) would only delay it. Close waits for it.
func (pk *Parking[K, P]) Discard(p P) {
	pk.mu.Lock()
	if pk.closed {
		pk.mu.Unlock()
		p.Retire()
		return
	}
	pk.discarding.Add(1)
	pk.mu.Unlock()
	go func() {
		defer pk.discarding.Done()
		p.Retire()
	}()
}

// Take removes and returns the process parked under key, if any. The
// caller owns it from then on and checks that it is still alive.
func (pk *Parking[K, P]) Take(key K) (P, bool) {
	pk.mu.Lock()
	e := pk.remove(func(o *parked[K, P]) bool { return o.key == key })
	pk.mu.Unlock()
	if e == nil {
		var zero P
		return zero, false
	}
	return e.p, true
}

// TakeFor takes the process parked under key for pool's first start: it is
// handed out only while it still runs, usable (when set) approves it and
// pool tracks it; otherwise it is retired and TakeFor reports false.
func (pk *Parking[K, P]) TakeFor(key K, pool *Pool[P], usable func(P) bool) (P, bool) {
	p, ok := pk.Take(key)
	if !ok {
		return p, false
	}
	select {
	case <-p.Done():
	default:
		// Exited but not yet through Done (its output still being
		// flushed): as dead, not handed to a load whose first call
		// would fail on it.
		if x, ok := any(p).(interface{ Exited() bool }); ok && x.Exited() {
			break
		}
		if (usable == nil || usable(p)) && pool.Track(p) {
			return p, true
		}
	}
	p.Retire()
	var zero P
	return zero, false
}

// Len is the number of parked processes.
func (pk *Parking[K, P]) Len() int {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return len(pk.parked)
}

// Close retires every parked process and waits for those Discard
// retires.
func (pk *Parking[K, P]) Close() {
	pk.mu.Lock()
	all := pk.parked
	pk.parked, pk.closed = nil, true
	pk.mu.Unlock()
	for _, e := range all {
		e.timer.Stop()
		e.p.Retire()
	}
	pk.discarding.Wait()
}

// remove takes the first entry that match reports out of the list (nil:
// none), its timer stopped. pk.mu is held.
func (pk *Parking[K, P]) remove(match func(*parked[K, P]) bool) *parked[K, P] {
	for i, o := range pk.parked {
		if match(o) {
			return pk.removeAt(i)
		}
	}
	return nil
}

func (pk *Parking[K, P]) removeAt(i int) *parked[K, P] {
	e := pk.parked[i]
	pk.parked = append(pk.parked[:i], pk.parked[i+1:]...)
	e.timer.Stop() // set by Park before it lets go of pk.mu
	return e
}
