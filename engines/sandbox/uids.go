package sandbox

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
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
//
// With a claim directory (claimDir) the ids are unique on the host too:
// an id is taken only with an exclusive flock on claimDir/<uid>, held
// until the id is freed or the process ends (the kernel drops it even
// when the node is killed), so node processes that share the directory
// (every node on one host, by default /run/workmanager/sandbox-uids) never
// give one id to two live workers. Another node's claim is skipped like a
// held id.
type uidAllocator struct {
	mu       sync.Mutex
	base     int
	n        int
	claimDir string // "": ids unique in this process only
	leases   map[string]*uidLease
	held     map[int]*uidLease
	pinned   map[*uidLease]bool // leases with no reference but pinned paths
	anon     uint64
}

type uidLease struct {
	owner string
	uid   int
	refs  int
	pins  []string
	claim *os.File // the flock on claimDir/<uid>, when claimDir is set
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
		uid, claim, err := a.take(start)
		if err != nil {
			return 0, nil, err
		}
		l = &uidLease{owner: owner, uid: uid, claim: claim}
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

// take returns the first id not held (here, or by another node process
// sharing claimDir), from offset start on, with its claim. Callers hold
// mu.
func (a *uidAllocator) take(start int) (int, *os.File, error) {
	var claimErr error
	for attempt := 0; attempt < 2; attempt++ {
		for i := 0; i < a.n; i++ {
			uid := a.base + (start+i)%a.n
			if a.held[uid] != nil {
				continue
			}
			if a.claimDir == "" {
				return uid, nil, nil
			}
			f, err := a.claim(uid)
			if err == nil {
				return uid, f, nil
			}
			if !errors.Is(err, syscall.EWOULDBLOCK) {
				claimErr = err
			}
		}
		a.sweep() // pinned paths removed since: their ids are free now
	}
	if claimErr != nil {
		return 0, nil, fmt.Errorf("sandbox: no worker user id could be claimed in %s: %w", a.claimDir, claimErr)
	}
	return 0, nil, fmt.Errorf("sandbox: all %d worker user ids (%d..%d) are in use on this host; raise the range or run fewer workers here",
		a.n, a.base, a.base+a.n-1)
}

// claim takes the exclusive flock on claimDir/<uid>; EWOULDBLOCK: another
// node process holds it.
func (a *uidAllocator) claim(uid int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(a.claimDir, strconv.Itoa(uid)), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
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
		if l.claim != nil {
			l.claim.Close() // drops the flock: another node may take the id
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
