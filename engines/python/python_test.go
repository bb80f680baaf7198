package python_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

const echoBody = `
    return {
        "type": "conformance.echo",
        "data": {
            "id": event["id"],
            "data": event.get("data"),
            "correlationid": event.get("correlationid"),
        },
    }
`

var fixtures = enginetest.Fixtures{
	Echo: []byte("def process(event):" + echoBody),
	Multi: []byte(`
def process(event):
    return [
        {"type": "conformance.a", "data": {"n": 1}},
        {"type": "conformance.b"},
    ]
`),
	None: []byte(`
def process(event):
    pass
`),
	Raise: []byte(`
def process(event):
    if event["type"] == "conformance.raise":
        raise RuntimeError("boom")
` + echoBody),
	Hang: []byte(`
import time

def process(event):
    if event["type"] == "conformance.hang":
        while True:
            time.sleep(3600)
` + echoBody),
	Invalid: []byte(`
def process(event)
    return None
`),
}

// testAllowed are the modules the engine's own tests import beyond the
// safe subset (to exit, kill, fork and read the environment on purpose);
// the guard's tests (sandbox_test.go) set AllowedPackages themselves.
var testAllowed = []string{"os", "sys", "subprocess", "signal", "threading", "no_such_module_xyz"}

func newEngine(t testing.TB, cfg python.Config) *python.Engine {
	t.Helper()
	if cfg.AllowedPackages == nil {
		cfg.AllowedPackages = testAllowed
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := python.New(cfg)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func TestConformance(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Engine:   newEngine(t, python.Config{}),
		MIMEType: python.MIMEType,
		Fixtures: fixtures,
	})
}

func TestConformanceTwoProcesses(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Engine:   newEngine(t, python.Config{Processes: 2}),
		MIMEType: python.MIMEType,
		Fixtures: fixtures,
	})
}

// --- Python-specific tests ---------------------------------------------

// recorder is a slog.Handler that keeps the records it gets.
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.records = append(r.records, rec.Clone())
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// lines returns "stream|worker_id|message" for every record.
func (r *recorder) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.records {
		attrs := map[string]string{}
		rec.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		out = append(out, attrs["stream"]+"|"+attrs["worker_id"]+"|"+rec.Message)
	}
	return out
}

var testSpec = engines.Spec{
	WorkerID: "w-test",
	MIMEType: python.MIMEType,
	Topic:    "topic-test",
	Group:    "group-test",
}

// load loads Python source (see enginetest.Load).
func load(t *testing.T, e *python.Engine, spec engines.Spec, code string) engines.Instance {
	t.Helper()
	return enginetest.Load(t, e, spec, []byte(code))
}

// call runs Process with a 30s bound.
func call(t *testing.T, inst engines.Instance, ev *event.Event) ([]event.Event, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return inst.Process(ctx, ev)
}

func mustCall(t *testing.T, inst engines.Instance, ev *event.Event) []event.Event {
	t.Helper()
	out, err := call(t, inst, ev)
	if err != nil {
		t.Fatalf("Process: %v", err)
	}
	return out
}

func jsonEvent(typ string, data any) *event.Event {
	return enginetest.NewEvent("id-"+typ, typ, data, "")
}

func TestAsyncProcess(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, `
import asyncio

lock = None
calls = 0

async def process(event):
    global lock, calls
    if lock is None:
        lock = asyncio.Lock()  # bound to the loop of the first call
    async with lock:
        await asyncio.sleep(0.001)
        calls += 1
    return {"type": "async.done", "data": {"calls": calls, "id": event["id"]}}
`)
	for i := 1; i <= 3; i++ {
		m := enginetest.DataOf(t, mustCall(t, inst, jsonEvent("async", map[string]any{"i": i})))
		if m["calls"] != float64(i) || m["id"] != "id-async" {
			t.Fatalf("call %d: data = %v", i, m)
		}
	}
}

func TestSyncProcessReturningCoroutine(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, `
async def _work(event):
    return {"type": "co.done"}

def process(event):
    return _work(event)
`)
	out := mustCall(t, inst, jsonEvent("co", nil))
	if len(out) != 1 || out[0].Type() != "co.done" {
		t.Fatalf("outputs = %v", out)
	}
}

