package python_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
)

// TestReplyOverLimitFailsWhileRead is issue 32's item 4: a reply over the
// engine's limit fails the call with a clear reason on its frame header,
// before the node allocates for it; the process is replaced.
func TestReplyOverLimitFailsWhileRead(t *testing.T) {
	e := newEngine(t, python.Config{MaxReplyBytes: 1 << 20})
	inst := load(t, e, testSpec, `
def process(event):
    if event["type"] == "big":
        return {"type": "big", "data": "x" * (64 << 20)}
    return {"type": "small", "data": "x" * (512 << 10)}
`)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := call(t, inst, jsonEvent("big", nil))
	runtime.ReadMemStats(&after)
	if !errors.Is(err, engines.ErrReplyTooLarge) || !errors.Is(err, engines.ErrWorkerFailed) ||
		!strings.Contains(err.Error(), "exceeds the limit of 1048576 bytes") {
		t.Fatalf("err = %v, want ErrReplyTooLarge naming the limit", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Errorf("a refused 64 MiB reply cost the node %d bytes of allocations", grew)
	}
	if out := mustCall(t, inst, jsonEvent("small", nil)); len(out) != 1 || len(out[0].Data()) < 512<<10 {
		t.Fatalf("a reply under the limit: %d outputs", len(out))
	}
}

// blockingGateway holds every call until its ctx ends (or 5 minutes), and
// reports how it ended; entered (when set) receives a value as each
// call arrives. Its hold is far longer than the tests' bounds, so that a
// call ended by its deadline or by Close is told apart from one the
// gateway let go, however starved the machine (the bounds are guards
// against a hang, not speed tests).
type blockingGateway struct{ entered, ended chan error }

const gatewayHold = 5 * time.Minute

func (g *blockingGateway) Call(ctx context.Context, _, _ string, _ []byte) ([]byte, error) {
	if g.entered != nil {
		g.entered <- nil
	}
	select {
	case <-ctx.Done():
		g.ended <- ctx.Err()
		return nil, ctx.Err()
	case <-time.After(gatewayHold):
		g.ended <- nil
		return []byte("{}"), nil
	}
}

const gatewayWorker = `
import virtufin_host

def process(event):
    virtufin_host.call_gateway("billing", "charge", {})
    return {"type": "done"}
`

// TestGatewayCallEndsAtTheDeadline is issue 34's item 3: a gateway call
// in flight ends with the call's timeout (it used to run on the Process
// context, bounded only by the gateway's own 30 s).
func TestGatewayCallEndsAtTheDeadline(t *testing.T) {
	gw := &blockingGateway{ended: make(chan error, 4)}
	e := newEngine(t, python.Config{Gateway: gw})
	spec := testSpec
	spec.Timeout = 300 * time.Millisecond
	inst := load(t, e, spec, gatewayWorker)
	start := time.Now()
	_, err := call(t, inst, jsonEvent("t", nil))
	if took := time.Since(start); took > time.Minute {
		t.Fatalf("the call took %v against a 300ms timeout", took)
	}
	if !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	select {
	case gerr := <-gw.ended:
		if gerr == nil {
			t.Fatal("the gateway call was not cancelled")
		}
	case <-time.After(time.Minute):
		t.Fatal("the gateway call still runs")
	}
}

// TestCloseEndsGatewayCalls: Close cancels a gateway call in flight (item
// 3) instead of waiting for the backend.
func TestCloseEndsGatewayCalls(t *testing.T) {
	gw := &blockingGateway{entered: make(chan error, 4), ended: make(chan error, 4)}
	e := newEngine(t, python.Config{Gateway: gw})
	spec := testSpec
	spec.Timeout = 30 * time.Second
	inst := load(t, e, spec, gatewayWorker)
	go inst.Process(context.Background(), jsonEvent("t", nil))
	select { // the call is in the gateway (a fixed sleep can be too short under load)
	case <-gw.entered:
	case <-time.After(2 * time.Minute):
		t.Fatal("the call never reached the gateway")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = inst.Close(ctx)
	if took := time.Since(start); took > time.Minute {
		t.Fatalf("Close took %v with a 200ms context", took)
	}
	select {
	case gerr := <-gw.ended:
		if gerr == nil {
			t.Fatal("the gateway call was not cancelled")
		}
	case <-time.After(time.Minute):
		t.Fatal("the gateway call still runs")
	}
}

// TestDeadIdleProcessIsReplaced is issue 34's item 5: a runner that died
// while idle is replaced before the next call, which succeeds.
func TestDeadIdleProcessIsReplaced(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, pidWorker)
	pid := pidOf(t, inst)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Until the engine has seen the exit, not for a time (100 ms after
	// the reap was too short for .NET's twin of this test under a hog).
	enginetest.WaitFor(t, "the engine to see the killed runner's exit", func() bool { return python.AllExited(inst) })
	if pid2 := pidOf(t, inst); pid2 == pid {
		t.Fatalf("still pid %d", pid)
	}
}
