package python_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/python"
)

// The interpreter layer (runner.py's guard): the import allowlist and the
// audit hook. The OS layers are tested in engines/sandbox and end to end.

func TestGuardModuleLevelImportIsInvalidCode(t *testing.T) {
	e := newEngine(t, python.Config{AllowedPackages: []string{}})
	for _, c := range []struct{ code, module string }{
		{"import os\n", "os"},
		{"import subprocess\n", "subprocess"},
		{"from os import path\n", "os"},
		{"import urllib.request\n", "urllib.request"},
		{"import importlib\n", "importlib"},
		{"import ctypes\n", "ctypes"},
		{"socket = __import__('socket')\n", "socket"},
		{"import sys\n", "sys"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := e.Check(ctx, testSpec, []byte(c.code+"def process(event):\n    return None\n"))
		cancel()
		if !errors.Is(err, engines.ErrInvalidCode) {
			t.Errorf("%q: Check = %v, want ErrInvalidCode", c.code, err)
			continue
		}
		for _, w := range []string{"ImportError: import of '" + c.module + "' is not allowed", "PYTHON_ALLOWED_PACKAGES", "(line 1)"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: Check = %q, want it to contain %q", c.code, err, w)
			}
		}
	}
}

func TestGuardAllowsTheSafeSubsetAndTheSetting(t *testing.T) {
	e := newEngine(t, python.Config{AllowedPackages: []string{"xml"}})
	inst := load(t, e, testSpec, `
import json, math, re, datetime, hashlib, base64, collections, logging, asyncio
import urllib.parse
from urllib.parse import quote
import xml.etree.ElementTree as ET

async def process(event):
    await asyncio.sleep(0)
    d = datetime.datetime.strptime("2026-11-23", "%Y-%m-%d")  # imports _strptime lazily
    root = ET.fromstring("<a>1</a>")
    return {"type": "ok", "data": {"day": d.day, "xml": root.text, "q": quote("a b"),
            "h": hashlib.sha256(b"x").hexdigest()[:4], "sqrt": math.isqrt(16)}}
`)
	out := mustCall(t, inst, jsonEvent("t", nil))
	if len(out) != 1 || !strings.Contains(string(out[0].Data()), `"day":23`) || !strings.Contains(string(out[0].Data()), `"xml":"1"`) {
		t.Fatalf("outputs = %v", out)
	}
}

// Each attempt runs inside process(); the guard turns it into a worker
// error (ErrWorkerFailed) that names what was refused, and the process
// keeps serving.
func TestGuardRefusesInsideProcess(t *testing.T) {
	e := newEngine(t, python.Config{AllowedPackages: []string{"os"}})
	inst := load(t, e, testSpec, `
import json, os

def process(event):
    kind = event["data"]["kind"]
    if kind == "import":
        import socket
    if kind == "dunder-import":
        __import__("subprocess")
    if kind == "builtins-of-another-module":
        real = json.__dict__["__builtins__"]["__import__"]   # the real __import__
        real("subprocess").run(["true"])
    if kind == "sys-modules":
        real = json.__dict__["__builtins__"]["__import__"]
        real("sys").modules["os"].system("true")
    if kind == "importlib":
        real = json.__dict__["__builtins__"]["__import__"]
        real("importlib").import_module("subprocess").Popen(["true"])
    if kind == "system":
        os.system("true")
    if kind == "kill-parent":
        os.kill(os.getppid(), 9)
    if kind == "fork":
        os.fork()
    if kind == "subclasses":
        for c in ().__class__.__base__.__subclasses__():
            if c.__name__ == "_wrap_close":
                c.__init__.__globals__["system"]("true")
    if kind == "frames":
        try:
            1 / 0
        except ZeroDivisionError as e:
            e.__traceback__.tb_frame.f_back.f_globals["os"].system("true")
    if kind == "code":
        return {"type": "x", "data": str(process.__code__)}
    return {"type": "ok"}
`)
	for kind, want := range map[string]string{
		"import":                     "import of 'socket' is not allowed",
		"dunder-import":              "import of 'subprocess' is not allowed",
		"builtins-of-another-module": "starting processes or sending signals is not allowed",
		"system":                     "audit event os.system",
		"sys-modules":                "audit event os.system",
		"importlib":                  "audit event subprocess.Popen",
		"kill-parent":                "audit event os.kill",
		"fork":                       "audit event os.fork",
		"subclasses":                 "audit event os.system",
		"frames":                     "introspecting frames",
		"code":                       "introspecting frames",
	} {
		_, err := call(t, inst, jsonEvent("t", map[string]any{"kind": kind}))
		if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want ErrWorkerFailed containing %q", kind, err, want)
		}
	}
	if out := mustCall(t, inst, jsonEvent("t", map[string]any{"kind": "none"})); len(out) != 1 || out[0].Type() != "ok" {
		t.Fatalf("after the attempts: outputs = %v", out)
	}
}