// The runner makes an event loop only for code that defines async code or
// names asyncio (importing asyncio is half of a start's cost). An
// awaitable from other code is awaited without a loop when it finishes
// without suspending, and fails with a clear error when it would wait.
func TestAwaitableWithoutEventLoop(t *testing.T) {
	e := newEngine(t, python.Config{})
	// types.coroutine marks the generator's code as a coroutine when the
	// module runs, after the runner looked at the code.
	inst := load(t, e, testSpec, `
import types

@types.coroutine
def _done(event):
    return {"type": "gen.done", "data": {"id": event["id"]}}
    yield

@types.coroutine
def _waits(event):
    yield "a future"
    return {"type": "never"}

def process(event):
    return _waits(event) if event["data"]["wait"] else _done(event)
`)
	out := mustCall(t, inst, jsonEvent("gen", map[string]any{"wait": false}))
	if len(out) != 1 || out[0].Type() != "gen.done" {
		t.Fatalf("outputs = %v", out)
	}
	if _, err := call(t, inst, jsonEvent("gen", map[string]any{"wait": true})); err == nil || !strings.Contains(err.Error(), "waits for an event loop") {
		t.Fatalf("an awaitable that waits, without a loop: %v", err)
	}
	// A sync process that uses the runner's loop through asyncio has one.
	inst = load(t, e, testSpec, `
import asyncio

def process(event):
    asyncio.get_event_loop().run_until_complete(asyncio.sleep(0))
    return {"type": "loop.used"}
`)
	if out := mustCall(t, inst, jsonEvent("loop", nil)); len(out) != 1 || out[0].Type() != "loop.used" {
		t.Fatalf("outputs = %v", out)
	}
}

func TestBytesDataRoundTrip(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, `
def process(event):
    data = event["data"]
    assert isinstance(data, bytes), type(data)
    assert "data_base64" not in event
    return {"type": "bytes.out", "data": data[::-1], "datacontenttype": "application/octet-stream"}
`)
	in := event.New()
	in.SetID("b1")
	in.SetSource("/test")
	in.SetType("bytes.in")
	payload := []byte{0, 1, 2, 0xff, 0xfe, '"', '\n'}
	if err := in.SetData("application/octet-stream", payload); err != nil {
		t.Fatal(err)
	}
	out := mustCall(t, inst, &in)
	if len(out) != 1 {
		t.Fatalf("got %d outputs", len(out))
	}
	want := []byte{'\n', '"', 0xfe, 0xff, 2, 1, 0}
	if !bytes.Equal(out[0].Data(), want) || !out[0].DataBase64 {
		t.Fatalf("output data = %v (base64 %v), want %v", out[0].Data(), out[0].DataBase64, want)
	}
	if ct := out[0].DataContentType(); ct != "application/octet-stream" {
		t.Fatalf("datacontenttype = %q", ct)
	}
}

func TestTextData(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, `
def process(event):
    assert isinstance(event["data"], str), type(event["data"])
    return {"type": "text.out", "data": event["data"].upper()}
`)
	in := event.New()
	in.SetID("t1")
	in.SetSource("/test")
	in.SetType("text.in")
	if err := in.SetData("text/plain", "héllo"); err != nil {
		t.Fatal(err)
	}
	out := mustCall(t, inst, &in)
	if len(out) != 1 || string(out[0].Data()) != "HÉLLO" || out[0].DataContentType() != "text/plain" {
		t.Fatalf("output = %v", out)
	}
}

func TestOutputDefaults(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, `
def process(event):
    return [
        {"type": "only.type"},
        {"type": "with.data", "data": {"k": [1, 2]}, "subject": None, "traceid": "abc"},
    ]
`)
	out := mustCall(t, inst, jsonEvent("defaults", nil))
	if len(out) != 2 {
		t.Fatalf("got %d outputs, want 2", len(out))
	}
	for i, ev := range out {
		// id and source are left to the caller.
		if ev.ID() != "" || ev.Source() != "" || ev.SpecVersion() != "1.0" {
			t.Errorf("output %d: id %q source %q specversion %q", i, ev.ID(), ev.Source(), ev.SpecVersion())
		}
	}
	if ct := out[1].DataContentType(); ct != "application/json" {
		t.Errorf("datacontenttype = %q, want application/json", ct)
	}
	if string(out[1].Data()) != `{"k":[1,2]}` {
		t.Errorf("data = %s", out[1].Data())
	}
	if v, ok := out[1].Extensions()["traceid"]; !ok || v != "abc" {
		t.Errorf("extensions = %v", out[1].Extensions())
	}
}

