//go:build linux

package native

import (
	"os"
	"os/exec"
	"testing"

	"github.com/virtufin/workmanager/engines/crashjournal"
)

// Issue 44 item 1: an in-process call that crashes the process leaves its
// worker and event in the crash journal, which the next start reads. The
// crash happens in a child (this test binary again), as it would in a node.
func TestInProcessCrashIsJournaled(t *testing.T) {
	if dir := os.Getenv("WM_NATIVE_CRASH_JOURNAL"); dir != "" {
		j, _, err := crashjournal.Open(dir, crashjournal.Options{Slots: 16, CrashOutput: true})
		if err != nil {
			t.Fatal(err)
		}
		inst := load(t, newTestEngine(t, Config{Journal: j}), testSpec, packageOf(t, flagsEcho, nil))
		mustCall(t, inst, typed("test.echo", map[string]int{"n": 1})) // returns: not in flight
		_, _ = call(t, inst, typed("test.crash", nil))
		t.Fatal("test.crash returned; the process should have died")
	}
	packageOf(t, flagsEcho, nil) // compiled here (skips without gcc)
	dir := t.TempDir()
	// The child dies without cleaning up: its temporary files (its
	// fixtures, its t.TempDir) go under a directory of this test's.
	tmp := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestInProcessCrashIsJournaled$", "-test.count=1")
	cmd.Env = append(os.Environ(), "WM_NATIVE_CRASH_JOURNAL="+dir, "TMPDIR="+tmp)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the child did not crash:\n%s", out)
	}
	calls, err := crashjournal.Peek(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0].Worker != testSpec.WorkerID || calls[0].Event != "id-test.crash" {
		t.Fatalf("journal after the crash: %+v; want worker %s event id-test.crash\nchild output:\n%s", calls, testSpec.WorkerID, out)
	}
	j, rep, err := crashjournal.Open(dir, crashjournal.Options{Slots: 16, CrashOutput: true})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	// The segfault in native code wrote a crash report: a crash, counted.
	if !rep.Crashed || len(rep.InFlight) != 1 || rep.CrashReport == "" {
		t.Fatalf("report: %+v", rep)
	}
	t.Logf("crash report: %s", rep.CrashReport)
}
