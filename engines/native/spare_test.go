//go:build linux

package native

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/lull"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// readySpare waits for e's spare check host and returns it.
func readySpare(t *testing.T, e *Engine) *spareHost {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if r := e.spareHosts.Ready(); len(r) > 0 {
			return r[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("no spare check host started within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A Check takes a spare check host when one is ready: the package loads
// in the spare's sandbox (its constructors do not run in this process),
// with the worker's identity in the environment before the constructors
// run; a constructor that kills its parent kills only the sandbox; each
// spare checks one package and is gone after it, its directory removed;
// without a spare ready a Check starts a host of its own, as before.
func TestCheckTakesASpareHost(t *testing.T) {
	sb := sandboxtest.Strict(t)
	e := newTestEngine(t, hostConfig(Config{Sandbox: sb, SpareCheckHosts: 1}))
	t.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// None ready before the first Check (spares start once needed): it
	// checks in a host of its own.
	if n := len(e.spareHosts.Ready()); n != 0 {
		t.Fatalf("%d spares before any Check", n)
	}
	if err := e.Check(ctx, testSpec, packageOf(t, flagsEcho, nil)); err != nil {
		t.Fatalf("Check without a spare: %v", err)
	}
	if n := e.spareChecks.Load(); n != 0 {
		t.Fatalf("%d checks by a spare before one was started", n)
	}

	mark := filepath.Join(t.TempDir(), "ctor-ran")
	for name, tc := range map[string]struct {
		flags []string
		want  string // "" for a package that checks
	}{
		"identity before constructors": {[]string{`-DCTOR_REQUIRE_ID="` + testSpec.WorkerID + `"`}, ""},
		"another worker's identity":    {[]string{`-DCTOR_REQUIRE_ID="somebody-else"`}, "native host exited while loading"},
		"constructor writes a file":    {[]string{`-DCTOR_WRITE="` + mark + `"`}, ""},
		"constructor kills its parent": {[]string{"-DCTOR_KILL"}, "native host exited while loading"},
		"missing export":               {[]string{"-DPROCESS_NAME=Other"}, "Process"},
	} {
		t.Run(name, func(t *testing.T) {
			s := readySpare(t, e)
			pk := packageOf(t, tc.flags, nil)
			before := e.spareChecks.Load()
			start := time.Now()
			err := e.Check(ctx, testSpec, pk)
			t.Logf("checked in %v: %v", time.Since(start).Round(time.Microsecond), err)
			if n := e.spareChecks.Load() - before; n != 1 {
				t.Fatalf("%d checks by a spare, want 1", n)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case tc.want != "" && (!errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Check: err = %v, want ErrInvalidCode with %q", err, tc.want)
			}
			// That spare did the check, once: it exits (in the
			// background), its directory goes with it.
			waitFor(t, "the spare that checked the package to exit and its directory to go", func() bool {
				_, err := os.Stat(s.dir)
				return s.Exited() && errors.Is(err, os.ErrNotExist)
			})
			for _, r := range e.spareHosts.Ready() {
				if r == s {
					t.Fatal("the used spare is ready again")
				}
			}
		})
	}
	if _, err := os.Stat(mark); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a constructor wrote %s on the node's file system (stat: %v)", mark, err)
	}
	waitFor(t, "no extracted bytes counted after the checks", func() bool { return e.extractedBytes() == 0 })
	// A spare that died while it waited is not used: the check starts a
	// host of its own.
	dead := readySpare(t, e)
	syscall.Kill(dead.p.cmd.Process.Pid, syscall.SIGKILL)
	<-dead.p.done
	before := e.spareChecks.Load()
	if err := e.Check(ctx, testSpec, packageOf(t, flagsEcho, nil)); err != nil {
		t.Fatalf("Check after the spare died: %v", err)
	}
	if n := e.spareChecks.Load() - before; n != 0 {
		t.Fatalf("%d checks by a dead spare", n)
	}
	if _, err := os.Stat(dead.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dead spare's directory is still there (stat: %v)", err)
	}
	// Close retires the spare that is ready.
	s := readySpare(t, e)
	e.Close()
	if !s.Exited() {
		t.Fatal("Close left a spare check host running")
	}
}

// The host that checked an in-process worker's package exits once the
// node's calls pause (lull.Node), not beside the rest of the call whose
// check it ran (the create's or reload's store writes and load); Close
// does not wait for a pause: the hosts waiting to exit exit before it
// returns.
func TestCheckHostExitsOnceCallsPause(t *testing.T) {
	sb := sandboxtest.Strict(t)
	e := newTestEngine(t, hostConfig(Config{Sandbox: sb, SpareCheckHosts: 1}))
	t.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := packageOf(t, flagsEcho, nil)
	if err := e.Check(ctx, testSpec, code); err != nil { // spares start once needed
		t.Fatalf("Check: %v", err)
	}

	s := readySpare(t, e)
	end := lull.Node.Begin() // the node's call, still running
	if err := e.Check(ctx, testSpec, code); err != nil {
		end()
		t.Fatalf("Check: %v", err)
	}
	// Past the pause it waits for, and well inside its bound
	// (checkRetireMax), the call still runs: the host waits.
	time.Sleep(2 * checkRetireSettle)
	exited := s.Exited()
	end()
	if exited {
		t.Fatal("the checking host exited while the node's call still ran")
	}
	waitFor(t, "the checking host to exit once the calls paused, its directory with it", func() bool {
		_, err := os.Stat(s.dir)
		return s.Exited() && errors.Is(err, os.ErrNotExist)
	})

	// Under calls that never pause it exits at the bound.
	s = readySpare(t, e)
	end = lull.Node.Begin()
	defer end()
	if err := e.Check(ctx, testSpec, code); err != nil {
		t.Fatalf("Check: %v", err)
	}
	waitFor(t, "the checking host to exit at the bound, calls or not", s.Exited)

	// Close runs the exits still waiting.
	s = readySpare(t, e)
	if err := e.Check(ctx, testSpec, code); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if s.Exited() {
		t.Fatal("the checking host exited before the bound while a call ran")
	}
	e.Close()
	if !s.Exited() {
		t.Fatal("Close returned with a checking host still running")
	}
	if _, err := os.Stat(s.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Close returned with a checking host's directory still there (stat: %v)", err)
	}
}

// servesUntilClosed checks that s, a spare's host, is the one serving
// inst (an event is answered while it runs) and that it exits with inst,
// its package directory with it.
func servesUntilClosed(ctx context.Context, t *testing.T, s *spareHost, inst engines.Instance) {
	t.Helper()
	if out := mustCall(t, inst, typed("served", map[string]any{"n": 1})); len(out) != 1 {
		t.Fatalf("%d outputs, want 1", len(out))
	}
	if s.Exited() {
		t.Fatal("the spare's host is not the one serving the worker")
	}
	inst.Close(ctx)
	waitFor(t, "the spare's host exits with the instance", s.Exited)
	waitFor(t, "its package directory is removed", func() bool { _, err := os.Stat(s.dir); return errors.Is(err, os.ErrNotExist) })
}

// waitFor polls cond for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within a minute: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *Engine) extractedBytes() int64 {
	e.diskMu.Lock()
	defer e.diskMu.Unlock()
	return e.diskUsed
}

// With process isolation, the host that checked a worker's package (a
// spare, or one started for the check) stays loaded for the Load of the
// same worker and code, which takes it as its first host instead of
// starting one: it serves the worker's events with the worker's identity
// (set before its constructors ran), exits when the instance closes, and
// its package directory goes with it. A Load of other code, or of
// another worker, does not take it; one nobody takes exits after the
// park TTL; one that dies after the Load took it is replaced by a host
// started for the worker; a Load with no check before it takes a ready
// spare; Close retires the parked ones.
func TestLoadTakesTheHostItsCheckLoaded(t *testing.T) {
	sb := sandboxtest.Strict(t)
	e := newTestEngine(t, hostConfig(Config{Sandbox: sb, SpareCheckHosts: 1, Isolation: IsolationProcess, ParkTTL: 2 * time.Second}))
	t.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := packageOf(t, []string{`-DCTOR_REQUIRE_ID="` + testSpec.WorkerID + `"`}, nil)
	if err := e.Check(ctx, testSpec, code); err != nil { // no spare yet: a host of its own
		t.Fatalf("Check: %v", err)
	}
	if e.parking.Len() != 1 {
		t.Fatalf("%d hosts parked after a Check in a host of its own, want 1", e.parking.Len())
	}
	inst, err := e.Load(ctx, testSpec, code)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if n := e.parkedLoads.Load(); n != 1 {
		t.Fatalf("%d loads took the checked host, want 1", n)
	}
	if out := mustCall(t, inst, typed("first", map[string]any{"n": 1})); len(out) != 1 {
		t.Fatalf("%d outputs, want 1", len(out))
	}
	inst.Close(ctx)

	// Checked by a spare: the Load takes that spare's host.
	s := readySpare(t, e)
	if err := e.Check(ctx, testSpec, code); err != nil {
		t.Fatalf("Check in a spare: %v", err)
	}
	if s.Exited() {
		t.Fatal("the spare that checked the package exited: it should wait for the Load")
	}
	inst, err = e.Load(ctx, testSpec, code)
	if err != nil {
		t.Fatalf("Load after a spare's check: %v", err)
	}
	if n := e.parkedLoads.Load(); n != 2 {
		t.Fatalf("%d loads took the checked host, want 2", n)
	}
	servesUntilClosed(ctx, t, s, inst)

	// Other code, or another worker: not taken; it exits after the TTL.
	s = readySpare(t, e)
	if err := e.Check(ctx, testSpec, code); err != nil {
		t.Fatalf("Check: %v", err)
	}
	other := testSpec
	other.WorkerID = "w-other"
	otherCode := packageOf(t, []string{`-DCTOR_REQUIRE_ID="w-other"`}, nil)
	for _, c := range []struct {
		spec engines.Spec
		code []byte
	}{{testSpec, packageOf(t, flagsEcho, nil)}, {other, otherCode}} {
		before := e.parkedLoads.Load()
		inst, err := e.Load(ctx, c.spec, c.code)
		if err != nil {
			t.Fatalf("Load of %s: %v", c.spec.WorkerID, err)
		}
		if e.parkedLoads.Load() != before {
			t.Fatalf("a Load of %s took a host checked for other code or another worker", c.spec.WorkerID)
		}
		mustCall(t, inst, typed("third", nil))
		inst.Close(ctx)
	}
	waitFor(t, "a parked host nobody took exits after the TTL", s.Exited)
	waitFor(t, "and its directory is removed", func() bool { _, err := os.Stat(s.dir); return errors.Is(err, os.ErrNotExist) })
	waitFor(t, "no extracted bytes counted", func() bool { return e.extractedBytes() == 0 })

	// The parked host dies after the Load took it: the worker's next
	// host is started for it, from the package extracted for it.
	s = readySpare(t, e)
	if err := e.Check(ctx, testSpec, code); err != nil {
		t.Fatalf("Check: %v", err)
	}
	inst, err = e.Load(ctx, testSpec, code)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	syscall.Kill(s.p.cmd.Process.Pid, syscall.SIGKILL)
	waitFor(t, "the killed host is reaped", s.Exited)
	waitFor(t, "a host started for the worker answers", func() bool { _, err := call(t, inst, typed("again", nil)); return err == nil })
	waitFor(t, "the killed host's directory is removed", func() bool { _, err := os.Stat(s.dir); return errors.Is(err, os.ErrNotExist) })
	inst.Close(ctx)
	waitFor(t, "no extracted bytes counted once the instance closed", func() bool { return e.extractedBytes() == 0 })

	// A Load with no check before it (a start, a reconcile) takes a
	// ready spare as its first host.
	s = readySpare(t, e)
	before := e.spareLoads.Load()
	inst, err = e.Load(ctx, testSpec, code)
	if err != nil {
		t.Fatalf("Load without a check: %v", err)
	}
	if n := e.spareLoads.Load() - before; n != 1 {
		t.Fatalf("%d loads took a spare, want 1", n)
	}
	servesUntilClosed(ctx, t, s, inst)

	// Close retires a parked host.
	s = readySpare(t, e)
	if err := e.Check(ctx, testSpec, code); err != nil {
		t.Fatalf("Check: %v", err)
	}
	e.Close()
	waitFor(t, "Close retires the parked host", s.Exited)
}

// A process-isolated worker's check whose Load runs on another node
// (Spec.LoadsElsewhere) keeps nothing: the spare that checked the package
// exits and its directory goes, as for an in-process worker.
func TestCheckForALoadElsewhereParksNoHost(t *testing.T) {
	sb := sandboxtest.Strict(t)
	e := newTestEngine(t, hostConfig(Config{Sandbox: sb, SpareCheckHosts: 1, Isolation: IsolationProcess}))
	t.Cleanup(func() { e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := packageOf(t, []string{`-DCTOR_REQUIRE_ID="` + testSpec.WorkerID + `"`}, nil)
	if err := e.Check(ctx, testSpec, code); err != nil { // starts the spares
		t.Fatalf("Check: %v", err)
	}
	s := readySpare(t, e)
	elsewhere := testSpec
	elsewhere.LoadsElsewhere = true
	if err := e.Check(ctx, elsewhere, code); err != nil {
		t.Fatalf("Check: %v", err)
	}
	waitFor(t, "the spare that checked the package to exit and its directory to go", func() bool {
		_, err := os.Stat(s.dir)
		return s.Exited() && errors.Is(err, os.ErrNotExist)
	})
}
