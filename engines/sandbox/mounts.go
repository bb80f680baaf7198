package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The node (as root, with the user layer) mounts each worker process's
// /tmp and /scratch itself rather than letting bwrap do it: bwrap can set
// a tmpfs's size but not its inode count, and the kernel's default (half
// the machine's pages) lets a worker hold gigabytes of kernel memory in
// empty files whatever the size. Each is a tmpfs of its size, one inode
// per 4 KiB of it (at least 1024), mode 0700 and owned by the worker's
// user id, under <temp dir>/workmanager-sandbox/<node pid>-*; it is
// detached when the process is released, and a node that starts removes
// what nodes no longer running left behind.

// mountRoot holds the mounts of every node on this machine.
var mountRoot = filepath.Join(os.TempDir(), "workmanager-sandbox")

// inodes is the inode count of a tmpfs of size bytes.
func inodes(size uint64) uint64 { return max(size/4096, 1024) }

// mountPrivate makes a directory holding tmp and scratch, two tmpfs of
// uid, and returns it.
func (s *Sandbox) mountPrivate(uid int) (string, error) {
	if err := os.MkdirAll(mountRoot, 0o700); err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	dir, err := os.MkdirTemp(mountRoot, strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", fmt.Errorf("sandbox: %w", err)
	}
	for name, size := range map[string]uint64{"tmp": s.cfg.TmpBytes, "scratch": s.cfg.ScratchBytes} {
		p := filepath.Join(dir, name)
		err := os.Mkdir(p, 0o700)
		if err == nil {
			opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", size, inodes(size), uid, uid)
			err = syscall.Mount("tmpfs", p, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts)
		}
		if err != nil {
			unmountPrivate(dir)
			return "", fmt.Errorf("sandbox: mounting the worker's %s: %w", name, err)
		}
	}
	return dir, nil
}

// unmountPrivate detaches what mountPrivate mounted in dir and removes it.
func unmountPrivate(dir string) {
	if dir == "" {
		return
	}
	for _, name := range []string{"tmp", "scratch"} {
		p := filepath.Join(dir, name)
		for syscall.Unmount(p, syscall.MNT_DETACH) == nil {
			// a mount stacked twice (never made so) comes off too
		}
	}
	// Only empty directories remain once unmounted; a failed unmount leaves
	// a mount, which Remove refuses to touch (EBUSY) rather than empty.
	_ = os.Remove(filepath.Join(dir, "tmp"))
	_ = os.Remove(filepath.Join(dir, "scratch"))
	_ = os.Remove(dir)
}

// sweepMounts removes the private directories of nodes that are gone
// (their pid is not running): a node killed without releasing its
// processes leaves mounts that hold memory.
func sweepMounts() {
	ents, err := os.ReadDir(mountRoot)
	if err != nil {
		return
	}
	for _, e := range ents {
		pidText, _, ok := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			unmountPrivate(filepath.Join(mountRoot, e.Name()))
		}
	}
}
