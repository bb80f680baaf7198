// Package devkit ships the Python DevKit (the virtufin_worker package in
// src/) inside the node binary: Install writes it where every Python
// worker can import it (engines/python Config.DevKitDir), and Version is
// what the node reports. The package's runner link (_runner.py) is left
// out: the node has its own runner.
package devkit

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
)

//go:embed src/virtufin_worker/[a-z]*.py src/virtufin_worker/__*.py src/virtufin_worker/_[a-qs-z]*.py
//go:embed src/virtufin_worker/py.typed src/virtufin_worker/templates
var files embed.FS

const root = "src/virtufin_worker"

var versionRE = regexp.MustCompile(`(?m)^__version__ = "([^"]+)"$`)

// Version is the DevKit's version (__version__ of virtufin_worker).
func Version() string {
	b, err := files.ReadFile(root + "/__init__.py")
	if err != nil {
		panic(err) // embedded at build time
	}
	m := versionRE.FindSubmatch(b)
	if m == nil {
		panic("sdk/python: no __version__ line in __init__.py")
	}
	return string(m[1])
}

var installMu sync.Mutex // within a process; across processes see Install

// Install writes the DevKit under dir, into a directory named by its
// version and content (so that nodes of different builds sharing dir do
// not mix files), readable by every user (sandboxed workers run as their
// own user ids), and returns the directory to put on sys.path: it holds
// the virtufin_worker package. An existing, complete copy is reused, also
// one another process completes at the same time.
func Install(dir string) (string, error) {
	installMu.Lock()
	defer installMu.Unlock()
	sum, names, err := digest()
	if err != nil {
		return "", err
	}
	target := filepath.Join(dir, "virtufin_worker-"+Version()+"-"+sum[:12])
	done := filepath.Join(target, ".complete")
	if _, err := os.Stat(done); err == nil {
		return target, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("python devkit: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".devkit-")
	if err != nil {
		return "", fmt.Errorf("python devkit: %w", err)
	}
	defer os.RemoveAll(tmp)
	for _, name := range names {
		b, err := files.ReadFile(name)
		if err != nil {
			return "", err
		}
		path := filepath.Join(tmp, "virtufin_worker", filepath.FromSlash(name[len(root)+1:]))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return "", fmt.Errorf("python devkit: %w", err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return "", fmt.Errorf("python devkit: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), []byte(sum+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("python devkit: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("python devkit: %w", err)
	}
	if err := os.Rename(tmp, target); err != nil {
		// Another node sharing dir installed it meanwhile: use that copy
		// (its workers may be importing from it already).
		if _, serr := os.Stat(done); serr == nil {
			return target, nil
		}
		_ = os.RemoveAll(target) // an incomplete copy
		if err := os.Rename(tmp, target); err != nil {
			return "", fmt.Errorf("python devkit: %w", err)
		}
	}
	return target, nil
}

// digest hashes the embedded files (names and contents) and lists them.
func digest() (string, []string, error) {
	var names []string
	err := fs.WalkDir(files, root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			names = append(names, path)
		}
		return err
	})
	if err != nil {
		return "", nil, err
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		b, _ := files.ReadFile(n)
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), names, nil
}
