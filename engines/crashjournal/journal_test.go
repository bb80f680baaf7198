package crashjournal_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/virtufin/workmanager/engines/crashjournal"
)

// The child process: opens the journal in WM_CJ_DIR, enters a call of
// worker WM_CJ_WORKER with event WM_CJ_EVENT, and dies as WM_CJ_DIE says
// while the call is in flight.
func TestMain(m *testing.M) {
	if dir := os.Getenv("WM_CJ_DIR"); dir != "" {
		j, _, err := crashjournal.Open(dir, crashjournal.Options{Slots: 8, CrashOutput: os.Getenv("WM_CJ_CRASH_OUTPUT") == "1"})
		if err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(3)
		}
		if ev := os.Getenv("WM_CJ_EVENT_BEFORE"); ev != "" { // another call of the worker, in an earlier slot
			s, _ := j.Acquire()
			j.Enter(s, os.Getenv("WM_CJ_WORKER"), "src", ev)
		}
		s, _ := j.Acquire()
		j.Enter(s, os.Getenv("WM_CJ_WORKER"), "src", os.Getenv("WM_CJ_EVENT"))
		other, _ := j.Acquire()
		j.Enter(other, "done-worker", "src", "done-event")
		j.Leave(other) // returned before the crash: not counted
		switch os.Getenv("WM_CJ_DIE") {
		case "kill":
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case "segv":
			_ = syscall.Kill(os.Getpid(), syscall.SIGSEGV) // the signal a fault in native code raises
		case "clean":
			_ = j.Close()
			os.Exit(0)
		}
		select {}
	}
	os.Exit(m.Run())
}

// crash runs the child, which dies in a call of worker with event.
func crash(t *testing.T, dir, worker, event, how string, env ...string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), "WM_CJ_DIR="+dir, "WM_CJ_WORKER="+worker, "WM_CJ_EVENT="+event, "WM_CJ_DIE="+how), env...)
	out, err := cmd.CombinedOutput()
	if how == "clean" {
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	if err == nil {
		t.Fatalf("child did not die (%s)", how)
	}
}

