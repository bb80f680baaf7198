//go:build linux

package native

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// BenchmarkNativeCreateOnSpares is what a node does for a create of a
// native package with its spare check host ready and idle (the strict
// sandbox; a spare is ready as soon as its process started, so each create
// waits 300 ms more, untimed, for its runtime to be up): Check, Load, the
// first call; in process and in a host. BenchmarkPythonCreateOnSpares is
// the same for Python.
func BenchmarkNativeCreateOnSpares(b *testing.B) {
	for _, iso := range []Isolation{IsolationInProcess, IsolationProcess} {
		b.Run(string(iso), func(b *testing.B) {
			e := newTestEngine(b, hostConfig(Config{Sandbox: sandboxtest.Strict(b), SpareCheckHosts: 1, Isolation: iso}))
			b.Cleanup(func() { _ = e.Close() })
			ctx := context.Background()
			compileAll(b, flagsEcho)
			code := packageOf(b, flagsEcho, nil)
			ev := enginetest.NewEvent("bench-1", "bench", map[string]any{"x": 1}, "corr")
			var check, load, call time.Duration
			i := 0
			create := func() {
				i++
				spec := testSpec
				spec.WorkerID = fmt.Sprintf("w%d", i)
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
				for len(e.spareHosts.Ready()) == 0 {
					time.Sleep(2 * time.Millisecond)
				}
				time.Sleep(300 * time.Millisecond)
				b.StartTimer()
				create()
			}
			n := float64(b.N)
			b.ReportMetric(float64(check.Microseconds())/n/1000, "check-ms")
			b.ReportMetric(float64(load.Microseconds())/n/1000, "load-ms")
			b.ReportMetric(float64(call.Microseconds())/n/1000, "first-call-ms")
		})
	}
}
