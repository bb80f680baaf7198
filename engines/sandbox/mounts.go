package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/virtufin/workmanager/engines/sandbox/execstep"
)

// Each worker process's /tmp and /scratch (as root, with the user layer)
// are mounted by WorkManager rather than by bwrap: bwrap can set a
// tmpfs's size but not its inode count, and the kernel's default (half
// the machine's pages) lets a worker hold gigabytes of kernel memory in
// empty files whatever the size. Each is a tmpfs of its size, one inode
// per 4 KiB of it (at least 1024), mode 0700 and owned by the worker's
// user id, on a directory under <temp dir>/workmanager-sandbox/<node
// pid>-*. With cmd/sandbox-exec (the rule) the process's first step mounts
// them in a mount namespace of its own (execstep.MountTmpfs), so the
// node's mount table does not grow with its workers: every bubblewrap
// start copies and reads that table, and with two mounts per worker
// process in it a start cost grew with the number of workers on the node
// (bwrap was a fifth of the CPU of 96 creates on a node of about 290
// workers). Without sandbox-exec the node mounts them itself, as before.
// Either way the directories are removed (and a mount of the node's
// detached) when the process is released, and a node that starts removes
// what nodes no longer running left behind.

// mountRoot holds the mounts of every node on this machine.
var mountRoot = filepath.Join(os.TempDir(), "workmanager-sandbox")

// inodes is the inode count of a tmpfs of size bytes.
func inodes(size uint64) uint64 { return max(size/4096, 1024) }

// mountPrivate makes a directory holding tmp and scratch, two tmpfs of
// uid, and returns it. When inNamespace, it only makes the directories
// and returns, as arguments of cmd/sandbox-exec, what that mounts on them
// in the process's own mount namespace; else it mounts them itself, in
// the node's.
func (s *Sandbox) mountPrivate(uid int, inNamespace bool) (string, []string, error) {
	if err := os.MkdirAll(mountRoot, 0o700); err != nil {
		return "", nil, fmt.Errorf("sandbox: %w", err)
	}
	dir, err := os.MkdirTemp(mountRoot, strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", nil, fmt.Errorf("sandbox: %w", err)
	}
	var execArgs []string
	for _, m := range []struct {
		name string
		size uint64
	}{{"tmp", s.cfg.TmpBytes}, {"scratch", s.cfg.ScratchBytes}} {
		p := filepath.Join(dir, m.name)
		err := os.Mkdir(p, 0o700)
		opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", m.size, inodes(m.size), uid, uid)
		if err == nil && inNamespace {
			execArgs = append(execArgs, execstep.TmpfsFlag, p, opts)
			continue
		}
		if err == nil {
			err = syscall.Mount("tmpfs", p, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts)
		}
		if err != nil {
			unmountPrivate(dir)
			return "", nil, fmt.Errorf("sandbox: mounting the worker's %s: %w", m.name, err)
		}
	}
	return dir, execArgs, nil
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
