package cli

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// asWmctl makes the test binary act as wmctl (Main), so that a generated
// project's Makefile can run it as $(WMCTL).
const asWmctl = "WMCTL_TEST_AS_WMCTL"

func TestMain(m *testing.M) {
	if os.Getenv(asWmctl) == "1" {
		os.Exit(Main(context.Background(), os.Args[1:], Options{IO: IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}}))
	}
	os.Exit(m.Run())
}

// needTools skips the test when a tool a template needs is missing (make
// test and make run install them all).
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH", tool)
		}
	}
}

// runMake runs make in dir with this test binary as $(WMCTL).
func runMake(t *testing.T, dir string, targets ...string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", append([]string{"-C", dir, "WMCTL=" + exe}, targets...)...)
	cmd.Env = append(os.Environ(), asWmctl+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %v in %s: %v\n%s", targets, dir, err, out)
	}
	return string(out)
}

// runLine is the one result line of `wmctl run` for one event.
func runLine(t *testing.T, out string) map[string]any {
	t.Helper()
	var res map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("run printed %q: %v", out, err)
	}
	return res
}

// A new C# project passes its unit tests (Mono, Virtufin.Worker.Testing)
// and, through the node's .NET engine, its expected outputs.
func TestNewCSharpProjectPassesItsTests(t *testing.T) {
	needTools(t, "make", "mcs", "mono")
	dir := t.TempDir()
	r := run(t, nil, "", "new", "order-greeter", "--engine", "csharp", "--dir", dir)
	if r.code != 0 || !strings.Contains(r.out, "OrderGreeter.cs") {
		t.Fatalf("new: exit %d %q %q", r.code, r.out, r.err)
	}
	proj := filepath.Join(dir, "order-greeter")
	out := runMake(t, proj, "check")
	for _, want := range []string{"PASS OrderGreeterTests.GreetsByName", "PASS OrderGreeterTests.AnswersAnErrorWithoutAName", "2 tests, 2 passed, 0 failed",
		`"type":"order-greeter.response"`, `"data":{"greeting":"Hello, Ada!"}`} {
		if !strings.Contains(out, want) {
			t.Fatalf("make check lacks %q:\n%s", want, out)
		}
	}
	// The same, in process; the output is completed as on the node.
	r = run(t, nil, "", "run", filepath.Join(proj, "OrderGreeter.cs"), "--event", filepath.Join(proj, "event.json"),
		"--expect", filepath.Join(proj, "expected.json"), "--worker-id", "w-7")
	res := runLine(t, r.out)
	outs, _ := res["outputs"].([]any)
	if r.code != 0 || res["ok"] != true || len(outs) != 1 {
		t.Fatalf("run: exit %d %q %q", r.code, r.out, r.err)
	}
	if o := outs[0].(map[string]any); o["source"] != "workmanager/workers/w-7" || o["correlationid"] != "c-1" {
		t.Fatalf("output not completed as on the node: %v", o)
	}
	// existing files are not overwritten
	if r := run(t, nil, "", "new", "order-greeter", "--engine", "csharp", "--dir", dir); r.code != ExitUsage || !strings.Contains(r.err, "exists already") {
		t.Fatalf("new over an existing project: exit %d %q", r.code, r.err)
	}
}

