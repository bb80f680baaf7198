package python_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// whoAmI answers with what its process is: pid, uid and its worker's
// variables.
const whoAmI = `
import os

def process(event):
    status = [l for l in open("/proc/self/status").read().splitlines()
              if l.split(":")[0] in ("Seccomp", "NoNewPrivs", "CapEff", "CapBnd")]
    return {"type": "who", "data": {"pid": os.getpid(), "uid": os.getuid(),
        "id": os.environ.get("VIRTUFIN_WORKER_ID"), "topic": os.environ.get("VIRTUFIN_WORKER_TOPIC"),
        "group": os.environ.get("VIRTUFIN_WORKER_GROUP"), "layers": status, "env": sorted(os.environ)}}
`

type who struct {
	PID, UID         int
	ID, Topic, Group string
	// Layers are the process's seccomp, no_new_privs and capability
	// lines; Env its variables' names.
	Layers, Env []string
}

func ask(t *testing.T, inst engines.Instance) who {
	t.Helper()
	out, err := call(t, inst, enginetest.NewEvent("q", "ask", map[string]any{}, ""))
	if err != nil || len(out) != 1 {
		t.Fatalf("outputs %v, err %v", out, err)
	}
	var w who
	if err := out[0].DataAs(&w); err != nil {
		t.Fatal(err)
	}
	return w
}

// waitSpares waits until e keeps n spares ready and returns their pids.
func waitSpares(t *testing.T, e *python.Engine, n int) []int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if pids := python.SparePIDs(e); len(pids) == n {
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spare runners ready after 30s, want %d", python.SpareCount(e), n)
		}
	}
}

func specOf(id string) engines.Spec {
	s := testSpec
	s.WorkerID, s.Topic, s.Group = id, "topic-"+id, "group-"+id
	return s
}

// A spare runner serves one worker, once: it gets that worker's variables,
// is never given to another worker (nor again after its worker closed it),
// and a spare that died while it waited is never given out.
func TestSpareRunnerServesOneWorkerOnce(t *testing.T) {
	testSpareRunners(t, python.Config{Spares: 1})
}

// The same inside the OS sandbox: a spare runs under a user id of its own,
// not the one of a worker loaded before.
func TestSpareRunnerServesOneWorkerOnceSandboxed(t *testing.T) {
	testSpareRunners(t, python.Config{Spares: 1, Sandbox: sandboxtest.Strict(t)})
}

func testSpareRunners(t *testing.T, cfg python.Config) {
	e := newEngine(t, cfg)
	a := load(t, e, specOf("a"), whoAmI) // no spare yet: its own runner
	wa := ask(t, a)
	pidA := only(t, a)
	spare := waitSpares(t, e, 1)[0]

	b := load(t, e, specOf("b"), whoAmI)
	wb := ask(t, b)
	if got := only(t, b); got != spare {
		t.Fatalf("b runs in pid %d, want the spare %d", got, spare)
	}
	if wb.ID != "b" || wb.Topic != "topic-b" || wb.Group != "group-b" {
		t.Fatalf("the spare's worker variables: %+v, want b's", wb)
	}
	if cfg.Sandbox != nil && wb.UID == wa.UID {
		t.Fatalf("workers a and b share uid %d", wa.UID)
	}
	// Sandboxed like a runner started for its worker: the same layers,
	// the same variables.
	if !slices.Equal(wa.Layers, wb.Layers) || !slices.Equal(wa.Env, wb.Env) {
		t.Fatalf("a spare's process differs from one started for its worker:\n own   %v %v\n spare %v %v", wa.Layers, wa.Env, wb.Layers, wb.Env)
	}
	if cfg.Sandbox != nil && (wb.UID < 200000 || !slices.Contains(wb.Layers, "NoNewPrivs:\t1")) {
		t.Fatalf("a spare outside the sandbox's user layer: uid %d, %v", wb.UID, wb.Layers)
	}
	next := waitSpares(t, e, 1)[0]
	if next == spare || next == pidA {
		t.Fatalf("the next spare is pid %d: a runner given out before", next)
	}
	if err := b.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	c := load(t, e, specOf("c"), whoAmI)
	if wc := ask(t, c); only(t, c) != next || wc.ID != "c" {
		t.Fatalf("c runs in pid %d as %q, want the spare %d", only(t, c), wc.ID, next)
	}
	if living(spare) {
		t.Fatalf("b's runner (pid %d) still lives after b closed", spare)
	}

	// A spare killed while it waits is not given out.
	dead := waitSpares(t, e, 1)[0]
	if err := syscall.Kill(dead, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); living(dead); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed spare did not exit")
		}
	}
	// ...and its death touches no running worker.
	if wc := ask(t, c); wc.ID != "c" {
		t.Fatalf("c after a spare died: %+v", wc)
	}
	d := load(t, e, specOf("d"), whoAmI)
	wd := ask(t, d)
	if got := only(t, d); wd.ID != "d" || slices.Contains([]int{pidA, spare, next, dead}, got) {
		t.Fatalf("d runs in pid %d as %q: a runner given out before, or the dead spare (%d)", got, wd.ID, dead)
	}
}

