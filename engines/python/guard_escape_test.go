package python_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
)

// Issue 42 item 6: the interpreter layer walked around in plain Python.
// These are the escape corpus's techniques against the guard itself (no
// package allowed); the OS-level ones (/proc/self/mem, IP sockets without
// bubblewrap) are in sandbox_test.go and sandbox_nobwrap_test.go.

// `from X import *` was admitted for any X: the fromlist check dropped
// "*" and ended in all([]).
func TestGuardStarImportIsChecked(t *testing.T) {
	e := newEngine(t, python.Config{AllowedPackages: []string{}})
	for _, c := range []struct{ code, module string }{
		{"from importlib import *\n", "importlib"},
		{"from os import *\n", "os"},
		{"from urllib import *\n", "urllib"},
		{"from subprocess import *\n", "subprocess"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := e.Check(ctx, testSpec, []byte(c.code+"def process(event):\n    return None\n"))
		cancel()
		if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "import of '"+c.module+"' is not allowed") {
			t.Errorf("%q: Check = %v, want ErrInvalidCode: import of %q is not allowed", c.code, err, c.module)
		}
	}
	// Allowed modules still star-import, and a from-import of an allowed
	// submodule of a refused package still works.
	inst := load(t, e, testSpec, `
from math import *
from json import *
from urllib import parse

def process(event):
    return {"type": "ok", "data": {"pi": round(pi, 2), "q": parse.quote("a b"), "d": dumps([1])}}
`)
	out := mustCall(t, inst, jsonEvent("t", nil))
	if m := enginetest.DataOf(t, out); m["pi"] != 3.14 || m["q"] != "a%20b" || m["d"] != "[1]" {
		t.Fatalf("outputs = %v", m)
	}
}

