package python_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
)

// edgeWorker: the gate event of batchWorker; "sleep" seconds; "hold": note
// that the event runs (file <hold>-<n>) and wait for <hold>.go.
const edgeWorker = `
import os, time

def process(event):
    d = event.get("data") or {}
    if "gate" in d:
        open(d["gate"] + ".in", "w").close()
        while not os.path.exists(d["gate"] + ".go"):
            time.sleep(0.002)
        return None
    if d.get("hold"):
        open("%s-%d" % (d["hold"], d["n"]), "w").close()
        while not os.path.exists(d["hold"] + ".go"):
            time.sleep(0.002)
    if d.get("sleep"):
        time.sleep(d["sleep"])
    return {"type": "echo", "data": {"n": d["n"], "tag": d.get("tag", "")}}
`

// TestBatchMovesTheDeadlineBeforeDecoding is issue 43's item 12: a batch
// decoded event A's reply before it moved the deadline on to event B, so
// a decode that outlasted A's deadline killed the runner while B ran (B
// failed as a timeout long before its own time was up). B's time starts
// when A's reply is in, whatever the decoding of A's reply takes.
func TestBatchMovesTheDeadlineBeforeDecoding(t *testing.T) {
	e := newEngine(t, python.Config{MaxProcesses: 1, MaxBatch: 8, SlowEvent: time.Minute})
	spec := testSpec
	spec.Timeout = 4 * time.Second
	inst := load(t, e, spec, edgeWorker)
	// A runs 2 s of its 4 s, and its reply takes 2.5 s to decode (past
	// A's deadline, at 4.5 s); B runs 2.5 s, and its deadline is 4 s from
	// A's reply (at 6 s): 1.5 s to spare for a loaded machine.
	python.SlowDecode(t, "slowdecode", 2500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gate, gateDone := holdProcess(t, ctx, inst)
	evs := []map[string]any{{"n": 1, "sleep": 2.0, "tag": "slowdecode"}, {"n": 2, "sleep": 2.5}}
	res := make([]batchResult, len(evs))
	var wg sync.WaitGroup
	for i, d := range evs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].out, res[i].err = inst.Process(ctx, jsonEvent("n", d))
		}()
		// A queues first, so that the batch runs it first.
		enginetest.WaitFor(t, "the call to queue", func() bool { return python.Waiting(inst) == i+1 })
	}
	if err := os.WriteFile(gate+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-gateDone; err != nil {
		t.Fatalf("gate event: %v", err)
	}
	wg.Wait()
	for i, r := range res {
		t.Logf("call %d: %v, %v", i+1, r.out, r.err)
	}
	for i, r := range res {
		if got := echoed(t, r); got != i+1 {
			t.Errorf("call %d got the output of call %d", i+1, got)
		}
	}
	if b := python.BatchedCalls(inst); b != 2 {
		t.Errorf("%d calls went in a batch, want both", b)
	}
}

// TestCallsTakenIntoABatchAreGivenBackAtAStop is issue 43's item 12: the
// calls a batch's leader had taken along but not sent yet (the batch was
// full by bytes) were not given back at a stop: they ran after it, and the
// stop waited for them. Now only the calls already sent finish.
func TestCallsTakenIntoABatchAreGivenBackAtAStop(t *testing.T) {
	e := newEngine(t, python.Config{MaxProcesses: 1, MaxBatch: 8, SlowEvent: time.Minute})
	inst := load(t, e, testSpec, edgeWorker)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gate, gateDone := holdProcess(t, ctx, inst)

	hold := filepath.Join(t.TempDir(), "hold")
	giveBack := make(chan struct{})
	gctx := engines.WithGiveBack(ctx, giveBack)
	pad := strings.Repeat("x", 25<<10) // two events fill a batch (60 KiB)
	const n = 6
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = inst.Process(gctx, jsonEvent("n", map[string]any{"n": i, "hold": hold, "pad": pad}))
		}()
	}
	enginetest.WaitFor(t, "every call to queue", func() bool { return python.Waiting(inst) == n })
	if err := os.WriteFile(gate+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-gateDone; err != nil {
		t.Fatalf("gate event: %v", err)
	}
	// The leader took all n along; the first batch (two of them) runs.
	ran := func() []string { m, _ := filepath.Glob(hold + "-*"); return m }
	enginetest.WaitFor(t, "the first batch to run", func() bool { return len(ran()) > 0 })
	close(giveBack) // the worker stops
	if err := os.WriteFile(hold+".go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	done, given := 0, 0
	for i := 1; i <= n; i++ {
		_, err := os.Stat(hold + "-" + strconv.Itoa(i))
		switch {
		case errs[i] == nil && err == nil:
			done++
		case errors.Is(errs[i], engines.ErrGivenBack) && err != nil:
			given++
		default:
			t.Errorf("call %d: %v (ran: %v), want done or given back unrun", i, errs[i], err == nil)
		}
	}
	if done != 2 || given != n-2 {
		t.Errorf("%d calls ran and %d were given back, want the sent batch (2) to run and %d given back", done, given, n-2)
	}
}