// only is the host pid of inst's one runner.
func only(t *testing.T, inst engines.Instance) int {
	t.Helper()
	pids := python.RunnerPIDs(inst)
	if len(pids) != 1 {
		t.Fatalf("runner pids %v, want one", pids)
	}
	return pids[0]
}

// An async def worker given a spare runs its events concurrently up to its
// own max_concurrency (the setup frame), as one started for it.
func TestSpareRunnerTakesTheWorkersConcurrency(t *testing.T) {
	e := newEngine(t, python.Config{Spares: 1})
	load(t, e, specOf("first"), whoAmI)
	spare := waitSpares(t, e, 1)[0]
	spec := specOf("async")
	spec.MaxConcurrency = 3
	inst := load(t, e, spec, asyncSleeper)
	if got := only(t, inst); got != spare {
		t.Fatalf("the async worker runs in pid %d, want the spare %d", got, spare)
	}
	ivs := runAtOnce(t, inst, 12)
	if got := maxOverlap(ivs); got > 3 || got < 2 {
		t.Fatalf("%d events ran at the same time with max_concurrency 3 on a spare, want 2..3", got)
	}
	if pids := python.SparePIDs(e); slices.Contains(pids, only(t, inst)) {
		t.Fatal("the worker's runner is still listed as a spare")
	}
}

func TestConformanceWithSpares(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Engine:   newEngine(t, python.Config{Spares: 2}),
		MIMEType: python.MIMEType,
		Fixtures: fixtures,
	})
}

// With paths shared read-write (SANDBOX_WRITABLE_PATHS), a worker's files
// there are its user id's: every runner of one worker must run under it,
// so the engine keeps no spares (which run under ids of their own), and a
// second runner of the worker can append to the file its first made
// (found by the integration tests: a spare's PermissionError).
func TestNoSparesWhenSandboxesSharePaths(t *testing.T) {
	// Outside /tmp, which each sandbox has a tmpfs of its own at.
	dir, err := os.MkdirTemp("/var/tmp", "wm-spares-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	limits := sandbox.DefaultLimits
	limits.FileSize = 16 << 20
	sb := sandboxtest.New(t, sandbox.Config{Mode: sandbox.Strict, Log: slog.New(slog.DiscardHandler), Limits: limits, Writable: []string{dir}})
	e := newEngine(t, python.Config{Spares: 1, Sandbox: sb})
	appender := fmt.Sprintf(`
import os

def process(event):
    with open(%q, "a") as f:
        f.write("x")
    return {"type": "done", "data": {"uid": os.getuid()}}
`, filepath.Join(dir, "w.log"))
	first := load(t, e, specOf("w"), appender)
	if _, err := call(t, first, enginetest.NewEvent("1", "t", map[string]any{}, "")); err != nil {
		t.Fatal(err)
	}
	// Where spares were kept, one would be ready well within this.
	for deadline := time.Now().Add(3 * time.Second); python.SpareCount(e) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	second := load(t, e, specOf("w"), appender) // a reload: another runner
	if _, err := call(t, second, enginetest.NewEvent("2", "t", map[string]any{}, "")); err != nil {
		t.Fatalf("the worker's second runner cannot append to its own file: %v", err)
	}
	if n := python.SpareCount(e); n != 0 {
		t.Fatalf("%d spares with shared paths, want none", n)
	}
}

// A start that finds no spare ready while the next one is being started
// (a stop and a start back to back, after the create and the reload took
// the spares) takes that one rather than starting a runner beside it.
func TestAStartTakesTheSpareBeingStarted(t *testing.T) {
	e := newEngine(t, python.Config{Spares: 1, Sandbox: sandboxtest.Strict(t)})
	load(t, e, specOf("w"), whoAmI) // spares start with the first load
	first := waitSpares(t, e, 1)[0]
	release, started := python.HoldSpareStarts(t, e)
	a := load(t, e, specOf("a"), whoAmI) // takes the spare; the next one's start is held
	if got := only(t, a); got != first {
		t.Fatalf("a runs in pid %d, want the spare %d", got, first)
	}
	loaded := make(chan engines.Instance, 1)
	go func() {
		inst, err := e.Load(t.Context(), specOf("b"), []byte(whoAmI))
		if err != nil {
			t.Error(err)
		}
		loaded <- inst
	}()
	for deadline := time.Now().Add(10 * time.Second); python.SpareAwaiting(e) != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("b's start does not wait for the spare being started")
		}
	}
	release()
	b := <-loaded
	if b == nil {
		t.FailNow()
	}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	if wb := ask(t, b); wb.ID != "b" || !slices.Contains(started(), only(t, b)) {
		t.Fatalf("b runs in pid %d as %q, want the spare that was being started (%v)", only(t, b), wb.ID, started())
	}
}