// Allowed modules handed out the refused modules they hold as attributes
// (logging.os, random._os, uuid.os, logging.sys, ...): the worker gets
// views of them without those attributes.
func TestGuardHidesRefusedModulesBehindAllowedOnes(t *testing.T) {
	e := newEngine(t, python.Config{AllowedPackages: []string{"xml"}})
	inst := load(t, e, testSpec, `
import logging, random, uuid, asyncio, json, typing
import logging.handlers
import xml.etree.ElementTree as ET

def attempt(kind):
    if kind == "logging.os":
        return repr(logging.os)
    if kind == "random._os":
        return repr(random._os)
    if kind == "uuid.os":
        return repr(uuid.os)
    if kind == "logging.sys":
        return repr(logging.sys)
    if kind == "typing.sys":
        return repr(typing.sys)
    if kind == "asyncio.base_events.socket":
        return repr(asyncio.base_events.socket)
    if kind == "asyncio.base_events.subprocess":
        return repr(asyncio.base_events.subprocess)
    if kind == "logging.handlers.socket":
        return repr(logging.handlers.socket)
    if kind == "xml...ElementTree.sys":
        return repr(ET.sys)
    if kind == "getattr":
        return repr(getattr(logging, "o" + "s"))
    if kind == "dict":
        return repr(vars(logging)["os"])
    if kind == "from-import":
        from logging import os
        return repr(os)
    if kind == "allowed":
        logging.raiseExceptions = logging.raiseExceptions
        logging.getLogger("w").warning("logging finds its caller with sys._getframe: not refused")
        return [json.decoder.JSONDecoder().decode("[1]")[0], logging.handlers.MemoryHandler.__name__,
                asyncio.base_events.BaseEventLoop.__name__, ET.fromstring("<a>2</a>").text,
                random.Random(1).random() == random.Random(1).random(), len(str(uuid.uuid4()))]

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
	for _, kind := range []string{"logging.os", "random._os", "uuid.os", "logging.sys", "typing.sys",
		"asyncio.base_events.socket", "asyncio.base_events.subprocess", "logging.handlers.socket",
		"xml...ElementTree.sys", "getattr"} {
		if m := try(kind); !strings.Contains(fmt.Sprint(m["err"]), "AttributeError") || !strings.Contains(fmt.Sprint(m["err"]), "which a worker may not import") {
			t.Errorf("%s: %v; want an AttributeError naming the refused module", kind, m)
		}
	}
	if m := try("dict"); !strings.Contains(fmt.Sprint(m["err"]), "KeyError") {
		t.Errorf("vars(logging)['os']: %v; want a KeyError", m)
	}
	if m := try("from-import"); !strings.Contains(fmt.Sprint(m["err"]), "ImportError") {
		t.Errorf("from logging import os: %v; want an ImportError", m)
	}
	if m := try("allowed"); fmt.Sprint(m["ok"]) != "[1 MemoryHandler BaseEventLoop 2 true 36]" {
		t.Errorf("allowed attributes: %v", m)
	}
}

// The guard's state was reachable from worker code:
// sys.modules["__main__"]._guard.denied_events.clear() switched the audit
// hook off. Each tampering below runs in a fresh runner, then the hook
// must still refuse a socket, a process and frame introspection. The
// worker reaches sys through a function's __globals__, which the
// interpreter layer does not close (docs/security.md).
func TestGuardStateIsOutOfReach(t *testing.T) {
	const code = `
import logging, json

sys_ = logging.getLogger.__globals__["sys"]
real_import = json.loads.__globals__["__builtins__"]["__import__"]
main = sys_.modules["__main__"]

def tamper(kind):
    if kind == "main-guard":
        main._guard.denied_events.clear()
    if kind == "main-globals":
        for name in ("_FRAME_EVENTS", "_FRAME_ATTRS", "_PROCESS_MODULES", "SAFE_STDLIB"):
            setattr(main, name, frozenset())
        main._CAPABILITIES = ()
        main.FILENAME = "<nothing>"
    if kind == "builtins":
        b = json.loads.__globals__["__builtins__"]
        b["PermissionError"] = None  # the runner's own module
    if kind == "gc":
        gc = sys_.modules["gc"]
        gc.unfreeze()  # the runner froze what it loaded
        for o in gc.get_objects():
            if type(o).__name__ == "_Guard":
                o.denied_events.clear()
            if callable(o) and getattr(o, "__closure__", None):
                for c in o.__closure__:
                    if type(c.cell_contents) in (frozenset, dict) and "socket.__new__" in c.cell_contents:
                        c.cell_contents = frozenset()
    if kind == "settrace":
        sys_.settrace(lambda *a: None)

def attempt(kind):
    if kind == "socket":
        real_import("socket").socket().close()
    if kind == "system":
        real_import("os").system("true")
    if kind == "frames":
        sys_._getframe(0)
    if kind == "code":
        process.__code__
    return "not refused"

def process(event):
    d = event["data"]
    try:
        if "tamper" in d:
            tamper(d["tamper"])
            return {"type": "r", "data": {"ok": "tampered"}}
        return {"type": "r", "data": {"ok": attempt(d["kind"])}}
    except BaseException as e:
        return {"type": "r", "data": {"err": "%s: %s" % (type(e).__name__, e)}}
`
	e := newEngine(t, python.Config{AllowedPackages: []string{}})
	for _, tamper := range []string{"main-guard", "main-globals", "builtins", "gc", "settrace"} {
		inst := load(t, e, testSpec, code)
		out, err := call(t, inst, jsonEvent("t", map[string]any{"tamper": tamper}))
		if err != nil {
			t.Fatalf("%s: %v", tamper, err)
		}
		m := enginetest.DataOf(t, out)
		t.Logf("%s: %v", tamper, m)
		// Walking the collector's objects and tracing frames (which reach
		// the hook's closure) are refused themselves.
		if (tamper == "gc" || tamper == "settrace") && !strings.Contains(fmt.Sprint(m["err"]), "is not allowed in a worker") {
			t.Errorf("%s: %v; want it refused", tamper, m)
		}
		for kind, want := range map[string]string{
			"socket": "audit event socket.__new__",
			"system": "audit event os.system",
			"frames": "introspecting frames",
			"code":   "introspecting frames",
		} {
			out, err := call(t, inst, jsonEvent("t", map[string]any{"kind": kind}))
			if err != nil {
				t.Fatalf("%s then %s: %v", tamper, kind, err)
			}
			if m := enginetest.DataOf(t, out); !strings.Contains(fmt.Sprint(m["err"]), want) {
				t.Errorf("after %s, %s: %v; want refused: %q", tamper, kind, m, want)
			}
		}
		_ = inst.Close(context.Background())
	}
}
