package python_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// lockdownProbe is a worker with ctypes (allowed on purpose: code past the
// interpreter guard) that tries to start processes.
const lockdownProbe = `
import asyncio, ctypes, threading

libc = ctypes.CDLL(None, use_errno=True)
libc.getenv.restype = ctypes.c_char_p

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
    if kind == "thread":
        out = []
        th = threading.Thread(target=lambda: out.append("ran"))
        th.start()
        th.join()
        return out[0]
    if kind == "filters":
        return [l for l in open("/proc/self/status").read().splitlines() if l.startswith("Seccomp")]
    if kind == "env":
        v = libc.getenv(b"WORKMANAGER_LOCKDOWN_FD")
        return None if v is None else v.decode()

def process(event):
    try:
        return {"type": "r", "data": {"ok": attempt(event["data"]["kind"])}}
    except BaseException as e:
        return {"type": "r", "data": {"err": "%s: %s" % (type(e).__name__, e)}}
`

// Issue 32, round two, gap 4: with SANDBOX=standard where bubblewrap
// cannot run (no namespaces layer, so no file at sandbox.LockdownPath),
// the runner still installs the process lockdown before worker code: the
// node passes the filter on an inherited pipe (sandbox.LockdownFDEnv).
// Before, such a runner loaded the code without any filter and libc's
// fork and execv worked.
func TestSandboxWithoutNamespacesStillLocksDown(t *testing.T) {
	sb := noBwrapSandbox(t)
	if s := sb.Summary(); !strings.Contains(s, "MISSING: namespaces") {
		t.Fatalf("summary %q; want the namespaces layer missing", s)
	}
	e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"ctypes", "threading"}, DefaultTimeout: 20 * time.Second})
	inst := load(t, e, testSpec, lockdownProbe)
	try := func(kind string) map[string]any {
		t.Helper()
		out, err := call(t, inst, jsonEvent("t", map[string]any{"kind": kind}))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		return enginetest.DataOf(t, out)
	}
	for _, kind := range []string{"fork", "execv"} {
		if m := try(kind); !strings.Contains(fmt.Sprint(m["err"]), "Operation not permitted") {
			t.Errorf("%s: %v; want EPERM from the lockdown", kind, m)
		}
	}
	if m := try("thread"); m["ok"] != "ran" {
		t.Errorf("a thread: %v; want it to run", m)
	}
	if m := try("filters"); !strings.Contains(fmt.Sprint(m["ok"]), "Seccomp_filters:\t1") {
		t.Errorf("seccomp status %v; want the lockdown (and no other filter: no bwrap)", m)
	}
	if m := try("env"); m["ok"] != nil || m["err"] != nil {
		t.Errorf("the worker sees %v; want the lockdown's variable taken away before its code", m)
	}

	// A worker that may start processes gets no process lockdown (the pipe
	// is taken away all the same), only its network part (issue 42 item
	// 6: TestSandboxWithoutNamespacesRefusesIPSockets).
	free := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"ctypes", "threading", "subprocess"}, DefaultTimeout: 20 * time.Second})
	fi := load(t, free, testSpec, lockdownProbe)
	out, err := call(t, fi, jsonEvent("t", map[string]any{"kind": "filters"}))
	if err != nil {
		t.Fatal(err)
	}
	if m := enginetest.DataOf(t, out); !strings.Contains(fmt.Sprint(m["ok"]), "Seccomp_filters:\t1") {
		t.Errorf("with subprocess allowed: seccomp status %v; want the network filter only", m)
	}
}

