package dotnet

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/virtufin/workmanager/engines/internal/ownerdir"
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

// slotNames are the owner directories' names under a slots parent.
var slotNames = ownerdir.Names{Owner: "owner-", Making: "making-"}

// slotOwners are an engine's owner directories, made on first use.
type slotOwners struct {
	mu     sync.Mutex
	owners map[string]*ownerdir.Dir // by parent
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
		return s.Path, nil
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", err
	}
	sweepSlots(cache, parent, time.Now())
	// Readable by the sandboxed processes' user ids.
	d, err := ownerdir.Make(parent, slotNames, 0o755)
	if err != nil {
		return "", err
	}
	if o.owners == nil {
		o.owners = map[string]*ownerdir.Dir{}
	}
	o.owners[parent] = d
	return d.Path, nil
}

// close removes the owner directories that are empty (their spares
// retired) and lets go of the locks: what is left is swept by the next
// engine to start a spare.
func (o *slotOwners) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	for _, d := range o.owners {
		d.Close()
	}
}

// sweepSlots removes, under parent, the owner directories whose lock
// nobody holds (ownerdir.Sweep, with those being made) and the old
// layout's slots older than slotsStaleAfter, and in cache the compile
// directories older than that. Best effort.
func sweepSlots(cache, parent string, now time.Time) {
	old := func(path string) bool {
		st, err := os.Lstat(path)
		return err == nil && now.Sub(st.ModTime()) > slotsStaleAfter
	}
	ownerdir.Sweep(parent, slotNames, slotsStaleAfter, now)
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if path := filepath.Join(parent, e.Name()); strings.HasPrefix(e.Name(), "slot-") && old(path) {
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
