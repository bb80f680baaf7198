package enginetest

import (
	"context"
	"encoding/json"
	"os"
	"runtime"
	"runtime/metrics"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
)

// WaitFor polls cond until it holds, failing the test after 30 s with
// what it waited for: engines' tests wait on conditions, not for times.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Load loads code with a bounded context and closes the instance when the
// test ends. Engines' own tests use it for what the suite does not cover.
func Load(t testing.TB, e engines.Engine, spec engines.Spec, code []byte) engines.Instance {
	t.Helper()
	// A bound for a hang: the product gives a .NET load 120 s (a first load
	// compiles the worker host with Mono, which took over 30 s on a starved
	// machine: CI-like run 32).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inst, err := e.Load(ctx, spec, code)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		inst.Close(ctx)
	})
	return inst
}

// BenchEvent1KiB is the input of every engine's round-trip benchmark: a
// CloudEvent whose JSON data is exactly 1 KiB, with a correlationid.
func BenchEvent1KiB(tb testing.TB) *event.Event {
	tb.Helper()
	ev := event.New()
	ev.SetID("bench-1")
	ev.SetSource("/bench")
	ev.SetType("bench.request")
	ev.SetExtension("correlationid", "corr-bench")
	data := map[string]string{"payload": strings.Repeat("x", 1024-len(`{"payload":""}`))}
	if err := ev.SetData(event.ApplicationJSON, data); err != nil {
		tb.Fatal(err)
	}
	if len(ev.Data()) != 1024 {
		tb.Fatalf("data is %d bytes", len(ev.Data()))
	}
	return &ev
}

// DataOf decodes the JSON data of the single output in out.
func DataOf(t testing.TB, out []event.Event) map[string]any {
	t.Helper()
	if len(out) != 1 {
		t.Fatalf("got %d outputs, want 1", len(out))
	}
	var m map[string]any
	if err := json.Unmarshal(out[0].Data(), &m); err != nil {
		t.Fatalf("output data %q: %v", out[0].Data(), err)
	}
	return m
}

// HeapDuring runs f and returns what the heap allocated meanwhile (an
// upper bound of how far the heap's peak rose) and the peak of the heap's
// objects a sampler saw above where they were before: what the engines'
// reply-memory tests (engines.ReplyMemoryMultiple) measure.
func HeapDuring(f func()) (alloc, peak int64) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() int64 { metrics.Read(sample); return int64(sample[0].Value.Uint64()) }
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	base := read()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			peak = max(peak, read()-base)
			select {
			case <-stop:
				return
			default:
				runtime.Gosched()
			}
		}
	}()
	f()
	close(stop)
	wg.Wait()
	runtime.ReadMemStats(&after)
	return int64(after.TotalAlloc - before.TotalAlloc), peak
}

// MaxOverlap is the most of the intervals [enter, exit) that were open at
// one instant (an exit at the instant of an enter does not overlap it):
// how many calls a worker's own enter/exit times show running at once.
func MaxOverlap(enter, exit []float64) int {
	type edge struct {
		t     float64
		delta int
	}
	edges := make([]edge, 0, 2*len(enter))
	for i := range enter {
		edges = append(edges, edge{enter[i], 1}, edge{exit[i], -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].t != edges[j].t {
			return edges[i].t < edges[j].t
		}
		return edges[i].delta < edges[j].delta
	})
	n, best := 0, 0
	for _, e := range edges {
		n += e.delta
		best = max(best, n)
	}
	return best
}

// MachineBusy is the machine's CPU time so far outside idle and iowait
// (/proc/stat's cpu line, in clock ticks of 10 ms), for benchmarks that
// report the CPU an operation costs the whole machine (its background
// work and other processes included). It skips where there is no
// /proc/stat.
func MachineBusy(tb testing.TB) time.Duration {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Skip("no /proc/stat")
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	var ticks int64
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(f, 10, 64)
		if i != 3 && i != 4 { // idle, iowait
			ticks += n
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