// A lockdown announced but not readable refuses the code instead of
// running it without (here the variable names an fd that is not open).
func TestLockdownExpectedButMissingRefusesCode(t *testing.T) {
	e := newEngine(t, python.Config{AllowedPackages: []string{"os"}, Env: []string{sandbox.LockdownFDEnv + "=9"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := e.Check(ctx, testSpec, []byte("def process(event):\n    return None\n"))
	if err == nil || !strings.Contains(err.Error(), "process lockdown could not be installed") {
		t.Fatalf("Check = %v; want the code refused for the missing lockdown", err)
	}
}

func readStatus(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// netProbe tries the node's network from a worker whose interpreter guard
// lets sockets (and ctypes, and in one case processes) through: only the
// OS layer can refuse.
const netProbe = `
import asyncio, ctypes, os, socket, sys

def attempt(kind, port):
    if kind == "tcp":
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return "connected"
    if kind == "tcp6":
        socket.create_connection(("::1", port), timeout=2).close()
        return "connected"
    if kind == "udp":
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b"escaped", ("127.0.0.1", port))
        return "sent"
    if kind == "packet":
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
        return "opened"
    if kind == "netlink":
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()
        return "opened"
    if kind == "high-bits":
        # AF_INET with an upper bit set: the kernel's int family drops it.
        libc = ctypes.CDLL(None, use_errno=True)
        L = ctypes.c_long
        fd = libc.syscall(L(41), L((1 << 32) | 2), L(1), L(0))
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        os.close(fd)
        return "opened"
    if kind == "unix":
        a, b = socket.socketpair()
        a.send(b"x")
        got = b.recv(1)
        loop = asyncio.new_event_loop()
        loop.close()
        return got.decode()
    if kind == "child":
        import subprocess
        r = subprocess.run([sys.executable, "-I", "-S", "-c",
                            "import socket; socket.create_connection(('127.0.0.1', %d), timeout=2)" % port],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return "child connected"
        raise OSError(r.stderr.strip().splitlines()[-1])
    if kind == "filters":
        return [l for l in open("/proc/self/status").read().splitlines() if l.startswith("Seccomp")]

def process(event):
    d = event["data"]
    try:
        return {"type": "r", "data": {"ok": attempt(d["kind"], d.get("port"))}}
    except BaseException as e:
        return {"type": "r", "data": {"err": "%s: %s" % (type(e).__name__, e)}}
`

// Issue 42 item 6: with SANDBOX=standard and no bubblewrap (the
// unprivileged Kubernetes overlay) a worker shares the node's network
// namespace, and it reached a loopback listener of the node. The lockdown
// such a process gets refuses every socket but AF_UNIX: also to a worker
// that may start processes (it gets the network part only), and to the
// processes it starts (filters are inherited).
func TestSandboxWithoutNamespacesRefusesIPSockets(t *testing.T) {
	sb := noBwrapSandbox(t)
	reached := make(chan string, 16)
	listen := func(network, addr string) int {
		l, err := net.Listen(network, addr)
		if err != nil {
			return 0
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				reached <- network
				c.Close()
			}
		}()
		return l.Addr().(*net.TCPAddr).Port
	}
	tcp := listen("tcp4", "127.0.0.1:0")
	tcp6 := listen("tcp6", "[::1]:0")
	udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()

	for _, allowed := range [][]string{{"socket", "ctypes", "os", "sys"}, {"socket", "ctypes", "os", "sys", "subprocess"}} {
		e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: allowed, DefaultTimeout: 20 * time.Second})
		inst := load(t, e, testSpec, netProbe)
		try := func(kind string, port int) map[string]any {
			t.Helper()
			out, err := call(t, inst, jsonEvent("t", map[string]any{"kind": kind, "port": port}))
			if err != nil {
				t.Fatalf("%v %s: %v", allowed, kind, err)
			}
			return enginetest.DataOf(t, out)
		}
		refused := func(kind string, port int, want string) {
			t.Helper()
			if m := try(kind, port); !strings.Contains(fmt.Sprint(m["err"]), want) {
				t.Errorf("%v %s: %v; want refused (%q)", allowed, kind, m, want)
			}
		}
		refused("tcp", tcp, "Operation not permitted")
		if tcp6 != 0 {
			refused("tcp6", tcp6, "Operation not permitted")
		}
		refused("udp", udp.LocalAddr().(*net.UDPAddr).Port, "Operation not permitted")
		refused("high-bits", 0, "Operation not permitted")
		refused("packet", 0, "Operation not permitted")
		refused("netlink", 0, "Operation not permitted")
		if m := try("unix", 0); m["ok"] != "x" {
			t.Errorf("%v: a Unix socket pair and an event loop: %v; want them to work", allowed, m)
		}
		if m := try("filters", 0); !strings.Contains(fmt.Sprint(m["ok"]), "Seccomp_filters:\t1") {
			t.Errorf("%v: seccomp status %v; want one filter", allowed, m)
		}
		if slices.Contains(allowed, "subprocess") {
			refused("child", tcp, "Operation not permitted")
		}
		_ = inst.Close(context.Background())
	}
	_ = udp.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _, err := udp.ReadFrom(make([]byte, 64)); err == nil {
		t.Errorf("a datagram of %d bytes reached the node's loopback", n)
	}
	select {
	case n := <-reached:
		t.Errorf("a worker reached the node's %s listener", n)
	default:
	}
}

// noBwrapSandbox is SANDBOX=standard where bubblewrap cannot run (the
// unprivileged Kubernetes overlay): no namespaces, the lockdown filters on
// inherited pipes. A kernel without seccomp filters skips t (a failure
// with WM_REQUIRE_SANDBOX).
func noBwrapSandbox(t *testing.T) *sandbox.Sandbox {
	t.Helper()
	if os.Getenv(sandboxtest.RequireEnv) == "" && !strings.Contains(readStatus(t), "Seccomp_filters:") {
		t.Skip("no seccomp filters in this kernel")
	}
	return sandboxtest.New(t, sandbox.Config{Mode: sandbox.Standard, Bwrap: "/nonexistent/bwrap", Log: slog.New(slog.DiscardHandler)})
}
