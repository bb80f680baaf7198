package dotnet

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Slots of spare hosts and spare compilers (<cache>/spares,
// <cache>/compilers) are made in a directory of the engine's own,
// <parent>/owner-*, holding a .lock file the engine keeps flocked while
// it lives. Nodes may share the cache; a node that crashed leaves its
// slots, and the next engine to start a spare there removes every owner
// directory whose lock nobody holds, together with what a crash left
// that no lock covers — an owner directory being made (making-*), slots
// of the layout before owners (slot-*), compile directories (.cs-*,
// .build-*) — once older than slotsStaleAfter.

// slotsStaleAfter is how old an owner directory being made, a slot of the
// old layout or an unfinished compile directory must be to be removed:
// far longer than a compile (LoadTimeout) or the moment between making an
// owner directory and renaming it.
const slotsStaleAfter = 10 * time.Minute

// newSlot makes an empty slot for a spare of kind ("spares": hosts,
// "compilers") in the engine's owner directory, readable by the spare's
// user id.
func (e *Engine) newSlot(kind string) (string, error) {
	parent, err := e.slots.dir(e.cfg.CacheDir, filepath.Join(e.cfg.CacheDir, kind))
	if err != nil {
		return "", err
	}
	slot, err := os.MkdirTemp(parent, "slot-")
	if err != nil {
		return "", err
	}
	// MkdirTemp makes it 0700.
	if err := os.Chmod(slot, 0o755); err != nil {
		os.RemoveAll(slot)
		return "", err
	}
	return slot, nil
}

// slotOwner is the engine's owner directory under one parent.
type slotOwner struct {
	dir  string
	lock *os.File
}

// slotOwners are an engine's owner directories, made on first use.
type slotOwners struct {
	mu     sync.Mutex
	owners map[string]*slotOwner // by parent
	closed bool
}

// dir is the engine's owner directory under parent, made (and the stale
// ones there and in the cache swept) the first time.
func (o *slotOwners) dir(cache, parent string) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return "", errors.New("the engine is closed")
	}
	if s := o.owners[parent]; s != nil {
		return s.dir, nil
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	sweepSlots(cache, parent, time.Now())
	// Made as making-*, locked, then renamed: an owner-* directory is
	// locked from the moment it is there until its engine is gone.
	making, err := os.MkdirTemp(parent, "making-")
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(filepath.Join(making, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(making)
		return "", err
	}
	dir := filepath.Join(parent, "owner-"+strings.TrimPrefix(filepath.Base(making), "making-"))
	// Readable by the sandboxed processes' user ids (MkdirTemp makes it
	// 0700).
	if err = os.Chmod(making, 0o755); err == nil {
		err = os.Rename(making, dir)
	}
	if err != nil {
		f.Close()
		os.RemoveAll(making)
		return "", err
	}
	if o.owners == nil {
		o.owners = map[string]*slotOwner{}
	}
	o.owners[parent] = &slotOwner{dir: dir, lock: f}
	return dir, nil
}

// close removes the owner directories that are empty (their spares
// retired) and lets go of the locks: what is left is swept by the next
// engine to start a spare.
func (o *slotOwners) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	for _, s := range o.owners {
		os.Remove(filepath.Join(s.dir, ".lock"))
		os.Remove(s.dir) // fails when not empty: swept later
		s.lock.Close()
	}
}

// sweepSlots removes, under parent, the owner directories whose lock
// nobody holds and the old layout's slots older than slotsStaleAfter, and
// in cache the compile directories older than that. Best effort.
func sweepSlots(cache, parent string, now time.Time) {
	old := func(path string) bool {
		st, err := os.Lstat(path)
		return err == nil && now.Sub(st.ModTime()) > slotsStaleAfter
	}
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		path := filepath.Join(parent, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), "owner-"):
			if !ownerAlive(path) {
				os.RemoveAll(path)
			}
		case (strings.HasPrefix(e.Name(), "making-") || strings.HasPrefix(e.Name(), "slot-")) && old(path):
			os.RemoveAll(path)
		}
	}
	entries, _ = os.ReadDir(cache)
	for _, e := range entries {
		if n := e.Name(); (strings.HasPrefix(n, ".cs-") || strings.HasPrefix(n, ".build-")) && old(filepath.Join(cache, n)) {
			os.RemoveAll(filepath.Join(cache, n))
		}
	}
}

// ownerAlive reports whether a process holds dir's lock.
func ownerAlive(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}