func TestOutputErrors(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, `
import datetime

def process(event):
    kind = event["data"]["kind"]
    if kind == "notype":
        return [{"type": "fine"}, {"data": 1}]
    if kind == "notdict":
        return [{"type": "fine"}, 42]
    if kind == "scalar":
        return 42
    if kind == "unserializable":
        return {"type": "x", "data": {"when": datetime.datetime(2020, 1, 1)}}
    if kind == "badext":
        return {"type": "x", "bad-name": "v"}
    return {"type": "ok"}
`)
	for kind, want := range map[string][]string{
		"notype":         {"output 1", `"type"`},
		"notdict":        {"output 1", "int"},
		"scalar":         {"int"},
		"unserializable": {"datetime", "not JSON serializable"},
		"badext":         {"output 0"},
	} {
		_, err := call(t, inst, jsonEvent("err", map[string]any{"kind": kind}))
		if !errors.Is(err, engines.ErrWorkerFailed) {
			t.Errorf("%s: err = %v, want ErrWorkerFailed", kind, err)
			continue
		}
		// Issue 44 item 3: outputs the runner refuses are not worth a
		// retry; the dispatcher dead-letters them at once (output_invalid).
		if !errors.Is(err, engines.ErrInvalidOutput) {
			t.Errorf("%s: err = %v, want it to match ErrInvalidOutput", kind, err)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err = %q, want it to contain %q", kind, err, w)
			}
		}
	}
	// An exception of the worker's own is not an invalid output.
	if _, err := call(t, inst, jsonEvent("err", map[string]any{})); errors.Is(err, engines.ErrInvalidOutput) {
		t.Errorf("a KeyError matches ErrInvalidOutput: %v", err)
	}
	// The process survived all of that.
	if out := mustCall(t, inst, jsonEvent("err", map[string]any{"kind": "ok"})); len(out) != 1 {
		t.Fatalf("outputs = %v", out)
	}
}

func TestExceptionDetails(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, `
import sys

def helper(x):
    raise ValueError("bad value %d" % x)

def process(event):
    if event["type"] == "exit":
        sys.exit(2)
    helper(7)
`)
	_, err := call(t, inst, jsonEvent("raise", nil))
	var perr *python.Error
	if !errors.As(err, &perr) || !errors.Is(err, engines.ErrWorkerFailed) {
		t.Fatalf("err = %#v, want a *python.Error wrapping ErrWorkerFailed", err)
	}
	if perr.Type != "ValueError" || perr.Message != "bad value 7" {
		t.Errorf("Type %q Message %q", perr.Type, perr.Message)
	}
	if got := err.Error(); got != "worker failed: ValueError: bad value 7" {
		t.Errorf("Error() = %q", got)
	}
	for _, w := range []string{`File "<worker>", line 5, in helper`, "line 10, in process", `raise ValueError("bad value %d" % x)`} {
		if !strings.Contains(perr.Traceback, w) {
			t.Errorf("traceback lacks %q:\n%s", w, perr.Traceback)
		}
	}
	if strings.Contains(perr.Traceback, "runner") || strings.Contains(perr.Traceback, "<string>") {
		t.Errorf("traceback shows runner frames:\n%s", perr.Traceback)
	}
	// sys.exit is reported, not obeyed.
	_, err = call(t, inst, jsonEvent("exit", nil))
	if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "SystemExit: 2") {
		t.Fatalf("sys.exit: err = %v", err)
	}
}

