package python_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox"
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
        raise OSError(e, asyncio.base_events.os.strerror(e))

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
	if os.Getenv("WM_REQUIRE_SANDBOX") == "" && !strings.Contains(readStatus(t), "Seccomp_filters:") {
		t.Skip("no seccomp filters in this kernel")
	}
	sb, err := sandbox.New(context.Background(), sandbox.Config{Mode: sandbox.Standard, Bwrap: "/nonexistent/bwrap",
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
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

	// A worker that may start processes gets no lockdown, but the pipe is
	// taken away all the same.
	free := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"ctypes", "threading", "subprocess"}, DefaultTimeout: 20 * time.Second})
	fi := load(t, free, testSpec, lockdownProbe)
	out, err := call(t, fi, jsonEvent("t", map[string]any{"kind": "filters"}))
	if err != nil {
		t.Fatal(err)
	}
	if m := enginetest.DataOf(t, out); !strings.Contains(fmt.Sprint(m["ok"]), "Seccomp_filters:\t0") {
		t.Errorf("with subprocess allowed: seccomp status %v; want no filter", m)
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
