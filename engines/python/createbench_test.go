package python_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// BenchmarkPythonCreateOnSpares is what a node does for a create with a
// spare runner ready and idle (the strict sandbox, 300 ms between creates):
// Check, Load, the first call; the baseline of the native and .NET
// engines' CreateOnSpares benchmarks.
func BenchmarkPythonCreateOnSpares(b *testing.B) {
	e := newEngine(b, python.Config{Sandbox: sandboxtest.Strict(b), Spares: 2})
	ctx := context.Background()
	ev := enginetest.NewEvent("bench-1", "bench", map[string]any{"x": 1}, "corr")
	var check, load, call time.Duration
	i := 0
	create := func() {
		i++
		spec := engines.Spec{WorkerID: fmt.Sprintf("w%d", i), MIMEType: python.MIMEType}
		code := []byte(benchEcho)
		t0 := time.Now()
		if err := e.Check(ctx, spec, code); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		inst, err := e.Load(ctx, spec, code)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		if _, err := inst.Process(ctx, ev); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		check, load, call = check+t1.Sub(t0), load+t2.Sub(t1), call+t3.Sub(t2)
		b.StopTimer()
		inst.Close(ctx)
		b.StartTimer()
	}
	create()
	check, load, call = 0, 0, 0
	for b.Loop() {
		b.StopTimer()
		time.Sleep(300 * time.Millisecond)
		b.StartTimer()
		create()
	}
	n := float64(b.N)
	b.ReportMetric(float64(check.Microseconds())/n/1000, "check-ms")
	b.ReportMetric(float64(load.Microseconds())/n/1000, "load-ms")
	b.ReportMetric(float64(call.Microseconds())/n/1000, "first-call-ms")
}
