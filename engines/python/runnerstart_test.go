package python_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// A runner starts from runner.py compiled once by the engine's probe (not
// from the source, which each start compiled again), and from the source
// when the probe could not compile it: a worker runs either way, and its
// traceback starts at its own code, as before. (The chain's start: a
// runner forked from the fork server has the code from the server.)
func TestRunnerStartsCompiledOrFromSource(t *testing.T) {
	devkit := installedDevKit(t)
	for want, cfg := range map[string]python.Config{
		"file":     {DevKitDir: devkit, Sandbox: sandboxtest.Strict(t), NoForkServer: true},
		"compiled": {},
		"source":   {},
	} {
		e := newEngine(t, cfg)
		if got := python.RunnerStart(t, e, want == "source"); got != want {
			t.Fatalf("runners start %s, want %s", got, want)
		}
		inst := load(t, e, testSpec, `
def process(event):
    if event["data"]["n"] == 0:
        return 1 / event["data"]["n"]
    return {"type": "echoed", "data": event["data"]}
`)
		outs, err := call(t, inst, jsonEvent("in", map[string]any{"n": 1}))
		if err != nil || len(outs) != 1 || outs[0].Type() != "echoed" {
			t.Fatalf("%s runner: %v, %v", want, outs, err)
		}
		_, err = call(t, inst, jsonEvent("in", map[string]any{"n": 0}))
		tb := engines.Traceback(err)
		if !strings.Contains(tb, `File "<worker>", line 4, in process`) || !strings.HasSuffix(strings.TrimSpace(tb), "ZeroDivisionError: division by zero") {
			t.Fatalf("%s runner: traceback\n%s\nwant the worker's ZeroDivisionError at line 4 (err %v)", want, tb, err)
		}
		if strings.Contains(tb, "<string>") {
			t.Fatalf("%s runner: the traceback shows the runner's frames:\n%s", want, tb)
		}
		if want != "file" {
			continue
		}
		// The file gone (a temporary directory cleaned under the node): the
		// next runner writes it again and starts.
		if err := os.Remove(python.RunnerFile(e)); err != nil {
			t.Fatal(err)
		}
		again := load(t, e, testSpec, "def process(event):\n    return {'type': 'again'}\n")
		if outs, err := call(t, again, jsonEvent("in", map[string]any{})); err != nil || len(outs) != 1 || outs[0].Type() != "again" {
			t.Fatalf("a runner after its file was removed: %v, %v", outs, err)
		}
		if _, err := os.Stat(python.RunnerFile(e)); err != nil {
			t.Fatalf("the runner file was not written again: %v", err)
		}
	}
}

// The runner checks process's parameters without importing inspect (a
// runner is about 1.1 MiB lighter and 4 ms faster to start without it),
// and answers as inspect.signature(process).bind(event) would for the
// callables workers define.
func TestProcessParametersCheckedWithoutInspect(t *testing.T) {
	e := newEngine(t, python.Config{})
	refused := map[string]string{
		"two":          "def process(event, other):\n    pass\n",
		"none":         "def process():\n    pass\n",
		"kwonly":       "def process(event, *, must):\n    pass\n",
		"wrapped":      "import functools\ndef inner(a, b):\n    pass\n@functools.wraps(inner)\ndef process(*args, **kwargs):\n    return inner(*args, **kwargs)\n",
		"method":       "class W:\n    def handle(self, a, b):\n        pass\nprocess = W().handle\n",
		"instance":     "class W:\n    def __call__(self):\n        pass\nprocess = W()\n",
		"partial full": "import functools\ndef f(a, b):\n    pass\nprocess = functools.partial(f, 1, 2)\n",
	}
	for name, code := range refused {
		err := e.Check(t.Context(), testSpec, []byte(code))
		if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "exactly one argument") {
			t.Errorf("%s: Check = %v, want the one-argument refusal", name, err)
		}
	}
	accepted := map[string]string{
		"default":   "def process(event, extra=None):\n    pass\n",
		"varargs":   "def process(*events):\n    pass\n",
		"posonly":   "def process(event, /):\n    pass\n",
		"kwdefault": "def process(event, *, extra=1, **more):\n    pass\n",
		"method":    "class W:\n    def handle(self, event):\n        pass\nprocess = W().handle\n",
		"instance":  "class W:\n    def __call__(self, event):\n        pass\nprocess = W()\n",
		"partial":   "import functools\ndef f(config, event):\n    pass\nprocess = functools.partial(f, {})\n",
		"wrapped":   "import functools\ndef inner(event):\n    pass\n@functools.wraps(inner)\ndef process(*args):\n    return inner(*args)\n",
		"static":    "class W:\n    @staticmethod\n    def handle(event):\n        pass\nprocess = W.handle\n",
		"builtin":   "process = print\n",
		"class":     "class process:\n    def __init__(self, event):\n        pass\n",
	}
	for name, code := range accepted {
		if err := e.Check(t.Context(), testSpec, []byte(code)); err != nil {
			t.Errorf("%s: Check = %v, want it accepted", name, err)
		}
	}

	// An async __call__ runs as a coroutine; a plain worker's runner has
	// not imported inspect (nothing the runner imports does).
	inst := load(t, e, testSpec, `
import sys

class W:
    async def __call__(self, event):
        return {"type": "out", "data": {"inspect": "inspect" in sys.modules}}

process = W()
`)
	outs, err := call(t, inst, jsonEvent("in", map[string]any{}))
	if err != nil || len(outs) != 1 {
		t.Fatalf("async __call__: %v, %v", outs, err)
	}
	plain := load(t, e, testSpec, `
import sys

def process(event):
    return {"type": "out", "data": {"inspect": "inspect" in sys.modules}}
`)
	outs, err = call(t, plain, jsonEvent("in", map[string]any{}))
	if err != nil || len(outs) != 1 || string(outs[0].Data()) != `{"inspect":false}` {
		t.Fatalf("a plain worker's runner: %v, %v; want inspect not imported", outs, err)
	}
}

