package python

import (
	"bytes"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/wire"
)

// BatchedCalls is how many of inst's calls went in a batch of two or more.
func BatchedCalls(inst engines.Instance) int64 { return inst.(*Instance).batched.Load() }

// Waiting is how many of inst's calls wait for a process.
func Waiting(inst engines.Instance) int {
	in := inst.(*Instance)
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.waiting)
}

// AllExited reports whether every runner process inst holds has exited
// and been seen to (its Done closed).
func AllExited(inst engines.Instance) bool { return inst.(*Instance).pool.AllExited() }

// SlowDecode makes the decoding of a batched event's reply that contains
// match take d longer, until the test ends.
func SlowDecode(t testing.TB, match string, d time.Duration) {
	decodeOutputs = func(payload []byte, limit int) ([]event.Event, error) {
		if bytes.Contains(payload, []byte(match)) {
			time.Sleep(d)
		}
		return wire.DecodeOutputs(payload, limit)
	}
	t.Cleanup(func() { decodeOutputs = wire.DecodeOutputs })
}

// LiveProcesses is how many of inst's process slots are not cold.
func LiveProcesses(inst engines.Instance) int { return inst.(*Instance).pool.Live() }

// WaitRetireTick waits a moment for the idle retirement to look again.
func WaitRetireTick(inst engines.Instance) {
	<-time.After(inst.(*Instance).e.cfg.IdleRetire / 4)
}

// SpareCount is how many spare runners e keeps ready (Config.Spares).
func SpareCount(e *Engine) int { return len(e.spares.Ready()) }

// SparePIDs are the pids of e's ready spare runners.
func SparePIDs(e *Engine) []int {
	var pids []int
	for _, p := range e.spares.Ready() {
		pids = append(pids, p.Pid)
	}
	return pids
}

// RunnerPIDs are the host pids of inst's runner processes.
func RunnerPIDs(inst engines.Instance) []int {
	var pids []int
	for _, p := range inst.(*Instance).pool.Tracked() {
		pids = append(pids, p.Pid)
	}
	return pids
}

// RunnerStart is how e starts its runners: "file" (runner.py compiled once
// by the probe, read from a file next to the DevKit), "compiled" (that
// code on the command line: no DevKit directory) or "source"; with source
// set, e starts them from the source from now on (the fallback when the
// probe could not compile it).
func RunnerStart(t testing.TB, e *Engine, source bool) string {
	t.Helper()
	interp, err := e.interpreter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.probe(t.Context(), interp); err != nil {
		t.Fatal(err)
	}
	if source {
		e.probed.runner, e.probed.runnerFile = nil, ""
	}
	switch {
	case e.probed.runnerFile != "":
		return "file"
	case e.probed.runner != nil:
		return "compiled"
	}
	return "source"
}

// RunnerFile is where e's runners read the compiled runner ("" when they
// get it on their command line).
func RunnerFile(e *Engine) string { return e.probed.runnerFile }

// PretendInterpreterChanged makes e start its runners as if the code it
// compiled came from another interpreter version.
func PretendInterpreterChanged(e *Engine) { e.probed.hexversion++ }

// ForkServerPid is the pid of e's fork server (0: none running).
func ForkServerPid(e *Engine) int {
	e.fsMu.Lock()
	defer e.fsMu.Unlock()
	if e.fs == nil || !e.fs.alive() {
		return 0
	}
	return e.fs.cmd.Process.Pid
}

// ForkServerRetry sets how long after a fork server's start a dead one is
// not started again, until the test ends.
func ForkServerRetry(t testing.TB, d time.Duration) {
	old := forkServerRetry
	forkServerRetry = d
	t.Cleanup(func() { forkServerRetry = old })
}

// HoldSpareStarts makes e's next spare starts wait until release is
// called (at the latest when the test ends), and makes a runner start
// wait up to 30 s for a spare being started; started lists the pids of
// the spares started since.
func HoldSpareStarts(t testing.TB, e *Engine) (release func(), started func() []int) {
	start, gate := e.spares.Start, make(chan struct{})
	var mu sync.Mutex
	var pids []int
	e.spares.Start = func() (*proc, error) {
		<-gate
		p, err := start()
		if err == nil {
			mu.Lock()
			pids = append(pids, p.Pid)
			mu.Unlock()
		}
		return p, err
	}
	wait := spareRunnerWait
	spareRunnerWait = 30 * time.Second
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(func() {
		release()
		spareRunnerWait = wait
	})
	return release, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(pids)
	}
}

// SpareAwaiting is how many runner starts wait for the spare being started.
func SpareAwaiting(e *Engine) int { return e.spares.Awaiting() }
