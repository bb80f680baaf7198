package python_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// TestSandboxContainsEscapes runs the escape corpus with the interpreter
// layer opened up (os, socket, subprocess allowed), so that each attempt
// reaches the OS layers: each must be blocked or contained, and the
// instance must keep serving.
func TestSandboxContainsEscapes(t *testing.T) {
	// Issue 48: a runner forked from the fork server is held to every
	// check a runner started through the sandbox's programs is.
	bothWays(t, testSandboxContainsEscapes)
}

func testSandboxContainsEscapes(t *testing.T, noFork bool) {
	sb := sandboxtest.Strict(t)
	t.Setenv("WM_NODE_SECRET", "hunter2")
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("node secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	unixPath := filepath.Join(t.TempDir(), "node.sock")
	ux, err := net.Listen("unix", unixPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ux.Close()

	e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"os", "socket", "subprocess", "sys", "signal", "resource", "ctypes"}, DefaultTimeout: 20 * time.Second, NoForkServer: noFork})
	inst := load(t, e, testSpec, `
import os, socket, subprocess, sys, time

def attempt(kind, arg):
    if kind == "env":
        return dict(os.environ)
    if kind == "proc-environ":
        return open("/proc/%d/environ" % arg).read()
    if kind == "parent-environ":
        return open("/proc/%d/environ" % os.getppid()).read()
    if kind == "read-file":
        return open(arg).read()
    if kind == "write-outside":
        with open("/usr/escaped", "w") as f:
            f.write("x")
        return "written"
    if kind == "write-scratch":
        with open("scratch.txt", "w") as f:
            f.write("ok")
        return open("scratch.txt").read() + " uid=%d" % os.getuid()
    if kind == "write-tmp":
        path = os.path.join(os.environ["TMPDIR"], "t.txt")
        with open(path, "w") as f:
            f.write("ok")
        return open(path).read() + " in " + os.path.dirname(path)
    if kind == "tcp":
        socket.create_connection(("127.0.0.1", arg), timeout=2).close()
        return "connected"
    if kind == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b"escaped", ("127.0.0.1", arg))
        return "sent"
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX)
        s.connect(arg)
        return "connected"
    if kind == "kill-node":
        os.kill(arg, 9)
        return "killed"
    if kind == "escape-session":
        # setsid + double fork: the grandchild must still die with the sandbox
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(3600)
            os._exit(0)
        return "forked"
    if kind == "fork-bomb":
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(3600)
                n += 1
        except OSError as e:
            return "stopped after %d: %s" % (n, e)
    if kind == "memory":
        b = bytearray(10 << 30)
        return "allocated"
    if kind == "big-file":
        with open("big", "wb") as f:
            chunk = b"x" * (1 << 20)
            for _ in range(10 << 10):
                f.write(chunk)
        return "written"
    if kind == "clone-ns":
        # a fork into a new user and network namespace (root inside it)
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        L = ctypes.c_long
        pid = libc.syscall(L(56), L(0x10000000 | 0x40000000 | 17), L(0), L(0), L(0), L(0))
        if pid == 0:
            os._exit(0)
        if pid < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        os.waitpid(pid, 0)
        return "cloned"
    if kind == "clone3-ns":
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        # struct clone_args (version 0, 64 bytes): flags, pidfd, child_tid,
        # parent_tid, exit_signal, stack, stack_size, tls
        args = (ctypes.c_uint64 * 8)(0x10000000 | 0x40000000, 0, 0, 0, 17, 0, 0, 0)
        pid = libc.syscall(ctypes.c_long(435), args, ctypes.c_long(64))
        if pid == 0:
            os._exit(0)
        if pid < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        os.waitpid(pid, 0)
        return "cloned"
    if kind == "fill":
        # 8 MiB files (under the file size limit) until the directory is full
        n = 0
        chunk = b"x" * (1 << 20)
        try:
            while n < (1 << 30):
                with open(os.path.join(arg, "fill%d" % (n >> 23)), "wb") as f:
                    for _ in range(8):
                        f.write(chunk)
                        n += len(chunk)
        except OSError as e:
            return "stopped after %d MiB: %s" % (n >> 20, e)
        return "wrote %d MiB" % (n >> 20)
    if kind == "proc-mem":
        # Issue 42 item 6: rewrite this process's own memory (the
        # interpreter's, its audit hook's) through /proc/self/mem.
        import ctypes
        b = bytearray(b"before")
        addr = ctypes.addressof((ctypes.c_char * len(b)).from_buffer(b))
        tid = os.listdir("/proc/self/task")[0]
        for path in ("/proc/self/mem", "/proc/self/task/%s/mem" % tid):
            with open(path, "r+b", buffering=0) as f:
                f.seek(addr)
                f.write(b"after!")
        return bytes(b).decode()
    if kind == "mount":
        import ctypes
    if kind == "subprocess":
        return subprocess.run(["id"], capture_output=True, text=True).stdout
    return "?"

def process(event):
    d = event["data"]
    try:
        return {"type": "r", "data": {"ok": repr(attempt(d["kind"], d.get("arg")))}}
    except BaseException as e:
        return {"type": "r", "data": {"err": "%s: %s" % (type(e).__name__, e)}}
`)
	try := func(kind string, arg any) map[string]any {
		t.Helper()
		out, err := call(t, inst, jsonEvent("t", map[string]any{"kind": kind, "arg": arg}))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		return enginetest.DataOf(t, out)
	}
	blocked := func(kind string, arg any, want ...string) {
		t.Helper()
		m := try(kind, arg)
		e, _ := m["err"].(string)
		if e == "" {
			t.Errorf("%s: not blocked: %v", kind, m)
			return
		}
		for _, w := range want {
			if !strings.Contains(e, w) {
				t.Errorf("%s: error %q, want it to contain %q", kind, e, w)
			}
		}
	}

	env := try("env", nil)["ok"].(string)
	if strings.Contains(env, "hunter2") || strings.Contains(env, "WM_NODE_SECRET") || !strings.Contains(env, "VIRTUFIN_WORKER_ID") {
		t.Errorf("worker environment = %s; want only the worker variables", env)
	}
	blocked("proc-environ", os.Getpid(), "FileNotFoundError")         // the node is not in its PID namespace
	blocked("read-file", secretFile, "FileNotFoundError")             // not in its mount namespace
	blocked("read-file", "/root/.bashrc", "Error")                    // nor is /root
	blocked("write-outside", nil, "OSError", "Read-only file system") // the runtime is read-only
	if m := try("write-scratch", nil); !strings.Contains(fmt.Sprint(m["ok"]), "ok uid=2") {
		t.Errorf("scratch directory: %v; want writable, as an unprivileged uid of its own", m)
	}
	if m := try("write-tmp", nil); !strings.Contains(fmt.Sprint(m["ok"]), "ok in /tmp") {
		t.Errorf("temporary files: %v; want them in the sandbox's own /tmp (TMPDIR)", m)
	}
	blocked("tcp", tcp.Addr().(*net.TCPAddr).Port, "ConnectionRefusedError") // own network namespace
	blocked("unix", unixPath, "FileNotFoundError")
	// UDP to the node's loopback: the datagram stays in the sandbox's own
	// network namespace (sendto may succeed there; nothing arrives here).
	try("udp", udp.LocalAddr().(*net.UDPAddr).Port)
	_ = udp.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, _, err := udp.ReadFrom(make([]byte, 64)); err == nil {
		t.Errorf("a datagram of %d bytes reached the node's loopback", n)
	}
	blocked("kill-node", os.Getpid(), "ProcessLookupError")
	// Issue 42 item 6: the runner is not dumpable, so its /proc/self/mem
	// (and each thread's) belongs to root and its own user id cannot open it.
	blocked("proc-mem", nil, "PermissionError", "/proc/self/mem")
	blocked("memory", nil, "MemoryError")
	blocked("big-file", nil, "File too large")
	// Issue 32 item 3: /tmp and /scratch are as large as the sandbox says
	// (64 MiB by default), not half the node's memory or its disk.
	for _, dir := range []string{"/tmp", "/scratch"} {
		m := try("fill", dir)
		got := fmt.Sprint(m["ok"])
		var mib int
		if _, err := fmt.Sscanf(got, "'stopped after %d MiB", &mib); err != nil || !strings.Contains(got, "No space left on device") || mib > 64 {
			t.Errorf("filling %s: %v; want ENOSPC at 64 MiB at most", dir, m)
		}
	}
	// Issue 32 item 2: no new namespaces (clone with namespace flags gets
	// EPERM, clone3 ENOSYS so that the C library falls back to clone).
	blocked("clone-ns", nil, "Operation not permitted")
	blocked("clone3-ns", nil, "Function not implemented")
	if m := try("escape-session", nil); m["ok"] != "'forked'" {
		t.Errorf("escape-session: %v", m)
	}
	if m := try("subprocess", nil); !strings.Contains(fmt.Sprint(m["ok"]), "uid=2") {
		t.Errorf("a subprocess runs inside the sandbox as its uid: %v", m)
	}
	if m := try("fork-bomb", nil); !strings.Contains(fmt.Sprint(m["ok"]), "stopped after") {
		t.Errorf("fork bomb: %v; want stopped by the process limit", m)
	}
	// Still serving after all of that.
	if m := try("env", nil); m["ok"] == nil {
		t.Fatalf("instance stopped serving: %v", m)
	}

	// Closing the instance takes every process of the sandbox with it: the
	// fork bomb's children and the setsid'd grandchild included.
	uid, ok := sb.UID(testSpec.WorkerID)
	if !ok {
		t.Fatal("no user id for the worker in strict mode")
	}
	pids := sandboxProcesses(t, uid)
	if len(pids) < 3 {
		t.Fatalf("sandbox processes before Close: %v; want the runner, the bomb's children and the escaped grandchild", pids)
	}
	if err := inst.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(sandboxProcesses(t, uid)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if left := sandboxProcesses(t, uid); len(left) > 0 {
		t.Fatalf("processes left after Close: %v", left)
	}
}

