//go:build linux || darwin || freebsd

package native

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// TestForgedResponseFailsTheCall is issue 34's item 1 end to end: a worker
// whose Process returns the 48-byte forged response (result_events claims
// ~4 billion elements) gets a failed call with a clear reason, in process
// and from an isolated host (whose replies the node decodes too); the next
// call works.
func TestForgedResponseFailsTheCall(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		_, err := call(t, inst, typed("test.forged", nil))
		var werr *WorkerError
		if !errors.As(err, &werr) || !strings.Contains(err.Error(), "result_events") || !strings.Contains(err.Error(), "does not fit") {
			t.Fatalf("Process(test.forged) = %v, want a malformed-response WorkerError", err)
		}
		in := enginetest.NewEvent("after", enginetest.TypeRequest, map[string]any{"n": 1}, "c")
		if out := mustCall(t, inst, in); len(out) != 1 {
			t.Fatalf("after the forged response: %v", out)
		}
	})
}

// TestResponseOverTheReplyLimit is issue 32's item 4 for native workers: a
// response over MaxReplyBytes fails the call (an isolated host's result
// frame is refused on its header).
func TestResponseOverTheReplyLimit(t *testing.T) {
	modes(t, func(t *testing.T, cfg Config) {
		cfg.MaxReplyBytes = 1 << 20
		inst := load(t, newTestEngine(t, cfg), testSpec, packageOf(t, flagsEcho, nil))
		_, err := call(t, inst, typed("test.bigout", nil))
		if !errors.Is(err, engines.ErrReplyTooLarge) || !errors.Is(err, engines.ErrWorkerFailed) ||
			!strings.Contains(err.Error(), "exceeds the limit of 1048576 bytes") {
			t.Fatalf("Process(test.bigout) = %v, want ErrReplyTooLarge", err)
		}
		mustCall(t, inst, typed("test.stats", nil))
	})
}

// TestIsolatedTimeoutKillsForkedChildren is issue 34's item 4: a library
// that forked a child (which keeps the reply pipe open) and hangs; the
// timeout kills the host's whole process group, so the call ends at its
// timeout and Close does not block.
func TestIsolatedTimeoutKillsForkedChildren(t *testing.T) {
	e := newTestEngine(t, hostConfig(Config{Isolation: IsolationProcess}))
	spec := testSpec
	spec.Timeout = 300 * time.Millisecond
	inst, err := e.Load(context.Background(), spec, packageOf(t, flagsEcho, nil))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = call(t, inst, typed("test.forkhang", nil))
	if took := time.Since(start); took > 10*time.Second { // the fixture hangs 20 s
		t.Fatalf("the call took %v against a 300ms timeout", took)
	}
	if !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start = time.Now()
	if err := inst.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second { // the fixture hangs 20 s
		t.Fatalf("Close took %v", took)
	}
}

// TestHostOutputAfterALongLine is issue 34's item 7: an output line over
// 64 KiB no longer ends the reading of the host's output, so the crash
// report after it is still in the error.
func TestHostOutputAfterALongLine(t *testing.T) {
	e := newTestEngine(t, hostConfig(Config{Isolation: IsolationProcess}))
	inst := load(t, e, testSpec, packageOf(t, flagsEcho, nil))
	_, err := call(t, inst, typed("test.longline", nil))
	if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "crashing after a long line") {
		t.Fatalf("err = %v, want the crash report after the long line", err)
	}
}

// TestCallGuard: once a call has ended, a deadline firing late does
// nothing (item 2 for the native host).
func TestCallGuard(t *testing.T) {
	g := &callGuard{}
	fired := 0
	g.fire(func() { fired++ })
	g.end()
	g.fire(func() { fired++ })
	if fired != 1 {
		t.Fatalf("fired %d times, want 1 (before end only)", fired)
	}
}

// TestIsolatedHostThatDiedIdleIsReplaced is issue 34's item 5 for native
// hosts: a host that exited between calls is replaced before the next
// call, which succeeds instead of failing as "exited during the call".
func TestIsolatedHostThatDiedIdleIsReplaced(t *testing.T) {
	e := newTestEngine(t, hostConfig(Config{Isolation: IsolationProcess}))
	inst := load(t, e, testSpec, packageOf(t, flagsEcho, nil))
	mustCall(t, inst, typed("test.exitsoon", nil))
	// The host exits 200 ms after the call: wait until the engine has
	// seen it (its Done closed), not for a time.
	enginetest.WaitFor(t, "the engine to see the host's exit", inst.(*hostInstance).pool.AllExited)
	mustCall(t, inst, typed("test.stats", nil))
}