// A runner whose interpreter is not the one that compiled the runner (an
// interpreter replaced in place under the node) refuses to start, saying
// so, instead of failing on the foreign code.
func TestRunnerRefusesCodeOfAnotherInterpreter(t *testing.T) {
	for _, cfg := range []python.Config{{}, {DevKitDir: installedDevKit(t)}} {
		e := newEngine(t, cfg)
		how := python.RunnerStart(t, e, false)
		python.PretendInterpreterChanged(e)
		err := e.Check(t.Context(), testSpec, []byte("def process(event):\n    pass\n"))
		if err == nil || !strings.Contains(err.Error(), "interpreter changed since the node compiled its runner") {
			t.Fatalf("%s: Check = %v, want the refusal naming the changed interpreter", how, err)
		}
		t.Logf("%s: refused: %v", how, err)
	}
}

// A runner imports only what imports nothing heavy (json's C half,
// binascii, _functools: no re, enum or collections; traceback, linecache
// and subprocess not until something needs them), and worker code still
// gets what those modules gave: tracebacks with its own source lines
// (logging's, which imports traceback and linecache after the runner
// started), +json text decoded
// as json.loads would (whitespace around it), bytes as data_base64.
func TestRunnerImportsLittleAndKeepsWhatItGave(t *testing.T) {
	e := newEngine(t, python.Config{})
	plain := load(t, e, testSpec, `
import sys

HEAVY = ("re", "enum", "json", "base64", "functools", "collections", "traceback", "linecache",
         "tokenize", "subprocess", "threading", "inspect", "asyncio", "ctypes")

def process(event):
    return {"type": "out", "data": {"heavy": [m for m in HEAVY if m in sys.modules]}}
`)
	outs, err := call(t, plain, jsonEvent("in", map[string]any{}))
	if err != nil || len(outs) != 1 || string(outs[0].Data()) != `{"heavy":[]}` {
		t.Fatalf("a plain worker's runner imported: %v, %v; want none of the heavy modules", outs, err)
	}

	inst := load(t, e, testSpec, `
import logging, sys
def process(event):
    if isinstance(event["data"], bytes):
        return {"type": "bytes", "data": event["data"][::-1]}
    if not isinstance(event["data"], dict) or "n" not in event["data"]:
        return {"type": "decoded", "data": {"got": event["data"]}}
    try:
        raise ValueError("boom %d" % event["data"]["n"])
    except ValueError:
        return {"type": "out", "data": {"tb": logging.Formatter().formatException(sys.exc_info())}}
`)
	outs, err = call(t, inst, jsonEvent("in", map[string]any{"n": 7}))
	if err != nil || len(outs) != 1 {
		t.Fatalf("traceback: %v, %v", outs, err)
	}
	var d struct{ TB string }
	if err := outs[0].DataAs(&d); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(d.TB, `File "<worker>", line 9, in process`) || !strings.Contains(d.TB, `raise ValueError("boom %d" % event["data"]["n"])`) || !strings.Contains(d.TB, "ValueError: boom 7") {
		t.Fatalf("the worker's traceback lacks its source line:\n%s", d.TB)
	}

	// The text as the event's data: Go's SDK writes it as a JSON string
	// (it embeds only its own JSON types as JSON).
	jsonText := func(ct, text string) *event.Event {
		ev := jsonEvent("in", nil)
		ev.SetDataContentType(ct)
		ev.DataEncoded = []byte(text)
		return ev
	}
	ev := jsonText("application/vnd.example+json", " \n{\"a\": [1, 2.5, \"x\"], \"b\": null}\t ")
	outs, err = call(t, inst, ev)
	if err != nil || len(outs) != 1 || string(outs[0].Data()) != `{"got":{"a":[1,2.5,"x"],"b":null}}` {
		t.Fatalf("+json text: %v, %v; want it decoded", outs, err)
	}
	ev = jsonText("application/vnd.example+json", `{"a": 1} trailing`)
	outs, err = call(t, inst, ev)
	if err != nil || len(outs) != 1 || string(outs[0].Data()) != `{"got":"{\"a\": 1} trailing"}` {
		t.Fatalf("+json text that is not JSON: %v, %v; want it kept as text", outs, err)
	}
	ev = jsonEvent("in", nil)
	if err := ev.SetData("application/octet-stream", []byte{0, 1, 2, 250}); err != nil {
		t.Fatal(err)
	}
	outs, err = call(t, inst, ev)
	if err != nil || len(outs) != 1 || string(outs[0].Data()) != string([]byte{250, 2, 1, 0}) {
		t.Fatalf("bytes: %v, %v; want them reversed", outs, err)
	}
}
