package enginetest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
)

// BenchCreate times what a node does for a create, b.N times: Check, then
// Load, then the first call of an echo worker, each create closed again
// (untimed). code gives the i-th create's worker and code; ready, when
// set, is waited for (untimed) before each create after the first, which
// warms up and is not counted. It reports check-ms, load-ms and
// first-call-ms per create. WM_BENCH_CALL_GAP (a duration) makes the
// first call wait that long after the load, as on the real stack, where
// the create's answer and the event's publication come between them: what
// the first call then takes is its own, not the next spares' starts beside
// it (.NET: 0.6-1.0 ms after 30 ms, 3-5 ms at once).
func BenchCreate(b *testing.B, e engines.Engine, code func(i int) (engines.Spec, []byte), ready func()) {
	ctx := context.Background()
	gap, _ := time.ParseDuration(os.Getenv("WM_BENCH_CALL_GAP"))
	ev := NewEvent("bench-1", "bench", map[string]any{"x": 1}, "corr")
	var check, load, call time.Duration
	i := 0
	create := func() {
		i++
		spec, src := code(i)
		t0 := time.Now()
		if err := e.Check(ctx, spec, src); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		inst, err := e.Load(ctx, spec, src)
		if err != nil {
			b.Fatal(err)
		}
		if gap > 0 {
			time.Sleep(gap) // counted in load-ms
		}
		t2 := time.Now()
		if _, err := inst.Process(ctx, ev); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		check, load, call = check+t1.Sub(t0), load+t2.Sub(t1), call+t3.Sub(t2)
		b.StopTimer()
		_ = inst.Close(ctx)
		b.StartTimer()
	}
	create()
	check, load, call = 0, 0, 0
	for b.Loop() {
		if ready != nil {
			b.StopTimer()
			ready()
			b.StartTimer()
		}
		create()
	}
	n := float64(b.N)
	b.ReportMetric(float64(check.Microseconds())/n/1000, "check-ms")
	b.ReportMetric(float64(load.Microseconds())/n/1000, "load-ms")
	b.ReportMetric(float64(call.Microseconds())/n/1000, "first-call-ms")
}
