package native

import (
	"errors"
	"os"
	"sync"
	"time"

	"github.com/virtufin/workmanager/engines/internal/ownerdir"
)

// Extraction directories (a worker's package, a spare check host's) are
// made in a directory of the engine's own, <TempDir>/virtufin-native-owner-*,
// holding a .lock file the engine keeps flocked while it lives. Nodes may
// share TempDir (several on one host, the integration tests); a node that
// was killed leaves its directories, which no bound counts any more
// (NATIVE_MAX_EXTRACTED_BYTES counts what this engine extracted): the
// next engine to extract there removes every owner directory whose lock
// nobody holds, and owner directories still being made (making-*) once
// older than ownerStaleAfter.

// ownerStaleAfter is how old an owner directory being made must be to be
// removed: far longer than the moment between making and renaming it.
const ownerStaleAfter = 10 * time.Minute

const (
	ownerPrefix  = "virtufin-native-owner-"
	makingPrefix = "virtufin-native-making-"
)

var ownerNames = ownerdir.Names{Owner: ownerPrefix, Making: makingPrefix}

// extractOwner is the engine's owner directory, made on first use.
type extractOwner struct {
	mu     sync.Mutex
	dir    *ownerdir.Dir
	closed bool
}

// mkdir makes a fresh directory for one extraction in the engine's owner
// directory (made, and the stale ones swept, the first time).
func (e *Engine) mkdir() (string, error) {
	parent, err := e.owner.get(e.cfg.TempDir)
	if err != nil {
		return "", err
	}
	return os.MkdirTemp(parent, "virtufin-native-*")
}

func (o *extractOwner) get(base string) (string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return "", errors.New("native engine: closed")
	}
	if o.dir != nil {
		return o.dir.Path, nil
	}
	if base == "" {
		base = os.TempDir()
	}
	ownerdir.Sweep(base, ownerNames, ownerStaleAfter, time.Now())
	d, err := ownerdir.Make(base, ownerNames, 0o700)
	if err != nil {
		return "", err
	}
	o.dir = d
	return d.Path, nil
}

// path is the owner directory ("" before the first extraction).
func (o *extractOwner) path() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.dir == nil {
		return ""
	}
	return o.dir.Path
}

// close lets go of the owner directory (removed when empty).
func (o *extractOwner) close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	if o.dir != nil {
		o.dir.Close()
	}
}