func TestCheckMessages(t *testing.T) {
	e := newEngine(t, python.Config{})
	for _, c := range []struct {
		name, code string
		want       []string
	}{
		{"syntax", "import os\n\ndef process(event)\n    return None\n", []string{"SyntaxError: ", "(line 3)"}},
		{"indent", "def process(event):\nreturn None\n", []string{"IndentationError: ", "(line 2)"}},
		{"import", "import no_such_module_xyz\n\ndef process(event):\n    pass\n", []string{"ModuleNotFoundError: No module named 'no_such_module_xyz' (line 1)"}},
		{"raise", "x = 1\nraise ValueError('bad config')\n", []string{"ValueError: bad config (line 2)"}},
		{"missing", "def handle(event):\n    pass\n", []string{"no process(event) function"}},
		{"notcallable", "process = 3\n", []string{"process is not callable (it is a int)"}},
		{"arity", "def process(event, other):\n    pass\n", []string{"exactly one argument"}},
		{"exit", "import os\nos._exit(3)\n", []string{"interpreter exited", "exit status 3"}},
		{"sysexit", "import sys\nsys.exit(4)\n", []string{"SystemExit: 4"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := e.Check(ctx, testSpec, []byte(c.code))
		cancel()
		if !errors.Is(err, engines.ErrInvalidCode) {
			t.Errorf("%s: Check = %v, want ErrInvalidCode", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: Check = %q, want it to contain %q", c.name, err, w)
			}
		}
	}
	ok := []string{
		"def process(event):\n    pass\n",
		"async def process(event):\n    pass\n",
		"def process(event, extra=None):\n    pass\n",
		"class P:\n    def __call__(self, event):\n        pass\nprocess = P()\n",
		"process = print\n",
	}
	for _, code := range ok {
		if err := e.Check(context.Background(), testSpec, []byte(code)); err != nil {
			t.Errorf("Check(%q) = %v", code, err)
		}
	}
}

func TestWorkerOutputIsLogged(t *testing.T) {
	rec := &recorder{}
	e := newEngine(t, python.Config{})
	spec := testSpec
	spec.Logger = slog.New(rec)
	inst := load(t, e, spec, `
import sys
print("loading")

def process(event):
    # Output that looks like protocol frames must not confuse anything.
    sys.stdout.buffer.write(b"\x05\x00\x00\x00Rnull\n")
    print("x" * 100000)
    print("to stderr", file=sys.stderr)
    for i in range(100):
        print("line", i)
    return {"type": "printed", "data": {"id": event["id"]}}
`)
	for i := range 5 {
		m := enginetest.DataOf(t, mustCall(t, inst, enginetest.NewEvent(fmt.Sprint("p", i), "print", nil, "")))
		if m["id"] != fmt.Sprint("p", i) {
			t.Fatalf("call %d: data = %v", i, m)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := inst.Close(ctx); err != nil { // flushes the logs
		t.Fatal(err)
	}
	lines := rec.lines()
	for _, w := range []string{"stdout|w-test|loading", "stderr|w-test|to stderr", "stdout|w-test|line 99"} {
		if !slices.Contains(lines, w) {
			t.Errorf("no log record %q", w)
		}
	}
}

func TestEnvironment(t *testing.T) {
	e := newEngine(t, python.Config{Env: []string{"EXTRA_SETTING=42"}})
	inst := load(t, e, testSpec, `
import os

def process(event):
    return {"type": "env", "data": {k: os.environ.get(k) for k in
        ["VIRTUFIN_WORKER_ID", "VIRTUFIN_WORKER_GROUP", "VIRTUFIN_WORKER_TOPIC", "EXTRA_SETTING"]}}
`)
	m := enginetest.DataOf(t, mustCall(t, inst, jsonEvent("env", nil)))
	want := map[string]any{
		"VIRTUFIN_WORKER_ID":    "w-test",
		"VIRTUFIN_WORKER_GROUP": "group-test",
		"VIRTUFIN_WORKER_TOPIC": "topic-test",
		"EXTRA_SETTING":         "42",
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
}

const pidWorker = `
import os, time

def process(event):
    if event["type"] == "die":
        os._exit(3)
    if event["type"] == "hang":
        time.sleep(3600)
    return {"type": "pid", "data": {"pid": os.getpid()}}
`

func pidOf(t *testing.T, inst engines.Instance) int {
	t.Helper()
	return int(enginetest.DataOf(t, mustCall(t, inst, jsonEvent("pid", nil)))["pid"].(float64))
}

func TestProcessExitRecovers(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, pidWorker)
	pid1 := pidOf(t, inst)
	_, err := call(t, inst, jsonEvent("die", nil))
	if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("err = %v, want ErrWorkerFailed with the exit status", err)
	}
	pid2 := pidOf(t, inst)
	if pid2 == pid1 {
		t.Fatalf("still pid %d after the process died", pid1)
	}
}

func TestCancelRecovers(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, pidWorker)
	pid1 := pidOf(t, inst)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(100 * time.Millisecond)
		cancel()
	}()
	_, err := inst.Process(ctx, jsonEvent("hang", nil))
	if !errors.Is(err, context.Canceled) || errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if pid2 := pidOf(t, inst); pid2 == pid1 {
		t.Fatalf("the cancelled call's process %d is still serving", pid1)
	}
}

func TestParallelProcesses(t *testing.T) {
	e := newEngine(t, python.Config{Processes: 2, MaxProcesses: 2})
	if got := e.Info().Capabilities.ParallelCalls; got != 2 {
		t.Fatalf("ParallelCalls = %d", got)
	}
	inst := load(t, e, testSpec, `
import os, time

def process(event):
    # A barrier across processes: each call waits until both have arrived,
    # which only works if two processes serve calls at the same time.
    d = event["data"]["dir"]
    open(os.path.join(d, event["id"]), "w").close()
    deadline = time.time() + 20
    while len(os.listdir(d)) < 2:
        if time.time() > deadline:
            raise TimeoutError("the other call never arrived")
        time.sleep(0.001)
    return {"type": "pid", "data": {"pid": os.getpid()}}
`)
	dir := t.TempDir()
	var wg sync.WaitGroup
	pids := make([]int, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := call(t, inst, enginetest.NewEvent(fmt.Sprint("c", i), "barrier", map[string]any{"dir": dir}, ""))
			if errs[i] = err; err == nil && len(out) == 1 {
				var m map[string]float64
				errs[i] = json.Unmarshal(out[0].Data(), &m)
				pids[i] = int(m["pid"])
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if pids[0] == pids[1] {
		t.Fatalf("both calls ran in process %d", pids[0])
	}
}

func countFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(entries)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !os.IsNotExist(err)
	}
	// pid (comm) state ...: comm may contain spaces, the state follows ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func TestCloseReapsEverything(t *testing.T) {
	fds := countFDs(t)
	goroutines := runtime.NumGoroutine()
	e := newEngine(t, python.Config{Processes: 2})
	ctx := context.Background()
	inst, err := e.Load(ctx, testSpec, []byte(`
import os, subprocess, sys

# A grandchild that would keep running (and could hold pipes) if only the
# runner were killed.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])

def process(event):
    if event["type"] == "die":
        os._exit(3)
    return {"type": "pid", "data": {"pid": os.getpid(), "child": child.pid}}
`))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	collect := func() {
		m := enginetest.DataOf(t, mustCall(t, inst, jsonEvent("pid", nil)))
		pids = append(pids, int(m["pid"].(float64)), int(m["child"].(float64)))
	}
	for range 10 {
		collect()
	}
	_, err = call(t, inst, jsonEvent("die", nil)) // one restart on the way
	if !errors.Is(err, engines.ErrWorkerFailed) {
		t.Fatal(err)
	}
	collect()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := inst.Close(cctx); err != nil {
		t.Fatal(err)
	}
	// The runners must be reaped when Close returns (a zombie still accepts
	// signal 0).
	for i := 0; i < len(pids); i += 2 {
		if err := syscall.Kill(pids[i], 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("runner %d was not reaped (kill: %v)", pids[i], err)
		}
	}
	// Their children were SIGKILLed with the process group; they die
	// asynchronously and are reaped by init, not by us.
	deadline := time.Now().Add(10 * time.Second)
	for i := 1; i < len(pids); i += 2 {
		for alive(pids[i]) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if alive(pids[i]) {
			t.Errorf("the worker's child %d is still running after Close", pids[i])
		}
	}
	if _, err := inst.Process(ctx, jsonEvent("pid", nil)); !errors.Is(err, python.ErrClosed) {
		t.Errorf("Process after Close = %v, want ErrClosed", err)
	}
	if got := countFDs(t); got != fds {
		t.Errorf("%d open fds after Close, %d before Load", got, fds)
	}
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := runtime.NumGoroutine(); got > goroutines {
		t.Errorf("%d goroutines after Close, %d before Load", got, goroutines)
	}
}

func TestBadInterpreter(t *testing.T) {
	e := newEngine(t, python.Config{Interpreter: filepath.Join(t.TempDir(), "no-python")})
	err := e.Check(context.Background(), testSpec, fixtures.Echo)
	if err == nil || errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("Check with a missing interpreter = %v, want a non-code error", err)
	}
}

