package python_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
)

// batchWorker holds its process on a "gate" event until the test opens the
// gate, so that the calls made meanwhile queue up and go as one batch.
const batchWorker = `
import json, os, time
import virtufin_host

def process(event):
    d = event.get("data") or {}
    if event["type"] == "pid":
        return {"type": "pid", "data": {"pid": os.getpid()}}
    if "gate" in d:
        open(d["gate"] + ".in", "w").close()
        while not os.path.exists(d["gate"] + ".go"):
            time.sleep(0.002)
        return None
    n = d["n"]
    if d.get("hang"):
        while True:
            time.sleep(3600)
    if d.get("crash"):
        os._exit(3)
    if d.get("gateway"):
        resp = virtufin_host.call_gateway("billing", "charge", {"n": n})
        return {"type": "charged", "data": json.loads(resp)}
    if n % 5 == 0:
        raise ValueError("bad %d" % n)
    return {"type": "echo", "data": {"n": n}}
`

type batchResult struct {
	out []event.Event
	err error
}

// runQueued holds inst's process with a gate event, makes one call per
// event with one shared ctx, waits until all of them queue, opens the gate
// and returns each call's result.
func runQueued(t *testing.T, inst engines.Instance, evs []*event.Event) []batchResult {
	return runQueuedWith(t, inst, evs, false)
}

// runQueuedWith is runQueued; with ownCtx each call has a ctx of its own.
func runQueuedWith(t *testing.T, inst engines.Instance, evs []*event.Event, ownCtx bool) []batchResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gate, gateDone := holdProcess(t, ctx, inst)
	res := make([]batchResult, len(evs))
	var wg sync.WaitGroup
	for i, ev := range evs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := ctx
			if ownCtx {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			res[i].out, res[i].err = inst.Process(ctx, ev)
		}()
	}
	enginetest.WaitFor(t, "every call to queue", func() bool { return python.Waiting(inst) == len(evs) })
	if err := os.WriteFile(gate+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-gateDone; err != nil {
		t.Fatalf("gate event: %v", err)
	}
	wg.Wait()
	return res
}

// holdProcess runs the gate event, which holds the process until
// gate+".go" exists; gateDone reports the call's error.
func holdProcess(t *testing.T, ctx context.Context, inst engines.Instance) (gate string, gateDone <-chan error) {
	t.Helper()
	gate = filepath.Join(t.TempDir(), "gate")
	done := make(chan error, 1)
	go func() {
		_, err := inst.Process(ctx, jsonEvent("gate", map[string]any{"gate": gate}))
		done <- err
	}()
	enginetest.WaitFor(t, "the gate event to run", func() bool { _, err := os.Stat(gate + ".in"); return err == nil })
	return gate, done
}

func numbered(n int, extra map[int]map[string]any) []*event.Event {
	evs := make([]*event.Event, n)
	for i := range evs {
		d := map[string]any{"n": i + 1}
		for k, v := range extra[i+1] {
			d[k] = v
		}
		evs[i] = jsonEvent(fmt.Sprintf("n%d", i+1), d)
	}
	return evs
}

func echoed(t *testing.T, r batchResult) int {
	t.Helper()
	if r.err != nil || len(r.out) != 1 || r.out[0].Type() != "echo" {
		t.Fatalf("want one echo output, got %v, %v", r.out, r.err)
	}
	var d struct{ N int }
	if err := json.Unmarshal(r.out[0].Data(), &d); err != nil {
		t.Fatal(err)
	}
	return d.N
}

// Calls that queue for one process go in one batch, and each caller gets
// its own outputs or its own exception.
func TestBatchKeepsEachCallsOutcome(t *testing.T) {
	e := newEngine(t, python.Config{MaxProcesses: 1, MaxBatch: 8, SlowEvent: time.Minute})
	inst := load(t, e, testSpec, batchWorker)
	pid := pidOf(t, inst)
	res := runQueued(t, inst, numbered(20, nil))
	if pidOf(t, inst) != pid {
		t.Errorf("the worker process was replaced during the batches")
	}
	for i, r := range res {
		n := i + 1
		if n%5 == 0 {
			var pe *python.Error
			if !errors.As(r.err, &pe) || !errors.Is(r.err, engines.ErrWorkerFailed) || pe.Message != fmt.Sprintf("bad %d", n) {
				t.Errorf("call %d: want its own ValueError, got %v, %v", n, r.out, r.err)
			}
			continue
		}
		if got := echoed(t, r); got != n {
			t.Errorf("call %d got the output of call %d", n, got)
		}
	}
	// 20 queued calls at most 8 at a time: at least 3 batches of two or more.
	if b := python.BatchedCalls(inst); b != 20 {
		t.Errorf("%d calls went in batches, want all 20", b)
	}
	// The process serves single calls after batches.
	if got := echoed(t, batchResult{out: mustCall(t, inst, jsonEvent("one", map[string]any{"n": 7}))}); got != 7 {
		t.Fatalf("single call after batches: %d", got)
	}
}