// A new native project builds, packages and passes its expected outputs
// through the node's native engine (make test runs wmctl run).
func TestNewNativeProjectPassesItsTest(t *testing.T) {
	needTools(t, "make", "gcc", "python3")
	dir := t.TempDir()
	if r := run(t, nil, "", "new", "echo-worker", "--engine", "native", "--dir", dir); r.code != 0 {
		t.Fatalf("new: exit %d %q %q", r.code, r.out, r.err)
	}
	proj := filepath.Join(dir, "echo-worker")
	out := runMake(t, proj, "test")
	if !strings.Contains(out, `"data":{"received":{"name":"Ada"},"by":"local"}`) || !strings.Contains(out, "packaged build/echo-worker.zip") {
		t.Fatalf("make test:\n%s", out)
	}
	// An event the worker fails: ok false, the worker's message, exit 1;
	// an expectation that does not hold: exit 1, saying what differs.
	ev := write(t, filepath.Join(dir, "nodata.json"), `{"id": "n-1", "type": "echo-worker.request"}`)
	r := run(t, nil, "", "run", filepath.Join(proj, "build", "echo-worker.zip"), "--event", ev)
	if res := runLine(t, r.out); r.code != ExitError || res["ok"] != false || res["reason"] != "worker_failed" ||
		!strings.Contains(res["error"].(string), "the event has no data") {
		t.Fatalf("failing event: exit %d %q %q", r.code, r.out, r.err)
	}
	wrong := write(t, filepath.Join(dir, "wrong.json"), `[{"type": "echo-worker.other"}]`)
	r = run(t, nil, "", "run", filepath.Join(proj, "build", "echo-worker.zip"), "--event", filepath.Join(proj, "event.json"), "--expect", wrong)
	if r.code != ExitError || !strings.Contains(r.err, `event e-1: output 0: type: expected "echo-worker.other", got "echo-worker.response"`) {
		t.Fatalf("wrong expectation: exit %d %q", r.code, r.err)
	}
	failing := write(t, filepath.Join(dir, "fails.json"), `{"error": "no data"}`)
	if r := run(t, nil, "", "run", filepath.Join(proj, "build", "echo-worker.zip"), "--event", ev, "--expect", failing); r.code != 0 {
		t.Fatalf("expected failure: exit %d %q", r.code, r.err)
	}
}

// The Python template comes from the Python DevKit; wmctl run runs it
// through the node's Python engine.
func TestNewPythonProjectRuns(t *testing.T) {
	needTools(t, "python3")
	dir := t.TempDir()
	if r := run(t, nil, "", "new", "greeter", "--engine", "python", "--dir", dir); r.code != 0 {
		t.Fatalf("new: exit %d %q %q", r.code, r.out, r.err)
	}
	proj := filepath.Join(dir, "greeter")
	r := run(t, nil, "", "run", filepath.Join(proj, "worker.py"), "--event", filepath.Join(proj, "event.json"))
	if res := runLine(t, r.out); r.code != 0 || res["ok"] != true {
		t.Fatalf("run: exit %d %q %q", r.code, r.out, r.err)
	}
}

// Code that does not load is exit 5 with the engine's message, a C#
// source named as the user's file; usage problems are exit 2.
func TestRunRefusals(t *testing.T) {
	dir := t.TempDir()
	ev := write(t, filepath.Join(dir, "event.json"), `{"type": "t", "data": {}}`)
	if _, err := exec.LookPath("mcs"); err == nil {
		cs := write(t, filepath.Join(dir, "Broken.cs"), "public class Broken {\n")
		r := run(t, nil, "", "run", cs, "--event", ev)
		if r.code != ExitInvalid || !strings.Contains(r.err, "Broken.cs does not load") || !strings.Contains(r.err, "Broken.cs:") ||
			strings.Contains(r.err, "Worker.cs") {
			t.Errorf("broken C#: exit %d %q", r.code, r.err)
		}
	}
	py := write(t, filepath.Join(dir, "w.py"), "def process(e):\n    return None\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", py}, "no events"},
		{[]string{"run", py, "--event", filepath.Join(dir, "missing.json")}, "missing.json"},
		{[]string{"run", py, "--event", write(t, filepath.Join(dir, "notype.json"), `{"data": 1}`)}, `no "type"`},
		{[]string{"run", py, "--event", ev, "--expect", write(t, filepath.Join(dir, "two.json"), "[]\n[]\n")}, "2 values for 1 events"},
		{[]string{"run", filepath.Join(dir, "libx.so"), "--event", ev}, "no such file"},
		{[]string{"new", "Bad_Name", "--engine", "csharp"}, "lower-case letters"},
		{[]string{"new", "ok", "--engine", "cobol"}, `--engine "cobol"`},
	} {
		if r := run(t, nil, "", c.args...); r.code != ExitUsage || !strings.Contains(r.err, c.want) {
			t.Errorf("wmctl %v: exit %d %q; want 2 and %q", c.args, r.code, r.err, c.want)
		}
	}
}
