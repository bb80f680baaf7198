package sandbox

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"sync"
)

// uidAllocator hands out the user ids of [base, base+n) so that no two
// live owners on this node hold the same one. An owner holds its id while
// it has a reference (a running process: Command) or a pinned path (Own:
// files owned by the id that still exist).
//
// Each owner has a preferred id, derived from its name, so that a worker
// gets the same id on every node and after its processes restart (the
// files it wrote to a shared writable path stay its own); when another
// live owner holds it (two names that hash alike, by chance or chosen),
// the next free id is taken instead. The preference is not a secret and
// need not be: it decides nothing but the order of the search. Safe for
// concurrent use.
type uidAllocator struct {
	mu     sync.Mutex
	base   int
	n      int
	leases map[string]*uidLease
	held   map[int]*uidLease
	pinned map[*uidLease]bool // leases with no reference but pinned paths
	anon   uint64
}

type uidLease struct {
	owner string
	uid   int
	refs  int
	pins  []string
}

func newUIDAllocator(base, n int) *uidAllocator {
	return &uidAllocator{base: base, n: n, leases: map[string]*uidLease{}, held: map[int]*uidLease{}, pinned: map[*uidLease]bool{}}
}

// acquire returns owner's user id, allocating one if owner holds none, and
// the function that gives the reference back (once; later calls do
// nothing). An empty owner (a process of no worker) gets an id of its own.
func (a *uidAllocator) acquire(owner string) (int, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := 0
	if owner == "" {
		a.anon++
		owner = "\x00anonymous-" + strconv.FormatUint(a.anon, 10)
		start = int(a.anon % uint64(a.n))
	} else {
		start = a.preferred(owner)
	}
	l := a.leases[owner]
	if l == nil {
		uid, err := a.take(start)
		if err != nil {
			return 0, nil, err
		}
		l = &uidLease{owner: owner, uid: uid}
		a.leases[owner] = l
		a.held[uid] = l
	}
	l.refs++
	delete(a.pinned, l)
	var once sync.Once
	return l.uid, func() { once.Do(func() { a.release(l) }) }, nil
}

// preferred is the offset of owner's preferred id.
func (a *uidAllocator) preferred(owner string) int {
	sum := sha256.Sum256([]byte(owner))
	return int(binary.BigEndian.Uint64(sum[:8]) % uint64(a.n))
}

// take returns the first id not held, from offset start on. Callers hold
// mu.
func (a *uidAllocator) take(start int) (int, error) {
	for attempt := 0; attempt < 2; attempt++ {
		for i := 0; i < a.n; i++ {
			uid := a.base + (start+i)%a.n
			if a.held[uid] == nil {
				return uid, nil
			}
		}
		a.sweep() // pinned paths removed since: their ids are free now
	}
	return 0, fmt.Errorf("sandbox: all %d worker user ids (%d..%d) are in use on this node; raise the range or run fewer workers here",
		a.n, a.base, a.base+a.n-1)
}

// release gives back one reference of l. Callers do not hold mu.
func (a *uidAllocator) release(l *uidLease) {
	a.mu.Lock()
	defer a.mu.Unlock()
	l.refs--
	if l.refs > 0 {
		return
	}
	a.pinned[l] = true
	a.sweep()
}

// sweep frees the ids of leases without references whose pinned paths are
// all gone. Callers hold mu.
func (a *uidAllocator) sweep() {
	for l := range a.pinned {
		kept := l.pins[:0]
		for _, p := range l.pins {
			if _, err := os.Lstat(p); err == nil {
				kept = append(kept, p)
			}
		}
		l.pins = kept
		if len(kept) > 0 {
			continue
		}
		delete(a.pinned, l)
		delete(a.leases, l.owner)
		delete(a.held, l.uid)
	}
}

// pin keeps owner's id (which owner holds a reference to) for as long as
// path exists.
func (a *uidAllocator) pin(owner, path string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.leases[owner]; l != nil {
		l.pins = append(l.pins, path)
	}
}

// current is owner's id if it holds one.
func (a *uidAllocator) current(owner string) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.leases[owner]; l != nil {
		return l.uid, true
	}
	return 0, false
}
