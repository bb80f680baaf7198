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
	"time"
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
// an id is taken only with a flock on claimDir/<uid>, which names the
// worker it is for and is held until the id is freed or the process ends
// (the kernel drops it even when the node is killed), so node processes
// that share the directory (every node on one host, by default
// /run/workmanager/sandbox-uids) never give one id to two live workers,
// while one worker run by several of them keeps one id (claim). Another
// worker's claim is skipped like a held id.
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
		uid, claim, err := a.take(start, owner)
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
func (a *uidAllocator) take(start int, owner string) (int, *os.File, error) {
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
			f, err := a.claim(uid, owner)
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

// claim claims claimDir/<uid> for owner (a worker id): the file names its
// owner, and every node process that runs that worker holds a shared
// flock on it, so the same worker keeps one id on every node of a host
// (its files on shared writable paths stay its own) while no other worker
// can take the id. A free file (no lock) is taken with an exclusive flock,
// its owner written, then shared; a file held for another owner is
// EWOULDBLOCK. The owner is read again once the shared lock is held: a
// claim that changed hands meanwhile (flock's downgrade is not atomic) is
// given up.
func (a *uidAllocator) claim(uid int, owner string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(a.claimDir, strconv.Itoa(uid)), os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		if err := f.Truncate(0); err != nil {
			f.Close()
			return nil, err
		}
		if _, err := f.WriteAt([]byte(owner), 0); err != nil {
			f.Close()
			return nil, err
		}
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, err
	}
	// Another node process may be claiming the id this moment: it holds
	// the exclusive lock from its first flock until its owner is written.
	// That is waited for, boundedly (a paused node process could hold it
	// indefinitely: the id then counts as taken); read at once, the claim
	// looked taken, and one worker run by two node processes that
	// attached it together got two ids (its files on a shared writable
	// path one's only).
	if err := flockWait(f, syscall.LOCK_SH, claimWait); err != nil {
		f.Close()
		return nil, err
	}
	buf := make([]byte, len(owner)+1)
	n, _ := f.ReadAt(buf, 0)
	if string(buf[:n]) != owner {
		f.Close() // another worker's id
		return nil, syscall.EWOULDBLOCK
	}
	return f, nil
}

// claimWait bounds how long a claim waits for another node process's
// claim of the same id in progress.
const claimWait = 2 * time.Second

// flockWait takes lock how (without LOCK_NB) on f, trying again while it
// is held otherwise, for at most wait; then EWOULDBLOCK.
func flockWait(f *os.File, how int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := flock(f, how|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
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