func TestCrashInFlightIsCountedSuspectedAndQuarantined(t *testing.T) {
	dir := t.TempDir()
	crash(t, dir, "w1", "e1", "kill")
	calls, err := crashjournal.Peek(dir)
	if err != nil || len(calls) != 1 || calls[0].Worker != "w1" || calls[0].Event != "e1" {
		t.Fatalf("Peek after SIGKILL = %+v, %v; want the one call of w1/e1", calls, err)
	}
	j, rep, err := crashjournal.Open(dir, crashjournal.Options{Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Crashed || len(rep.InFlight) != 1 || rep.InFlight[0].Worker != "w1" || rep.InFlight[0].Event != "e1" {
		t.Fatalf("report after one crash: %+v", rep)
	}
	if len(rep.Quarantine) != 0 || len(rep.Suspects) != 0 || j.Suspect("w1", "src", "e1") {
		t.Fatalf("one crash already quarantines or suspects: %+v", rep)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if calls, _ := crashjournal.Peek(dir); len(calls) != 0 {
		t.Fatalf("Peek after a clean close: %+v", calls)
	}

	crash(t, dir, "w1", "e1", "segv")
	j, rep, err = crashjournal.Open(dir, crashjournal.Options{Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if !rep.Crashed || len(rep.InFlight) != 1 {
		t.Fatalf("report after the second crash: %+v", rep)
	}
	if c, ok := rep.Quarantine["w1"]; !ok || c.Crashes != 2 || c.LastEvent != "e1" {
		t.Fatalf("w1 not reported for quarantine after two crashes: %+v", rep.Quarantine)
	}
	if !j.Suspect("w1", "src", "e1") {
		t.Fatal("e1 of w1 in flight at two crashes is not a suspect")
	}
	if j.Suspect("w1", "other-source", "e1") || j.Suspect("w2", "src", "e1") || j.Suspect("w1", "src", "e2") {
		t.Fatal("suspect beyond the (worker, source, event) that crashed")
	}
	if j.Suspect("done-worker", "src", "done-event") {
		t.Fatal("a call that returned before the crash is a suspect")
	}
	// The counts are durable: a quarantine recorded resets the worker's
	// count, not its suspects.
	if err := j.Quarantined("w1"); err != nil {
		t.Fatal(err)
	}
	var counts crashjournal.Counts
	b, err := os.ReadFile(filepath.Join(dir, crashjournal.CountsFile))
	if err != nil || json.Unmarshal(b, &counts) != nil {
		t.Fatalf("counts file: %v %s", err, b)
	}
	if _, ok := counts.Workers["w1"]; ok || len(counts.Events) != 1 || counts.Events[0].Crashes != 2 {
		t.Fatalf("counts after Quarantined: %+v", counts)
	}
	if !j.Suspect("w1", "src", "e1") {
		t.Fatal("Quarantined dropped the suspect")
	}
	if err := j.Forget("w1"); err != nil {
		t.Fatal(err)
	}
	if j.Suspect("w1", "src", "e1") {
		t.Fatal("Forget kept the suspect")
	}
}

// A worker with several events in flight at a crash: its quarantine names
// the event that keeps crashing (in flight at the most crashes), not the
// one that happens to take the first slot (an event redelivered after the
// first crash and in flight beside the culprit's redelivery).
func TestQuarantineNamesTheEventThatKeepsCrashing(t *testing.T) {
	dir := t.TempDir()
	crash(t, dir, "w1", "boom", "segv")
	j, _, err := crashjournal.Open(dir, crashjournal.Options{Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	crash(t, dir, "w1", "boom", "segv", "WM_CJ_EVENT_BEFORE=fine-1")
	calls, err := crashjournal.Peek(dir)
	if err != nil || len(calls) != 2 || calls[0].Event != "fine-1" || calls[1].Event != "boom" {
		t.Fatalf("Peek = %+v, %v; want fine-1 in the first slot, then boom", calls, err)
	}
	j, rep, err := crashjournal.Open(dir, crashjournal.Options{Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if c, ok := rep.Quarantine["w1"]; !ok || c.Crashes != 2 || c.LastEvent != "boom" {
		t.Fatalf("quarantine after two crashes: %+v; want w1, 2 crashes, last event boom", rep.Quarantine)
	}
	if !j.Suspect("w1", "src", "boom") || j.Suspect("w1", "src", "fine-1") {
		t.Fatal("suspects: want boom (two crashes), not fine-1 (one)")
	}
}

func TestCleanStopIsNotACrash(t *testing.T) {
	dir := t.TempDir()
	crash(t, dir, "w1", "e1", "clean") // a call still in native code at a normal stop
	j, rep, err := crashjournal.Open(dir, crashjournal.Options{Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if rep.Crashed || len(rep.InFlight) != 0 {
		t.Fatalf("a normal stop counted as a crash: %+v", rep)
	}
}

func TestQuarantineThresholdIsASetting(t *testing.T) {
	dir := t.TempDir()
	for i := range 3 {
		crash(t, dir, "w1", "e"+string(rune('a'+i)), "kill")
		j, rep, err := crashjournal.Open(dir, crashjournal.Options{Slots: 8, Quarantine: 3})
		if err != nil {
			t.Fatal(err)
		}
		if _, q := rep.Quarantine["w1"]; q != (i == 2) {
			t.Fatalf("after crash %d: quarantine %v, want %v", i+1, rep.Quarantine, i == 2)
		}
		if len(rep.Suspects) != 0 { // a different event each time
			t.Fatalf("suspects after crash %d: %+v", i+1, rep.Suspects)
		}
		j.Close()
	}
}

func TestLongIDsAreHashedAndOneOwner(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", 500)
	crash(t, dir, "w1", long, "kill")
	calls, _ := crashjournal.Peek(dir)
	if len(calls) != 1 || !strings.HasPrefix(calls[0].Event, "sha256:") {
		t.Fatalf("long event id: %+v", calls)
	}
	j, _, err := crashjournal.Open(dir, crashjournal.Options{Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, _, err := crashjournal.Open(dir, crashjournal.Options{Slots: 8}); err == nil || !strings.Contains(err.Error(), "NODE_STATE_DIR") {
		t.Fatalf("a second open of one journal: %v", err)
	}
}

func TestSlotsRunOut(t *testing.T) {
	j, _, err := crashjournal.Open(t.TempDir(), crashjournal.Options{Slots: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	a, ok1 := j.Acquire()
	_, ok2 := j.Acquire()
	if _, ok3 := j.Acquire(); !ok1 || !ok2 || ok3 {
		t.Fatalf("acquire: %v %v %v", ok1, ok2, ok3)
	}
	j.Release(a)
	if _, ok := j.Acquire(); !ok {
		t.Fatal("a released slot is not free again")
	}
	var none *crashjournal.Journal
	s, ok := none.Acquire()
	none.Enter(s, "w", "s", "e")
	if ok || none.Suspect("w", "s", "e") {
		t.Fatal("a nil journal journals")
	}
}

func BenchmarkEnterLeave(b *testing.B) {
	j, _, err := crashjournal.Open(b.TempDir(), crashjournal.Options{Slots: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	s, _ := j.Acquire()
	for b.Loop() {
		j.Enter(s, "tenant-a.worker-1", "https://example.com/producer", "0f8fad5b-d9cb-469f-a165-70867728950e")
		j.Leave(s)
	}
}

// With CrashOutput, only a death that wrote a crash report (a fatal signal
// such as a segfault) counts: a SIGKILL from outside (an orchestrator, the
// OOM killer, a test) with a call in flight is reported, not counted.
func TestOnlyCrashesThatReportCountWithCrashOutput(t *testing.T) {
	dir := t.TempDir()
	opts := crashjournal.Options{Slots: 8, CrashOutput: true}
	open := func() crashjournal.Report {
		t.Helper()
		j, rep, err := crashjournal.Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	open() // the journal and its crash output exist, empty
	for range 2 {
		crash(t, dir, "w1", "e1", "kill", "WM_CJ_CRASH_OUTPUT=1")
		if rep := open(); rep.Crashed || !rep.Killed || len(rep.InFlight) != 1 || len(rep.Quarantine) != 0 {
			t.Fatalf("a SIGKILL with a call in flight: %+v; want Killed, not counted", rep)
		}
	}
	crash(t, dir, "w1", "e1", "segv", "WM_CJ_CRASH_OUTPUT=1")
	if r := crashjournal.CrashReport(dir); !strings.Contains(r, "SIGSEGV") {
		t.Fatalf("CrashReport after a segfault: %q", r)
	}
	rep := open()
	if !rep.Crashed || rep.Killed || !strings.Contains(rep.CrashReport, "SIGSEGV") {
		t.Fatalf("a segfault with a call in flight: %+v; want Crashed with its report", rep)
	}
	if c := rep.Quarantine["w1"]; c.Crashes != 0 {
		t.Fatalf("one counted crash reports a quarantine: %+v", rep.Quarantine)
	}
}
