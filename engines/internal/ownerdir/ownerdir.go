// Package ownerdir owns the directories an engine makes its files in
// while it lives, in a parent that other node processes on the host may
// share: each engine makes a directory of its own there, holding a .lock
// file it keeps flocked until it closes, and sweeps the directories whose
// lock nobody holds (their engine was killed), so that what a killed
// node left does not stay on disk for ever.
package ownerdir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Names are the prefixes of one kind of owner directory: Owner for a
// live engine's, Making for one being made (locked, then renamed).
type Names struct {
	Owner, Making string
}

// Dir is an engine's owner directory.
type Dir struct {
	Path string
	lock *os.File
}

// Make makes an owner directory under parent (which it makes first),
// with mode: made as Making*, locked, then renamed to Owner*, so that an
// Owner* directory is locked from the moment it is there until Close.
func Make(parent string, n Names, mode os.FileMode) (*Dir, error) {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	making, err := os.MkdirTemp(parent, n.Making)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(making, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(making)
		return nil, err
	}
	dir := filepath.Join(parent, n.Owner+strings.TrimPrefix(filepath.Base(making), n.Making))
	// MkdirTemp makes it 0700.
	if err = os.Chmod(making, mode); err == nil {
		err = os.Rename(making, dir)
	}
	if err != nil {
		f.Close()
		os.RemoveAll(making)
		return nil, err
	}
	return &Dir{Path: dir, lock: f}, nil
}

// Close removes the lock file, and the directory when it is empty (what
// is left, the next Sweep removes), and lets go of the lock.
func (d *Dir) Close() {
	os.Remove(filepath.Join(d.Path, ".lock"))
	os.Remove(d.Path) // fails when not empty: swept later
	d.lock.Close()
}

// Alive reports whether a process holds the lock of owner directory dir.
func Alive(dir string) bool {
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

// Sweep removes, under parent, the owner directories whose lock nobody
// holds and those being made since more than staleAfter before now.
// Best effort.
func Sweep(parent string, n Names, staleAfter time.Duration, now time.Time) {
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		path := filepath.Join(parent, e.Name())
		switch {
		case !e.IsDir():
		case strings.HasPrefix(e.Name(), n.Owner):
			if !Alive(path) {
				os.RemoveAll(path)
			}
		case strings.HasPrefix(e.Name(), n.Making):
			if st, err := os.Lstat(path); err == nil && now.Sub(st.ModTime()) > staleAfter {
				os.RemoveAll(path)
			}
		}
	}
}
