package sandbox_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// fdProbe lists the process's descriptors (what each points to) and
// writes to every one above 2, as a worker looking for the node's
// sockets would.
const fdProbe = `
import os
fds = sorted(int(f) for f in os.listdir('/proc/self/fd'))
for fd in fds:
    try:
        print(fd, os.readlink('/proc/self/fd/%d' % fd))
    except OSError:
        pass
for fd in range(3, 1024):
    try:
        os.write(fd, b'LEAKED')
    except OSError:
        pass
`

// runProbe runs fdProbe in s and returns its output.
func runProbe(t *testing.T, s *sandbox.Sandbox) string {
	t.Helper()
	python := systemPython(t)
	cmd, done, err := s.Command(sandbox.Spec{Owner: "fd-probe", Path: python, Args: []string{"-I", "-S", "-c", fdProbe}})
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("probe: %v\n%s", err, out.String())
	}
	return out.String()
}

// Issue 42 item 1: the node's descriptors without close-on-exec (a socket
// to a loopback listener, an open file) do not reach a worker process, in
// the strict sandbox and without bubblewrap; the control without
// cmd/sandbox-exec shows the probe finds them when they do.
func TestNodeDescriptorsDoNotReachTheWorker(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   sandbox.Config
		leaks bool
	}{
		{"strict", sandbox.Config{Mode: sandbox.Strict}, false},
		{"standard without bubblewrap", sandbox.Config{Mode: sandbox.Standard, Bwrap: "/nonexistent/bwrap"}, false},
		{"control: standard without bubblewrap or sandbox-exec", sandbox.Config{Mode: sandbox.Standard, Bwrap: "/nonexistent/bwrap", Exec: "/nonexistent/sandbox-exec"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			leak := sandboxtest.NodeDescriptors(t)
			c.cfg.Log = quiet()
			s := sandboxtest.New(t, c.cfg)
			out := runProbe(t, s)
			var held []string
			for _, l := range strings.Split(out, "\n") {
				f := strings.Fields(l)
				if len(f) != 2 {
					continue
				}
				if n, err := strconv.Atoi(f[0]); err == nil && n > 2 && (strings.HasPrefix(f[1], "socket:") || f[1] == leak.File) {
					held = append(held, l)
				}
			}
			wrote, file := leak.Reached(t)
			if c.leaks {
				if len(held) == 0 || !bytes.Contains(wrote, []byte("LEAKED")) {
					t.Fatalf("control: the probe did not find the leaked descriptors (it cannot prove anything): %s", out)
				}
				return
			}
			if len(held) > 0 || len(wrote) > 0 || file != "secret" {
				t.Fatalf("a node descriptor reached the worker: it holds %q, the listener got %q, the file holds %q; probe:\n%s", held, wrote, file, out)
			}
		})
	}
}

// memoryHog holds memory the address-space limit does not count: memfd
// pages it never maps, then SysV shared-memory segments it attaches,
// fills and detaches, 16 MiB at a time, up to 1 GiB; it prints how much
// it held before it was stopped.
const memoryHog = `
import ctypes, os, sys
kind = sys.argv[1]
held = 0
fds = []
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
chunk = b'x' * (16 << 20)
while held < (1 << 30):
    if kind == 'memfd':
        fd = os.memfd_create('hog')
        os.write(fd, chunk)
        fds.append(fd)
    else:
        seg = libc.shmget(0, len(chunk), 0o1600)
        if seg < 0:
            print('shmget refused', ctypes.get_errno(), flush=True); sys.exit(3)
        p = libc.shmat(seg, None, 0)
        ctypes.memset(p, 120, len(chunk))
        libc.shmdt(ctypes.c_void_p(p))
    held += len(chunk)
    print('held', held, flush=True)
`

// Issue 42 item 2: with the memory layer, a worker process cannot hold
// more than its address space plus /tmp and /scratch in memfd pages or
// SysV shared memory (the kernel stops it at the cgroup's limit), and its
// core and locked-memory limits are the worker's, not the node's.
func TestMemoryCgroupBoundsMemfdAndSharedMemory(t *testing.T) {
	python := systemPython(t)
	limits := sandbox.DefaultLimits
	limits.AddressSpace = 256 << 20
	const tmp, scratch = 16 << 20, 16 << 20
	const bound = 256<<20 + tmp + scratch
	s := sandboxtest.New(t, sandbox.Config{Mode: sandbox.Strict, Limits: limits, TmpBytes: tmp, ScratchBytes: scratch, Log: quiet()})
	for _, kind := range []string{"memfd", "shm"} {
		t.Run(kind, func(t *testing.T) {
			cmd, done, err := s.Command(sandbox.Spec{Owner: "hog-" + kind, Path: python, Args: []string{"-I", "-S", "-c", memoryHog, kind}})
			if err != nil {
				t.Fatal(err)
			}
			defer done()
			procs := cmd.Args[2] // sandbox-exec KEEP CGROUP-PROCS ...
			if !strings.HasSuffix(procs, "cgroup.procs") {
				t.Fatalf("no memory cgroup in %q", cmd.Args)
			}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err = cmd.Run()
			peak := peakUsage(t, procs)
			var held int
			for _, l := range strings.Split(out.String(), "\n") {
				if f := strings.Fields(l); len(f) == 2 && f[0] == "held" {
					held, _ = strconv.Atoi(f[1])
				}
			}
			t.Logf("%s: held %d MiB before it was stopped (%v); the group's peak %d MiB against a bound of %d MiB", kind, held>>20, err, peak>>20, bound>>20)
			if held == 0 {
				t.Fatalf("the hog did not run: %v\n%s", err, out.String())
			}
			if err == nil || held >= 1<<30 {
				t.Fatalf("the hog was not stopped: held %d MiB; output:\n%s", held>>20, out.String())
			}
			if held > bound || peak > bound {
				t.Fatalf("held %d MiB (group peak %d MiB) against a bound of %d MiB", held>>20, peak>>20, bound>>20)
			}
		})
	}
	t.Run("rlimits", func(t *testing.T) {
		cmd, done, err := s.Command(sandbox.Spec{Owner: "rlimits", Path: "/bin/sh", Args: []string{"-c", "ulimit -c; ulimit -l"}})
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		out, err := cmd.Output()
		if err != nil || strings.Fields(string(out))[0] != "0" || strings.Fields(string(out))[1] != strconv.Itoa(sandbox.WorkerMemlockBytes>>10) {
			t.Fatalf("ulimit -c, -l: %q %v; want 0 and %d (KiB)", out, err, sandbox.WorkerMemlockBytes>>10)
		}
	})
}

// peakUsage is the peak memory of the group whose cgroup.procs is procs.
func peakUsage(t *testing.T, procs string) int {
	t.Helper()
	for _, f := range []string{"memory.max_usage_in_bytes", "memory.peak"} {
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(procs), f)); err == nil {
			n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return n
		}
	}
	t.Fatalf("no peak usage file beside %s", procs)
	return 0
}

// systemPython is Debian's interpreter (python3 on PATH may be a shim
// script that a sandbox cannot run).
func systemPython(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	return "/usr/bin/python3"
}