func TestValidatePackages(t *testing.T) {
	if err := python.ValidatePackages([]string{"numpy", "xml.etree", "_private"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "1abc", "a-b", "a..b", "os; rm"} {
		if err := python.ValidatePackages([]string{bad}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// forkExecSh is worker code that starts /bin/sh through the function
// subprocess.Popen uses, reached from the safe subset (asyncio's globals'
// subprocess._fork_exec, Python 3.11's signature):
// it raises no audit event of its own. Its "run" kind returns what the
// shell printed.
const forkExecSh = `
import asyncio, json

be = asyncio.base_events.BaseEventLoop.__init__.__globals__

def run(fe):
    os_ = be["os"]
    err_r, err_w = os_.pipe()
    out_r, out_w = os_.pipe()
    pid = fe([b"/bin/sh", b"-c", b"echo pwned"], [b"/bin/sh"], True, (err_w, out_w), None, None,
             -1, -1, -1, out_w, -1, -1, err_r, err_w, True, False, -1, None, None, None, -1, None, False)
    os_.close(out_w)
    os_.close(err_w)
    out = os_.read(out_r, 100)
    os_.waitpid(pid, 0)
    return out.decode()

def process(event):
    kind = event["data"]["kind"]
    sp = be["subprocess"]
    if kind == "asyncio-fork-exec":
        return {"type": "r", "data": run(sp._fork_exec)}
    if kind == "posixsubprocess-fork-exec":
        return {"type": "r", "data": run(be["sys"].modules["_posixsubprocess"].fork_exec)}
    if kind == "posixsubprocess-reimport":
        real = json.__dict__["__builtins__"]["__import__"]   # the real __import__
        be["sys"].modules.pop("_posixsubprocess", None)
        return {"type": "r", "data": run(real("_posixsubprocess").fork_exec)}
    return {"type": "ok"}
`

// Issue 32 item 2: _posixsubprocess.fork_exec starts a program without an
// audit event; without the subprocess capability the runner replaces it
// (as subprocess._fork_exec and in _posixsubprocess) before worker code.
func TestGuardRefusesUnauditedForkExec(t *testing.T) {
	e := newEngine(t, python.Config{AllowedPackages: []string{"json"}})
	inst := load(t, e, testSpec, forkExecSh)
	for _, kind := range []string{"asyncio-fork-exec", "posixsubprocess-fork-exec", "posixsubprocess-reimport"} {
		out, err := call(t, inst, jsonEvent("t", map[string]any{"kind": kind}))
		if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "starting processes or sending signals is not allowed") {
			t.Errorf("%s: outputs %v, err = %v; want ErrWorkerFailed, processes not allowed", kind, out, err)
		}
	}
	if out := mustCall(t, inst, jsonEvent("t", map[string]any{"kind": "none"})); len(out) != 1 || out[0].Type() != "ok" {
		t.Fatalf("after the attempts: outputs = %v", out)
	}
	// With the capability, the same code runs the shell (the guard does not
	// refuse what the operator allowed).
	e2 := newEngine(t, python.Config{AllowedPackages: []string{"subprocess"}})
	inst2 := load(t, e2, testSpec, forkExecSh)
	out := mustCall(t, inst2, jsonEvent("t", map[string]any{"kind": "asyncio-fork-exec"}))
	if len(out) != 1 || !strings.Contains(string(out[0].Data()), "pwned") {
		t.Fatalf("with subprocess allowed: outputs = %v", out)
	}
}