// sandboxProcesses lists the pids running as uid (the worker's: other
// packages' sandboxes may run at the same time).
func sandboxProcesses(t *testing.T, uid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
				if u, _ := strconv.Atoi(f[1]); u == uid {
					pids = append(pids, pid)
				}
			}
		}
	}
	return pids
}

// A module-level import the allowlist refuses is invalid code under the
// sandbox too, and an allowed package imports.
func TestSandboxAllowlistAtCheck(t *testing.T) {
	e := newEngine(t, python.Config{Sandbox: sandboxtest.Strict(t), AllowedPackages: []string{"xml"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := e.Check(ctx, testSpec, []byte("import socket\ndef process(event):\n    return None\n"))
	if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "import of 'socket' is not allowed") {
		t.Fatalf("Check = %v", err)
	}
	if err := e.Check(ctx, testSpec, []byte("import xml.dom.minidom\ndef process(event):\n    return None\n")); err != nil {
		t.Fatalf("allowed package: %v", err)
	}
}

// Issue 32 item 2: without the subprocess capability the runner installs
// the sandbox's process lockdown filter before worker code, so that even
// code past the interpreter guard (here: ctypes, allowed on purpose)
// cannot start a process or run a program; threads still work.
func TestSandboxLockdownStopsProcesses(t *testing.T) {
	sb := sandboxtest.Strict(t)
	e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"ctypes", "threading"}, DefaultTimeout: 20 * time.Second})
	inst := load(t, e, testSpec, `
import asyncio, ctypes, threading

libc = ctypes.CDLL(None, use_errno=True)

def failed(r):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, asyncio.base_events.BaseEventLoop.__init__.__globals__["os"].strerror(e))

def attempt(kind):
    if kind == "fork":
        pid = libc.fork()
        if pid == 0:
            libc._exit(0)
        failed(pid)
        return "forked"
    if kind == "execv":
        argv = (ctypes.c_char_p * 4)(b"/bin/sh", b"-c", b"echo pwned", None)
        failed(libc.execv(b"/bin/sh", argv))
        return "exec'd"
    if kind == "fork-exec":
        return asyncio.base_events.BaseEventLoop.__init__.__globals__["subprocess"]._fork_exec([b"/bin/sh"], [b"/bin/sh"], True, (), None, None,
            -1, -1, -1, -1, -1, -1, -1, -1, True, False, -1, None, None, None, -1, None, False)
    if kind == "thread":
        out = []
        th = threading.Thread(target=lambda: out.append("ran"))
        th.start()
        th.join()
        return out[0]
    if kind == "filters":
        return [l for l in open("/proc/self/status").read().splitlines() if l.startswith("Seccomp")]

def process(event):
    try:
        return {"type": "r", "data": {"ok": attempt(event["data"]["kind"])}}
    except BaseException as e:
        return {"type": "r", "data": {"err": "%s: %s" % (type(e).__name__, e)}}
`)
	try := func(kind string) map[string]any {
		t.Helper()
		out, err := call(t, inst, jsonEvent("t", map[string]any{"kind": kind}))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		return enginetest.DataOf(t, out)
	}
	for kind, want := range map[string]string{
		"fork":      "Operation not permitted",
		"execv":     "Operation not permitted",
		"fork-exec": "starting processes or sending signals is not allowed",
	} {
		if m := try(kind); !strings.Contains(fmt.Sprint(m["err"]), want) {
			t.Errorf("%s: %v; want an error containing %q", kind, m, want)
		}
	}
	if m := try("thread"); m["ok"] != "ran" {
		t.Errorf("a thread: %v; want it to run", m)
	}
	if m := try("filters"); !strings.Contains(fmt.Sprint(m["ok"]), "Seccomp_filters:\t2") {
		t.Errorf("seccomp status %v; want the sandbox's filter and the lockdown", m)
	}
}
