//go:build linux

package native

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/internal/ownerdir"
)

// A node that was killed leaves its extraction directories in TempDir,
// which no bound counts any more: the next engine to extract there
// removes every owner directory whose lock nobody holds (and owner
// directories being made since long ago), and leaves those of live
// engines — nodes sharing TempDir — and anything not its own alone.
func TestStaleOwnerDirectoriesAreSwept(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, files ...string) string {
		t.Helper()
		d := filepath.Join(base, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			p := filepath.Join(d, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	dead := mk(ownerPrefix+"dead", ".lock", "virtufin-native-1/libworker.so")
	live := mk(ownerPrefix+"live", ".lock", "virtufin-native-2/libworker.so")
	held, err := os.OpenFile(filepath.Join(live, ".lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := syscall.Flock(int(held.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	oldMaking := mk(makingPrefix+"old", ".lock")
	old := time.Now().Add(-2 * ownerStaleAfter)
	if err := os.Chtimes(oldMaking, old, old); err != nil {
		t.Fatal(err)
	}
	newMaking := mk(makingPrefix + "new")
	other := mk("virtufin-native-123456", "libnativeworker.so")

	e := newTestEngine(t, Config{TempDir: base})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Check(ctx, testSpec, packageOf(t, flagsEcho, nil)); err != nil {
		t.Fatalf("Check: %v", err)
	}
	for path, want := range map[string]bool{dead: false, oldMaking: false, live: true, newMaking: true, other: true} {
		_, err := os.Stat(path)
		if got := err == nil; got != want {
			t.Errorf("%s: there %v, want %v", filepath.Base(path), got, want)
		}
	}
	// The engine's own owner directory, locked while it lives.
	mine := e.owner.path()
	if !strings.HasPrefix(filepath.Base(mine), ownerPrefix) || filepath.Dir(mine) != base {
		t.Fatalf("owner directory %q", mine)
	}
	f, err := os.OpenFile(filepath.Join(mine, ".lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
		t.Fatal("the live engine's owner directory is not locked")
	}
	f.Close()
	ownerdir.Sweep(base, ownerNames, ownerStaleAfter, time.Now())
	if _, err := os.Stat(mine); err != nil {
		t.Fatalf("a sweep removed a live engine's owner directory: %v", err)
	}
	// Closed with nothing extracted left: its directory goes.
	e.Close()
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Fatalf("the closed engine's empty owner directory is still there (stat: %v)", err)
	}
}

// extractionsIn lists what e has extracted and not removed: the entries of
// its TempDir but for its owner directory, and those of the owner
// directory but for its lock.
func extractionsIn(e *Engine) ([]os.DirEntry, error) {
	var left []os.DirEntry
	top, err := os.ReadDir(e.cfg.TempDir)
	for _, ent := range top {
		if !strings.HasPrefix(ent.Name(), ownerPrefix) {
			left = append(left, ent)
			continue
		}
		inner, _ := os.ReadDir(filepath.Join(e.cfg.TempDir, ent.Name()))
		for _, in := range inner {
			if in.Name() != ".lock" {
				left = append(left, in)
			}
		}
	}
	return left, err
}
