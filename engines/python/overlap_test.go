package python_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
)

// asyncSleeper and defSleeper wait 30 ms per event and return their own
// enter and exit times (time.time(), seconds) and pid.
const asyncSleeper = `
import asyncio, time, os

async def process(event):
    enter = time.time()
    await asyncio.sleep(0.03)
    return {"type": "slow.done", "data": {"enter": enter, "exit": time.time(), "pid": os.getpid()}}
`

const defSleeper = `
import time, os

def process(event):
    enter = time.time()
    time.sleep(0.03)
    return {"type": "slow.done", "data": {"enter": enter, "exit": time.time(), "pid": os.getpid()}}
`

// interval is one event's run as the worker saw it.
type interval struct {
	enter, exit float64
	pid         float64
}

// maxOverlap is the most intervals that were open at the same instant.
func maxOverlap(ivs []interval) int {
	enter, exit := make([]float64, len(ivs)), make([]float64, len(ivs))
	for i, iv := range ivs {
		enter[i], exit[i] = iv.enter, iv.exit
	}
	return enginetest.MaxOverlap(enter, exit)
}

// runAtOnce makes n calls at the same time and returns the intervals the
// worker reported.
func runAtOnce(t *testing.T, inst engines.Instance, n int) []interval {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ivs := make([]interval, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			out, err := inst.Process(ctx, enginetest.NewEvent(fmt.Sprintf("id-%d", i), "slow", map[string]any{"i": i}, ""))
			if err != nil {
				errs[i] = err
				return
			}
			if len(out) != 1 {
				errs[i] = fmt.Errorf("%d outputs", len(out))
				return
			}
			var d struct{ Enter, Exit, Pid float64 }
			if err := out[0].DataAs(&d); err != nil {
				errs[i] = err
				return
			}
			ivs[i] = interval{d.Enter, d.Exit, d.Pid}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("calls: %v", err)
	}
	return ivs
}

func TestAsyncWorkerOverlapsEvents(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, asyncSleeper)
	if got := inst.(engines.Concurrent).MaxCalls(); got != python.DefaultMaxConcurrency {
		t.Errorf("MaxCalls = %d, want %d", got, python.DefaultMaxConcurrency)
	}
	ivs := runAtOnce(t, inst, 16)
	if got := maxOverlap(ivs); got < 8 {
		t.Fatalf("at most %d of 16 async events ran at the same time, want at least 8: %v", got, ivs)
	}
	pids := map[float64]bool{}
	for _, iv := range ivs {
		pids[iv.pid] = true
	}
	if len(pids) != 1 {
		t.Errorf("async events ran in %d processes, want 1", len(pids))
	}
}

func TestAsyncWorkerConcurrencyBound(t *testing.T) {
	e := newEngine(t, python.Config{})
	spec := testSpec
	spec.MaxConcurrency = 3
	inst := load(t, e, spec, asyncSleeper)
	ivs := runAtOnce(t, inst, 12)
	if got := maxOverlap(ivs); got > 3 || got < 2 {
		t.Fatalf("%d events ran at the same time with max_concurrency 3, want 2..3", got)
	}
}

func TestAsyncWorkerOneAtATime(t *testing.T) {
	// MaxConcurrency 1 (and one process): the runner awaits each event as before.
	e := newEngine(t, python.Config{MaxConcurrency: 1, MaxProcesses: 1})
	inst := load(t, e, testSpec, asyncSleeper)
	if got := maxOverlap(runAtOnce(t, inst, 4)); got != 1 {
		t.Fatalf("%d events ran at the same time with max concurrency 1, want 1", got)
	}
}

func TestDefWorkerGetsMoreProcesses(t *testing.T) {
	e := newEngine(t, python.Config{})
	spec := testSpec
	spec.MaxProcesses = 4
	inst := load(t, e, spec, defSleeper)
	// The first burst starts the extra processes (a start takes longer
	// than some of the 30 ms events, so that burst may overlap fewer); the
	// second finds them running.
	runAtOnce(t, inst, 16)
	if got := python.LiveProcesses(inst); got != 4 {
		t.Fatalf("%d processes after the first burst, want 4", got)
	}
	ivs := runAtOnce(t, inst, 16)
	if got := maxOverlap(ivs); got != 4 {
		t.Fatalf("%d plain def events ran at the same time with max_processes 4, want 4: %v", got, ivs)
	}
	pids := map[float64]bool{}
	for _, iv := range ivs {
		pids[iv.pid] = true
	}
	if len(pids) != 4 {
		t.Errorf("events ran in %d processes, want 4", len(pids))
	}
}

