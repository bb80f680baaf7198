package python_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
)

// The audit hook, not the import check, refuses what worker code reaches
// through modules the runner (or an allowed module) imported: a socket
// from asyncio's own socket module, ctypes loaded through importlib (which
// bypasses the worker's __import__), and sys._getframe, each unless its
// capability is allowed.
func TestGuardAuditHookRefusesSocketsCtypesAndFrames(t *testing.T) {
	code := `
import asyncio

# asyncio's own globals: a route to socket and sys that the interpreter
# layer leaves open (docs/security.md); the audit hook is what refuses.
be = asyncio.base_events.BaseEventLoop.__init__.__globals__

def attempt(kind):
    if kind == "socket":
        be["socket"].socket(be["socket"].AF_INET, be["socket"].SOCK_STREAM).close()
        return "socket"
    if kind == "ctypes":
        ctypes = be["sys"].modules["importlib"].import_module("ctypes")
        ctypes.CDLL(None)
        return "ctypes"
    if kind == "getframe":
        return str(be["sys"]._getframe(0))

def process(event):
    try:
        return {"type": "r", "data": {"ok": attempt(event["data"]["kind"])}}
    except BaseException as e:
        return {"type": "r", "data": {"err": "%s: %s" % (type(e).__name__, e)}}
`
	e := newEngine(t, python.Config{AllowedPackages: []string{"threading"}})
	inst := load(t, e, testSpec, code)
	for kind, want := range map[string]string{
		"socket":   "audit event socket.__new__",
		"ctypes":   "'ctypes' is in PYTHON_ALLOWED_PACKAGES",
		"getframe": "PermissionError: introspecting frames",
	} {
		out, err := call(t, inst, jsonEvent("t", map[string]any{"kind": kind}))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if m := enginetest.DataOf(t, out); !strings.Contains(fmt.Sprint(m["err"]), want) {
			t.Errorf("%s: %v; want an error containing %q", kind, m, want)
		}
	}
	// Allowed, the same calls work (the refusal is the capability's).
	free := newEngine(t, python.Config{AllowedPackages: []string{"socket", "ctypes"}})
	fi := load(t, free, testSpec, code)
	for _, kind := range []string{"socket", "ctypes"} {
		out, err := call(t, fi, jsonEvent("t", map[string]any{"kind": kind}))
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if m := enginetest.DataOf(t, out); m["ok"] != kind {
			t.Errorf("%s allowed: %v; want it to work", kind, m)
		}
	}
}