// A hang or a crash inside a batch fails the call that caused it, and only
// that one: the others are answered (run again alone if their answer was
// lost with the process).
func TestBatchFailureIsTheFailingCallsOnly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra map[string]any
		want  error
		text  string
	}{
		{"hang", map[string]any{"hang": true}, engines.ErrTimeout, "timed out after 1s"},
		{"crash", map[string]any{"crash": true}, engines.ErrWorkerFailed, "exited during the call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, python.Config{MaxProcesses: 1, MaxBatch: 8, SlowEvent: time.Minute})
			spec := testSpec
			spec.Timeout = time.Second
			inst := load(t, e, spec, batchWorker)
			res := runQueued(t, inst, numbered(6, map[int]map[string]any{3: tc.extra}))
			for i, r := range res {
				n := i + 1
				switch {
				case n == 3:
					if !errors.Is(r.err, tc.want) || !strings.Contains(r.err.Error(), tc.text) {
						t.Errorf("call %d: want %v (%q), got %v, %v", n, tc.want, tc.text, r.out, r.err)
					}
				case n == 5:
					if r.err == nil || !strings.Contains(r.err.Error(), "bad 5") {
						t.Errorf("call %d: want its own ValueError, got %v, %v", n, r.out, r.err)
					}
				default:
					if got := echoed(t, r); got != n {
						t.Errorf("call %d got the output of call %d", n, got)
					}
				}
			}
			if got := echoed(t, batchResult{out: mustCall(t, inst, jsonEvent("one", map[string]any{"n": 7}))}); got != 7 {
				t.Fatalf("single call after the failure: %d", got)
			}
		})
	}
}

// Gateway calls made inside a batch answer the event that made them.
func TestBatchGatewayCalls(t *testing.T) {
	gw := &fakeGateway{}
	e := newEngine(t, python.Config{MaxProcesses: 1, Gateway: gw, MaxBatch: 8, SlowEvent: time.Minute})
	spec := testSpec
	spec.GatewayTargets = []string{"billing/*"}
	inst := load(t, e, spec, batchWorker)
	pid := pidOf(t, inst)
	evs := numbered(6, map[int]map[string]any{2: {"gateway": true}, 3: {"gateway": true}, 6: {"gateway": true}})
	res := runQueued(t, inst, evs)
	if pidOf(t, inst) != pid {
		t.Errorf("the worker process was replaced during the batch")
	}
	for i, r := range res {
		n := i + 1
		switch n {
		case 2, 3, 6:
			want := fmt.Sprintf(`{"charged":{"n":%d}}`, n)
			if r.err != nil || len(r.out) != 1 || r.out[0].Type() != "charged" || string(r.out[0].Data()) != want {
				t.Errorf("call %d: want %s, got %v, %v", n, want, r.out, r.err)
			}
		case 5:
			if r.err == nil {
				t.Errorf("call 5: want its ValueError")
			}
		default:
			if got := echoed(t, r); got != n {
				t.Errorf("call %d got the output of call %d", n, got)
			}
		}
	}
	if b := python.BatchedCalls(inst); b != 6 {
		t.Errorf("%d calls went in batches, want 6", b)
	}
}

// Calls with different contexts never share a batch (a cancellation ends
// exactly its own calls).
func TestBatchOnlySharedContexts(t *testing.T) {
	e := newEngine(t, python.Config{MaxProcesses: 1, MaxBatch: 8, SlowEvent: time.Minute})
	inst := load(t, e, testSpec, batchWorker)
	for i, r := range runQueuedWith(t, inst, numbered(4, nil), true) {
		if got := echoed(t, r); got != i+1 {
			t.Errorf("call %d got %d", i+1, got)
		}
	}
	if b := python.BatchedCalls(inst); b != 0 {
		t.Errorf("own contexts: %d calls batched", b)
	}
}

// After a slow event (the gate holds the process longer than SlowEvent),
// the next call goes alone: a batch of slow events would hold a
// stopping worker for their sum. The tests above set SlowEvent high: their
// gate is not a slow worker.
func TestSlowEventsAreNotBatched(t *testing.T) {
	e := newEngine(t, python.Config{MaxProcesses: 1, MaxBatch: 8})
	inst := load(t, e, testSpec, batchWorker)
	for i, r := range runQueuedWith(t, inst, numbered(4, nil), false) {
		if got := echoed(t, r); got != i+1 {
			t.Errorf("call %d got %d", i+1, got)
		}
	}
	// The first call after the gate went alone; after that fast one, the
	// rest may batch again (all 4 would be one batch without the rule).
	if b := python.BatchedCalls(inst); b > 3 {
		t.Errorf("after a slow event: %d calls batched, want the first alone", b)
	}
}

