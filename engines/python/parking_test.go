package python_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/python"
)

// loadsWorker appends its pid to $LOADS_FILE each time its module is
// loaded into a runner, i.e. once per runner started with it.
const loadsWorker = `
import os
with open(os.environ["LOADS_FILE"], "a") as f:
    f.write("%d\n" % os.getpid())

def process(event):
    return {"type": "pid", "data": {"pid": os.getpid(), "tag": TAG}}
`

func loads(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// A Load right after the Check of the same worker and code takes the
// runner the Check started: the module runs once, and that runner serves.
// A Load that differs (code, topic) or comes without a Check starts its own;
// a restart after a crash never reuses one; with parking off every Check
// and Load starts a runner.
func TestLoadTakesTheCheckedRunner(t *testing.T) {
	file := filepath.Join(t.TempDir(), "loads")
	e := newEngine(t, python.Config{Env: []string{"LOADS_FILE=" + file}})
	ctx := context.Background()
	code := loadsWorker + "TAG = 'v1'\n"
	if err := e.Check(ctx, testSpec, []byte(code)); err != nil {
		t.Fatal(err)
	}
	inst := load(t, e, testSpec, code)
	got := loads(t, file)
	if len(got) != 1 {
		t.Fatalf("runners started for a check and a load: %v, want 1", got)
	}
	if pid := pidOf(t, inst); got[0] != itoa(pid) {
		t.Fatalf("serving pid %d, checked runner %s", pid, got[0])
	}

	// Different code, or a different topic: not the parked runner.
	code2 := loadsWorker + "TAG = 'v2'\n"
	if err := e.Check(ctx, testSpec, []byte(code2)); err != nil {
		t.Fatal(err)
	}
	other := testSpec
	other.Topic = "another-topic"
	load(t, e, other, code2)
	if n := len(loads(t, file)); n != 3 {
		t.Fatalf("%d runners after a check and a load for another topic, want 3", n)
	}
	// The parked one is still there for its own Load.
	inst2 := load(t, e, testSpec, code2)
	if n := len(loads(t, file)); n != 3 {
		t.Fatalf("%d runners after the matching load, want still 3", n)
	}
	if out := mustCall(t, inst2, jsonEvent("x", nil)); len(out) != 1 {
		t.Fatalf("outputs %v", out)
	}

	// A Load without a Check, twice the same code: each starts its own.
	load(t, e, testSpec, code)
	if n := len(loads(t, file)); n != 4 {
		t.Fatalf("%d runners, want 4", n)
	}
}

func TestParkingOff(t *testing.T) {
	file := filepath.Join(t.TempDir(), "loads")
	e := newEngine(t, python.Config{Env: []string{"LOADS_FILE=" + file}, ParkTTL: -1})
	code := loadsWorker + "TAG = 'v1'\n"
	if err := e.Check(context.Background(), testSpec, []byte(code)); err != nil {
		t.Fatal(err)
	}
	load(t, e, testSpec, code)
	if n := len(loads(t, file)); n != 2 {
		t.Fatalf("%d runners with parking off, want 2", n)
	}
}

// A parked runner that died meanwhile is not handed to the Load; an unused
// one is retired after ParkTTL.
func TestParkedRunnerDiesOrExpires(t *testing.T) {
	file := filepath.Join(t.TempDir(), "loads")
	e := newEngine(t, python.Config{Env: []string{"LOADS_FILE=" + file}, ParkTTL: 300 * time.Millisecond})
	code := loadsWorker + "TAG = 'v1'\n"
	inst := loadAfterTheCheckedRunnerExits(t, e, file, testSpec, code, "after the parked one expired")
	// Killed while parked.
	code2 := loadsWorker + "TAG = 'v2'\n"
	if err := e.Check(context.Background(), testSpec, []byte(code2)); err != nil {
		t.Fatal(err)
	}
	got := loads(t, file)
	killPid(t, got[len(got)-1])
	// "Died meanwhile": gone before the load asks for it (a busy machine
	// can leave a SIGKILLed process alive for a moment; a load that takes
	// it then fails on its exit).
	waitGone(t, got[len(got)-1])
	inst = load(t, e, testSpec, code2)
	if pid := itoa(pidOf(t, inst)); pid == got[len(got)-1] {
		t.Fatal("a killed parked runner was handed to the load")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// waitGone waits until process pid has exited and been reaped.
func waitGone(t *testing.T, pid string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat("/proc/" + pid); os.IsNotExist(err) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("process %s still there", pid)
}

func killPid(t *testing.T, pid string) {
	t.Helper()
	n, err := strconv.Atoi(pid)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(n, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
}

// A Load with Spec.Parked (a node attaching its workers again) starts no
// runner when the engine parks idle workers: the first event starts one
// and is answered by it. With parking off, Parked changes nothing.
func TestParkedLoadStartsNoRunner(t *testing.T) {
	for _, parkAfter := range []time.Duration{time.Hour, 0} {
		file := filepath.Join(t.TempDir(), "loads")
		e := newEngine(t, python.Config{Env: []string{"LOADS_FILE=" + file}, ParkAfter: parkAfter})
		spec := testSpec
		spec.Parked = true
		inst := load(t, e, spec, loadsWorker+"TAG = 'parked'\n")
		want := 0
		if parkAfter == 0 {
			want = 1
		}
		if got := loads(t, file); len(got) != want {
			t.Fatalf("park after %v: runners started by a parked Load: %v, want %d", parkAfter, got, want)
		}
		if out := mustCall(t, inst, jsonEvent("x", nil)); len(out) != 1 || !strings.Contains(string(out[0].Data()), `"parked"`) {
			t.Fatalf("park after %v: outputs %v", parkAfter, out)
		}
		if got := loads(t, file); len(got) != 1 {
			t.Fatalf("park after %v: runners after the first event: %v, want 1", parkAfter, got)
		}
	}
}

// A check whose Load runs on another node (Spec.LoadsElsewhere) keeps
// nothing: its runner exits at once, and a Load here starts its own.
func TestCheckForALoadElsewhereParksNothing(t *testing.T) {
	file := filepath.Join(t.TempDir(), "loads")
	e := newEngine(t, python.Config{Env: []string{"LOADS_FILE=" + file}})
	elsewhere := testSpec
	elsewhere.LoadsElsewhere = true
	loadAfterTheCheckedRunnerExits(t, e, file, elsewhere, loadsWorker+"TAG = 'v1'\n", "for a check whose Load runs elsewhere")
}

// loadAfterTheCheckedRunnerExits checks code with spec on a fresh engine
// (file records its runners), waits until the runner that checked it has
// exited, then loads it for testSpec: that Load must have started a runner
// of its own, the second.
func loadAfterTheCheckedRunnerExits(t *testing.T, e *python.Engine, file string, spec engines.Spec, code, when string) engines.Instance {
	t.Helper()
	if err := e.Check(context.Background(), spec, []byte(code)); err != nil {
		t.Fatal(err)
	}
	waitGone(t, loads(t, file)[0])
	inst := load(t, e, testSpec, code)
	if got := loads(t, file); len(got) != 2 || itoa(pidOf(t, inst)) != got[1] {
		t.Fatalf("runners %v %s: want the check's and one its Load started", got, when)
	}
	return inst
}