func TestExtraProcessesRetireWhenIdle(t *testing.T) {
	e := newEngine(t, python.Config{IdleRetire: 50 * time.Millisecond})
	spec := testSpec
	spec.MaxProcesses = 3
	inst := load(t, e, spec, defSleeper)
	pids := map[float64]bool{}
	// Bursts until one shows a second process: on a loaded machine a
	// runner's start may outlast a whole burst, which then ran on the first.
	for burst := 0; burst < 10 && len(pids) < 2; burst++ {
		for _, iv := range runAtOnce(t, inst, 12) {
			pids[iv.pid] = true
		}
	}
	if len(pids) < 2 {
		t.Fatalf("10 bursts ran in %d processes, want more than 1", len(pids))
	}
	deadline := time.Now().Add(10 * time.Second)
	for python.LiveProcesses(inst) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d live processes 10s after the burst, want 1 (idle ones retired)", python.LiveProcesses(inst))
		}
		python.WaitRetireTick(inst)
	}
	// The one left still serves.
	if out := mustCall(t, inst, jsonEvent("after", nil)); len(out) != 1 {
		t.Fatalf("outputs after retiring = %v", out)
	}
}

func TestAsyncTimeoutFailsAlone(t *testing.T) {
	e := newEngine(t, python.Config{})
	spec := testSpec
	spec.Timeout = 300 * time.Millisecond
	inst := load(t, e, spec, `
import asyncio, time, os

async def process(event):
    if event["type"] == "hang":
        await asyncio.sleep(3600)
    enter = time.time()
    await asyncio.sleep(0.03)
    return {"type": "slow.done", "data": {"enter": enter, "exit": time.time(), "pid": os.getpid()}}
`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hung := make(chan error, 1)
	go func() {
		_, err := inst.Process(ctx, enginetest.NewEvent("id-hang", "hang", nil, ""))
		hung <- err
	}()
	ivs := runAtOnce(t, inst, 4)
	if err := <-hung; !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("hanging call: err = %v, want ErrTimeout", err)
	}
	// The others ran in the same process, which still serves.
	out := mustCall(t, inst, enginetest.NewEvent("id-after", "slow", nil, ""))
	var d struct{ Pid float64 }
	if err := out[0].DataAs(&d); err != nil {
		t.Fatal(err)
	}
	if d.Pid != ivs[0].pid {
		t.Errorf("after the timeout the pid changed (%v -> %v): the runner was replaced", ivs[0].pid, d.Pid)
	}
}

func TestAsyncBlockedLoopKillsRunner(t *testing.T) {
	e := newEngine(t, python.Config{CancelGrace: 100 * time.Millisecond})
	spec := testSpec
	spec.Timeout = 300 * time.Millisecond
	inst := load(t, e, spec, `
import asyncio, time

async def process(event):
    if event["type"] == "block":
        time.sleep(3600)  # blocks the event loop: cancellation cannot end it
    return {"type": "ok"}
`)
	_, err := call(t, inst, enginetest.NewEvent("id-block", "block", nil, ""))
	if !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("blocking call: err = %v, want ErrTimeout", err)
	}
	// The runner is killed and replaced: the next call is served.
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := call(t, inst, jsonEvent("ok", nil))
		if err == nil && len(out) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no call served after the blocked runner was killed: %v", err)
		}
	}
}

func TestAsyncGatewayCallsOverlap(t *testing.T) {
	gw := &slowGateway{delay: 30 * time.Millisecond}
	e := newEngine(t, python.Config{Gateway: gw})
	inst := load(t, e, testSpec, `
import time, os
import virtufin_host

async def process(event):
    enter = time.time()
    got = await virtufin_host.call_gateway_async("svc", "m", event["data"])
    sync = virtufin_host.call_gateway("svc", "m", "x")
    return {"type": "slow.done", "data": {"enter": enter, "exit": time.time(), "pid": os.getpid(), "got": got.decode(), "sync": sync.decode()}}
`)
	ivs := runAtOnce(t, inst, 8)
	if got := maxOverlap(ivs); got < 4 {
		t.Fatalf("at most %d of 8 events awaiting gateway calls overlapped, want at least 4", got)
	}
}

// slowGateway answers every call after delay with its request.
type slowGateway struct{ delay time.Duration }

func (g *slowGateway) Call(ctx context.Context, service, method string, req []byte) ([]byte, error) {
	select {
	case <-time.After(g.delay):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return req, nil
}

var _ = event.New
