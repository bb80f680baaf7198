//go:build linux || darwin || freebsd

package native

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// ProcessLent (engines.Lender, in process): the outputs are Process's, read
// out of the worker's response buffer, which FreeResult frees only when
// the loan comes back — once, and not before, on a goroutine of its own (one
// that hangs does not hold the caller); a call without outputs, a failed
// one and one abandoned at its deadline lend nothing and free their
// buffer at once; Close does not unload the library under a loan.
func TestLentOutputsStayUntilTheLoanComesBack(t *testing.T) {
	ctx := context.Background()
	e := newTestEngine(t, Config{})
	inst, err := e.Load(ctx, testSpec, packageOf(t, flagsEcho, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inst.Close(context.Background()) })
	lender, ok := inst.(engines.Lender)
	if !ok {
		t.Fatal("the in-process instance does not lend its outputs")
	}
	// outstanding is how many response buffers the worker handed out and
	// FreeResult has not freed yet.
	outstanding := func() float64 {
		t.Helper()
		got := enginetest.DataOf(t, mustCall(t, inst, typed("test.stats", nil)))
		return got["allocs"].(float64) - got["frees"].(float64)
	}
	// freed waits until every buffer handed out is freed (a returned
	// loan's FreeResult runs on a goroutine of its own, soon after Return).
	freed := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); outstanding() != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v buffers never freed", what, outstanding())
			}
		}
	}
	in := enginetest.NewEvent("e-1", enginetest.TypeRequest, map[string]any{"a": 1}, "corr")
	want := mustCall(t, inst, in)
	outs, loan, err := lender.ProcessLent(ctx, in)
	if err != nil || loan == nil || len(outs) != len(want) {
		t.Fatalf("ProcessLent = %d outputs, loan %v, %v; want %d outputs and a loan", len(outs), loan, err, len(want))
	}
	for i := range want {
		if outs[i].Type() != want[i].Type() || string(outs[i].Data()) != string(want[i].Data()) {
			t.Fatalf("lent output %d = %s %q, Process gave %s %q", i, outs[i].Type(), outs[i].Data(), want[i].Type(), want[i].Data())
		}
	}
	if n := outstanding(); n != 1 {
		t.Fatalf("%v buffers not freed while the loan is out, want 1", n)
	}
	loan.Return()
	freed("after the loan came back")

	// Nothing to lend: no outputs, a worker failure, an error answer
	// without outputs.
	for _, typ := range []string{"test.log", "test.code", "test.codemsg", "test.answer"} {
		outs, loan, err := lender.ProcessLent(ctx, typed(typ, nil))
		if loan != nil || len(outs) != 0 {
			t.Fatalf("%s: %d outputs and loan %v (%v), want none", typ, len(outs), loan, err)
		}
		if n := outstanding(); n != 0 {
			t.Fatalf("%s: %v buffers not freed, want 0", typ, n)
		}
	}
	// An error answer with its own response lends it.
	_, loan, err = lender.ProcessLent(ctx, typed("test.answerwith", nil))
	var answer *engines.ErrorAnswer
	if !errors.As(err, &answer) || len(answer.Outputs) != 1 || answer.Outputs[0].Type() != "test.refused" || loan == nil {
		t.Fatalf("answerwith: %v, loan %v; want an error answer with its response, lent", err, loan)
	}
	loan.Return()
	freed("answerwith")
	// A call abandoned at its deadline: nobody takes its outputs, its
	// buffer is freed when the native code returns.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, loan, err = lender.ProcessLent(short, typed("test.sleep", 300))
	cancel()
	if err == nil || loan != nil {
		t.Fatalf("abandoned call: %v, loan %v; want an error and no loan", err, loan)
	}
	freed("the abandoned call")

	// The worker's FreeResult runs on a goroutine of its own: one that hangs
	// holds that goroutine, not the caller returning the loan.
	_, loan, err = lender.ProcessLent(ctx, typed("test.hangfree", nil))
	if err != nil || loan == nil {
		t.Fatalf("hangfree: %v, loan %v", err, loan)
	}
	start := time.Now()
	loan.Return()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Return waited %v for a FreeResult that hangs", took)
	}
	mustCall(t, inst, typed("test.unhang", nil)) // no output: nothing to free
	freed("the FreeResult that hung")

	// Close waits for a loan: the library stays loaded and the outputs
	// readable until it comes back.
	outs, loan, err = lender.ProcessLent(ctx, in)
	if err != nil || loan == nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = inst.Close(cctx)
	cancel()
	if err == nil {
		t.Fatal("Close returned with a loan out")
	}
	if string(outs[0].Data()) != string(want[0].Data()) {
		t.Fatalf("lent output read during Close = %q, want %q", outs[0].Data(), want[0].Data())
	}
	loan.Return()
	cctx, cancel = context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := inst.Close(cctx); err != nil {
		t.Fatalf("Close after the loan came back: %v", err)
	}
}