// MaxBatch 1 turns batching off.
func TestBatchOff(t *testing.T) {
	e := newEngine(t, python.Config{MaxProcesses: 1, MaxBatch: 1})
	inst := load(t, e, testSpec, batchWorker)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for n := 1; n <= 8; n++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := inst.Process(ctx, jsonEvent("n", map[string]any{"n": n}))
			if n%5 == 0 {
				if err == nil {
					t.Errorf("call %d: want its ValueError", n)
				}
			} else if got := echoed(t, batchResult{out, err}); got != n {
				t.Errorf("call %d got %d", n, got)
			}
		}()
	}
	wg.Wait()
	if b := python.BatchedCalls(inst); b != 0 {
		t.Errorf("MaxBatch 1: %d calls batched", b)
	}
	if f := inst.(engines.Batcher).CallsToFill(); f != 0 {
		t.Errorf("MaxBatch 1: CallsToFill %d, want 0", f)
	}
}

// The dispatcher lets a worker hold two batches per process at once: one in
// the runners, one filling (engines.Batcher).
func TestCallsToFill(t *testing.T) {
	for _, c := range []struct{ processes, batch, want int }{
		{0, 0, 2 * python.DefaultMaxBatch}, // the defaults: one process, batches of 16
		{2, 8, 32},
	} {
		e := newEngine(t, python.Config{Processes: c.processes, MaxProcesses: c.processes, MaxBatch: c.batch})
		inst := load(t, e, testSpec, batchWorker)
		if f := inst.(engines.Batcher).CallsToFill(); f != c.want {
			t.Errorf("Processes %d, MaxBatch %d: CallsToFill %d, want %d", c.processes, c.batch, f, c.want)
		}
	}
}

// Calls still waiting for the process come back with ErrGivenBack once
// their give-back channel closes; the running call finishes, and a later
// batch never takes a given-back call along.
func TestWaitingCallsAreGivenBack(t *testing.T) {
	e := newEngine(t, python.Config{MaxProcesses: 1, MaxBatch: 8, SlowEvent: time.Minute})
	inst := load(t, e, testSpec, batchWorker)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gate, gateDone := holdProcess(t, ctx, inst)

	giveBack := make(chan struct{})
	gctx := engines.WithGiveBack(ctx, giveBack)
	const n = 4
	errs := make(chan error, n)
	for i := 1; i <= n; i++ {
		go func() {
			_, err := inst.Process(gctx, jsonEvent("n", map[string]any{"n": i}))
			errs <- err
		}()
	}
	enginetest.WaitFor(t, "every call to queue", func() bool { return python.Waiting(inst) == n })
	close(giveBack)
	for range n {
		if err := <-errs; !errors.Is(err, engines.ErrGivenBack) {
			t.Fatalf("waiting call: %v, want ErrGivenBack", err)
		}
	}
	if err := os.WriteFile(gate+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-gateDone; err != nil {
		t.Fatalf("the running call: %v", err)
	}
	if b := python.BatchedCalls(inst); b != 0 {
		t.Errorf("%d given-back calls were batched", b)
	}
	// The process serves the next call as usual.
	out, err := inst.Process(ctx, jsonEvent("n", map[string]any{"n": 9}))
	if got := echoed(t, batchResult{out, err}); got != 9 {
		t.Fatalf("after the give-back: got %d", got)
	}
}

// A fast worker whose calls keep more than one runner's batches full (a
// backlog, not a burst) gets a second process, up to its maximum, as a
// slow worker does; a burst of a few batches does not start one.
func TestSaturatedFastWorkerGetsASecondProcess(t *testing.T) {
	e := newEngine(t, python.Config{Processes: 1, MaxProcesses: 2, MaxBatch: 8, SlowEvent: time.Minute, IdleRetire: time.Minute})
	inst := load(t, e, testSpec, batchWorker)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A burst: 24 calls queued behind a held process, three batches.
	runQueued(t, inst, numbered(24, nil))
	if n := python.LiveProcesses(inst); n != 1 {
		t.Fatalf("after a burst of 24 calls: %d processes, want 1", n)
	}
	// A backlog: 32 callers that call again as soon as they are answered.
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				if _, err := inst.Process(ctx, jsonEvent("n", map[string]any{"n": 1 + 5*(i*100000+n)})); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	enginetest.WaitFor(t, "a second process for the saturated worker", func() bool { return python.LiveProcesses(inst) == 2 })
	stop.Store(true)
	wg.Wait()
}
