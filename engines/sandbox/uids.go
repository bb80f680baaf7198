package sandbox

import (
	"fmt"
	"os"
	"strconv"
	"sync"
)

// uidAllocator hands out the user ids of [base, base+n) so that no two
// live owners hold the same one. An owner holds its id while it has a
// reference (a running process: Command) or a pinned path (Own: files
// owned by the id that still exist). Released ids join the back of a
// free list and are reused as late as possible; an owner that comes back
// gets its previous id again if nobody took it meanwhile. Safe for
// concurrent use.
type uidAllocator struct {
	mu     sync.Mutex
	base   int
	n      int
	fresh  int          // ids base..base+fresh-1 have been handed out at least once
	free   []int        // released ids, oldest first (may hold stale entries: see isFree)
	isFree map[int]bool // whether a released id is free now
	leases map[string]*uidLease
	last   map[string]int     // an owner's previous id, while free
	lastBy map[int]string     // the owner a free id belonged to
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
	return &uidAllocator{base: base, n: n, isFree: map[int]bool{}, leases: map[string]*uidLease{},
		last: map[string]int{}, lastBy: map[int]string{}, pinned: map[*uidLease]bool{}}
}

// acquire returns owner's user id, allocating one if owner holds none, and
// the function that gives the reference back (once; later calls do
// nothing). An empty owner (a process of no worker) gets an id of its own.
func (a *uidAllocator) acquire(owner string) (int, func(), error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if owner == "" {
		a.anon++
		owner = "\x00anonymous-" + strconv.FormatUint(a.anon, 10)
	}
	l := a.leases[owner]
	if l == nil {
		uid, err := a.take(owner)
		if err != nil {
			return 0, nil, err
		}
		l = &uidLease{owner: owner, uid: uid}
		a.leases[owner] = l
	}
	l.refs++
	delete(a.pinned, l)
	var once sync.Once
	return l.uid, func() { once.Do(func() { a.release(l) }) }, nil
}

// take picks a free id for owner: its previous one if free, else one never
// used, else the one released longest ago. Callers hold mu.
func (a *uidAllocator) take(owner string) (int, error) {
	if uid, ok := a.last[owner]; ok && a.isFree[uid] {
		a.unfree(uid)
		return uid, nil
	}
	if a.fresh < a.n {
		a.fresh++
		return a.base + a.fresh - 1, nil
	}
	for attempt := 0; attempt < 2; attempt++ {
		for len(a.free) > 0 {
			uid := a.free[0]
			a.free = a.free[1:]
			if a.isFree[uid] {
				a.unfree(uid)
				return uid, nil
			}
		}
		a.sweep() // pinned paths removed since: their ids are free now
	}
	return 0, fmt.Errorf("sandbox: all %d worker user ids (%d..%d) are in use on this node; raise the range or run fewer workers here",
		a.n, a.base, a.base+a.n-1)
}

// unfree marks a free id taken. Callers hold mu.
func (a *uidAllocator) unfree(uid int) {
	delete(a.isFree, uid)
	if prev, ok := a.lastBy[uid]; ok {
		delete(a.lastBy, uid)
		delete(a.last, prev)
	}
	if len(a.free) > 64 && len(a.free) > 2*len(a.isFree) {
		// Drop stale entries now and then so the list stays as long as the
		// number of free ids.
		kept := a.free[:0]
		for _, u := range a.free {
			if a.isFree[u] {
				kept = append(kept, u)
			}
		}
		a.free = kept
	}
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
		a.isFree[l.uid] = true
		a.free = append(a.free, l.uid)
		if l.owner[0] != 0 { // anonymous owners do not come back
			a.last[l.owner] = l.uid
			a.lastBy[l.uid] = l.owner
		}
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
