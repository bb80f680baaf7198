// Package execstep is the first program of every sandboxed worker process
// (cmd/sandbox-exec): started by the node, in the node's namespaces, it
// moves itself into the worker's memory cgroup, mounts the worker's own
// file systems (its /tmp and /scratch, sized) in a mount namespace of its
// own, marks every descriptor above the ones the node passed on purpose
// close-on-exec, and executes the rest of the chain (bubblewrap, prlimit,
// setpriv, the worker's runtime). Nothing the node holds without close-on-exec (descriptors
// inherited from its own parent, sockets that an in-process native
// library opened) reaches the worker, and the worker's first instruction
// already runs under its memory bound: the node cannot do either between
// fork and exec with os/exec.
//
// It imports nothing beyond the standard library and x/sys: it starts in
// about a millisecond.
package execstep

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Usage is the command line: keep is the number of descriptors passed on
// purpose (0, 1, 2 and the extra files from 3 on); cgroup-procs is the
// cgroup.procs file of the worker's memory cgroup, or "-" for none; each
// --tmpfs mounts a tmpfs with those options (mount(8)'s -o) on the
// directory DIR, in a mount namespace of this process's own (a slave of
// the node's: nothing mounted here is seen outside, and it goes away with
// the worker's last process), for the chain to bind where the worker needs
// it.
const Usage = "usage: sandbox-exec KEEP CGROUP-PROCS|- [--tmpfs DIR OPTIONS]... PROGRAM [ARG...]"

// TmpfsFlag starts a --tmpfs DIR OPTIONS triple of the command line.
const TmpfsFlag = "--tmpfs"

// Exit codes (as env(1) and the shells use them).
const (
	ExitUsage = 125 // bad command line or setup failure
	ExitExec  = 126 // the program could not be executed
)

// Main runs the step; it returns only on failure, with the exit code.
func Main(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, Usage)
		return ExitUsage
	}
	keep, err := strconv.Atoi(args[0])
	if err != nil || keep < 3 {
		fmt.Fprintf(os.Stderr, "sandbox-exec: KEEP must be a number of descriptors, at least 3 (got %q)\n%s\n", args[0], Usage)
		return ExitUsage
	}
	if args[1] != "-" {
		if err := JoinCgroup(args[1]); err != nil {
			fmt.Fprintf(os.Stderr, "sandbox-exec: joining the worker's memory cgroup: %v\n", err)
			return ExitUsage
		}
	}
	rest := args[2:]
	var mounts [][2]string
	for len(rest) > 0 && rest[0] == TmpfsFlag {
		if len(rest) < 4 {
			fmt.Fprintf(os.Stderr, "sandbox-exec: %s needs a directory and its options, then the program\n%s\n", TmpfsFlag, Usage)
			return ExitUsage
		}
		mounts = append(mounts, [2]string{rest[1], rest[2]})
		rest = rest[3:]
	}
	if err := MountTmpfs(mounts); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-exec: %v\n", err)
		return ExitUsage
	}
	if err := CloseOnExecFrom(keep); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-exec: closing the node's descriptors: %v\n", err)
		return ExitUsage
	}
	err = syscall.Exec(rest[0], rest, os.Environ())
	fmt.Fprintf(os.Stderr, "sandbox-exec: executing %s: %v\n", rest[0], err)
	return ExitExec
}

// MountTmpfs mounts a tmpfs (nosuid, nodev, with the options) on each
// directory of mounts ({dir, options} pairs), in a new mount namespace of
// this process whose mounts receive the node's but send nothing back: the
// node's mount table does not grow with its workers (a table every
// bubblewrap start copies and reads), and the file systems go away with
// the last process of the worker's chain. Nothing to mount: nothing done.
func MountTmpfs(mounts [][2]string) error {
	if len(mounts) == 0 {
		return nil
	}
	// A mount namespace is a thread's: this goroutine stays on this thread
	// until the exec (Main's, on the same goroutine), which then runs the
	// program in the new namespace.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("a mount namespace for the worker's file systems: %w", err)
	}
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making the worker's mount namespace a slave of the node's: %w", err)
	}
	for _, m := range mounts {
		if err := unix.Mount("tmpfs", m[0], "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, m[1]); err != nil {
			return fmt.Errorf("mounting a tmpfs (%s) on %s: %w", m[1], m[0], err)
		}
	}
	return nil
}

// JoinCgroup writes this process's id to procs (a cgroup.procs file, v1
// or v2). Raw system calls: os.OpenFile would start Go's poller.
func JoinCgroup(procs string) error {
	fd, err := syscall.Open(procs, syscall.O_WRONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", procs, err)
	}
	defer syscall.Close(fd)
	b := []byte(strconv.Itoa(os.Getpid()))
	if n, err := syscall.Write(fd, b); err != nil || n != len(b) {
		if err == nil {
			err = errors.New("short write")
		}
		return fmt.Errorf("%s: %w", procs, err)
	}
	return nil
}

// CloseOnExecFrom marks every descriptor from first on close-on-exec
// (close_range with CLOSE_RANGE_CLOEXEC; on kernels without it, each
// descriptor listed in /proc/self/fd). Marked, not closed: the Go runtime
// may hold some of them until the exec, which closes them all at once.
func CloseOnExecFrom(first int) error {
	if err := unix.CloseRange(uint(first), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < first {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
	}
	return nil
}
