package wasm

import (
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// The example workers of examples/wasm, built with their toolchains and
// run through the engine.

func TestExampleCGreeter(t *testing.T) {
	code := buildC(t, filepath.Join(repoRoot(t), "examples", "wasm", "c-greeter", "worker.c"))
	e := newTestEngine(t, Config{})
	rec := &recorder{}
	spec := testSpec("c-greeter", roomy)
	spec.Logger = slog.New(rec)
	inst := load(t, e, spec, code)
	ev := enginetest.NewEvent("n-1", "name", map[string]any{"name": "Ada"}, "c-7")
	out, err := inst.Process(bg(t), ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || out[0].Type() != "greeting" || out[0].Subject() != "n-1" || out[0].Extensions()["correlationid"] != "c-7" {
		t.Fatalf("outputs = %v", out)
	}
	if got, want := string(out[0].Data()), `{"hello":{"name":"Ada"},"worker":"wasm-c-greeter"}`; got != want {
		t.Errorf("data = %s, want %s", got, want)
	}
	if _, ok := rec.lines()["greeting event n-1"]; !ok {
		t.Errorf("log lines %v, want \"greeting event n-1\"", rec.lines())
	}
	_, err = inst.Process(bg(t), enginetest.NewEvent("n-2", "name", nil, ""))
	if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "no data to greet") {
		t.Fatalf("Process(no data) = %v", err)
	}
}

func TestExampleGoPricer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go module for wasip1 (seconds)")
	}
	code := buildGo(t, filepath.Join(repoRoot(t), "examples", "wasm", "go-pricer"))
	e := newTestEngine(t, Config{})
	rec := &recorder{}
	spec := testSpec("go-pricer", roomy)
	spec.Logger = slog.New(rec)
	inst := load(t, e, spec, code)
	for i := range 3 {
		ev := enginetest.NewEvent("o-1", "order.placed", map[string]any{"items": []any{
			map[string]any{"sku": "a", "price": 2, "qty": 3}, map[string]any{"sku": "b", "price": 1.5}}}, "c-42")
		out, err := inst.Process(bg(t), ev)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		m := enginetest.DataOf(t, out)
		if out[0].Type() != "order.priced" || out[0].Extensions()["correlationid"] != "c-42" || m["total"] != 7.5 ||
			m["order_id"] != "o-1" || m["priced_by"] != "wasm-go-pricer" {
			t.Fatalf("call %d: output %v with data %v", i, out[0], m)
		}
	}
	if _, ok := rec.lines()["priced order o-1: 2 items, total 7.5"]; !ok {
		t.Errorf("log lines %v", rec.lines())
	}
	// An item without a price fails the attempt with the handler's error.
	_, err := inst.Process(bg(t), enginetest.NewEvent("o-2", "order.placed", map[string]any{"items": []any{map[string]any{"sku": "x"}}}, ""))
	if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), `item "x" has no price`) {
		t.Fatalf("Process(no price) = %v", err)
	}
}