// The runner starts without the site module (-S) but with the sys.path
// the interpreter's site makes: a package in site-packages and a module in
// a directory a .pth file lists import, and the executable line of a .pth
// file does not run in the worker's process — sandboxed or not.
func TestSitePackagesWithoutPthCode(t *testing.T) {
	base := t.TempDir()
	venv := filepath.Join(base, "venv")
	if out, err := exec.Command("python3", "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		t.Fatalf("python3 -m venv: %v\n%s", err, out)
	}
	site, err := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages"))
	if err != nil || len(site) != 1 {
		t.Fatalf("the venv's site-packages: %v %v", site, err)
	}
	extra := filepath.Join(venv, "extra") // inside the venv: a sandboxed runner reads its prefix
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(site[0], "wmsitepkg"), 0o755))
	must(os.MkdirAll(extra, 0o755))
	must(os.WriteFile(filepath.Join(site[0], "wmsitepkg", "__init__.py"), []byte("VALUE = 'from site-packages'\n"), 0o644))
	must(os.WriteFile(filepath.Join(extra, "wmpthmod.py"), []byte("VALUE = 'from a .pth directory'\n"), 0o644))
	must(os.WriteFile(filepath.Join(site[0], "wm.pth"), []byte(extra+"\nimport builtins; builtins.WM_PTH_RAN = True\n"), 0o644))
	code := `import wmsitepkg, wmpthmod
def process(event):
    return {"type": "out", "data": {"pkg": wmsitepkg.VALUE, "dir": wmpthmod.VALUE, "pth_ran": "WM_PTH_RAN" in __builtins__}}
`
	for name, sb := range map[string]*sandbox.Sandbox{"plain": nil, "sandboxed": sandboxtest.Strict(t)} {
		t.Run(name, func(t *testing.T) {
			cfg := python.Config{Interpreter: filepath.Join(venv, "bin", "python3"), AllowedPackages: []string{"wmsitepkg", "wmpthmod"}}
			if sb != nil {
				cfg.Sandbox = sb
			}
			inst := load(t, newEngine(t, cfg), testSpec, code)
			out := mustCall(t, inst, jsonEvent("in", map[string]any{}))
			var got map[string]any
			if len(out) != 1 || out[0].DataAs(&got) != nil {
				t.Fatalf("outputs %v", out)
			}
			want := map[string]any{"pkg": "from site-packages", "dir": "from a .pth directory", "pth_ran": false}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("got %v, want %v", got, want)
			}
		})
	}
}

// PYTHON_PARK_AFTER (#48 item 4): a worker idle for ParkAfter has its
// runner stopped (the process is gone, not merely idle); its next event
// starts one and is answered.
func TestIdleWorkerIsParkedAndWokenByItsNextEvent(t *testing.T) {
	e := newEngine(t, python.Config{ParkAfter: 300 * time.Millisecond})
	inst := load(t, e, testSpec, pidWorker)
	pid1 := pidOf(t, inst)
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid1, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("runner %d still there 30 s after its last event (ParkAfter 300ms)", pid1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pid2 := pidOf(t, inst); pid2 == pid1 {
		t.Fatalf("the parked worker answered from pid %d, its stopped runner's", pid1)
	}
}
