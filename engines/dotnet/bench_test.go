package dotnet

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// The numbers behind README.md's trade-off against hosting CoreCLR in
// the node: a call's round trip through the host process, what starting a
// host costs, what compiling a C# worker costs, and a host's memory.

func reportLatencies(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	pct := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

func BenchmarkDotnetRoundTrip1KiB(b *testing.B) { benchRoundTrip(b, Config{}) }

// BenchmarkDotnetRoundTrip1KiBSandboxed adds every OS layer and the
// host's lockdown filter.
func BenchmarkDotnetRoundTrip1KiBSandboxed(b *testing.B) {
	benchRoundTrip(b, Config{Sandbox: sandboxtest.Strict(b)})
}

func benchRoundTrip(b *testing.B, cfg Config) {
	e := newTestEngine(b, cfg)
	ctx := context.Background()
	inst, err := e.Load(ctx, engines.Spec{WorkerID: "bench", MIMEType: MIMESource}, fixture(b, "echo"))
	if err != nil {
		b.Fatal(err)
	}
	defer inst.Close(ctx)
	ev := enginetest.NewEvent("bench-1", "bench", map[string]any{"pad": strings.Repeat("x", 1000)}, "corr")
	for range 200 { // JIT the paths first
		if _, err := inst.Process(ctx, ev); err != nil {
			b.Fatal(err)
		}
	}
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := inst.Process(ctx, ev); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportLatencies(b, lat)
	b.ReportMetric(hostRSS(b, inst), "host-RSS-MiB")
}

// hostRSS is the resident memory of the instance's host process (the
// sandbox's bwrap and prlimit wrappers excluded: the last process of the
// chain is mono).
func hostRSS(b *testing.B, inst engines.Instance) float64 {
	in := inst.(*Instance)
	s, err := in.pool.Acquire(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer in.pool.Release(s)
	p, err := in.pool.Proc(context.Background(), s)
	if err != nil {
		b.Fatal(err)
	}
	pid := p.Pid
	for { // descend to the innermost child (bwrap → mono)
		kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		f := strings.Fields(string(kids))
		if err != nil || len(f) == 0 {
			break
		}
		pid, _ = strconv.Atoi(f[0])
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return float64(kb) / 1024
		}
	}
	return 0
}

// BenchmarkDotnetStartup is one Check of compiled code: start a host, load
// the worker's assembly, stop it.
func BenchmarkDotnetStartup(b *testing.B) {
	e := newTestEngine(b, Config{})
	ctx := context.Background()
	spec := engines.Spec{WorkerID: "bench", MIMEType: MIMESource}
	if err := e.Check(ctx, spec, fixture(b, "echo")); err != nil { // compiled once
		b.Fatal(err)
	}
	for b.Loop() {
		if err := e.Check(ctx, spec, fixture(b, "echo")); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDotnetCompile compiles a new C# source each time: Mcs starts
// the compiler for it, Spare takes a warm spare compiler (the wait for the
// next one to be warm is not timed).
func BenchmarkDotnetCompile(b *testing.B) {
	for _, spare := range []bool{false, true} {
		name := "Mcs"
		if spare {
			name = "Spare"
		}
		b.Run(name, func(b *testing.B) {
			cfg := Config{}
			if spare {
				cfg.SpareCompilers = 1
			}
			e := newTestEngine(b, cfg)
			b.Cleanup(func() { _ = e.Close() })
			ctx := context.Background()
			rt, err := e.runtimeFor(ctx)
			if err != nil {
				b.Fatal(err)
			}
			src := fixture(b, "echo")
			i := 0
			compile := func() {
				i++
				if _, err := rt.compile(ctx, b.TempDir(), append(src, fmt.Sprintf("\n// %d %d\n", i, time.Now().UnixNano())...), e.compilerFor(engines.Spec{WorkerID: "bench"})); err != nil {
					b.Fatal(err)
				}
			}
			if spare {
				compile() // starts the first spare
			}
			for b.Loop() {
				if spare {
					b.StopTimer()
					for len(e.compilers.Ready()) == 0 {
						time.Sleep(2 * time.Millisecond)
					}
					b.StartTimer()
				}
				compile()
			}
		})
	}
}

// BenchmarkDotnetCreateOnSpares is what a node does for a create of new
// C# source with its spares ready (a spare compiler and a spare host, the
// strict sandbox): Check (compile, a host loads the assembly), Load (takes
// that host), the first call. The wait for the next spares is not timed.
func BenchmarkDotnetCreateOnSpares(b *testing.B) {
	e := newTestEngine(b, Config{SpareCompilers: 1, Spares: 1, Sandbox: sandboxtest.Strict(b)})
	b.Cleanup(func() { _ = e.Close() })
	enginetest.BenchCreate(b, e, func(i int) (engines.Spec, []byte) {
		return engines.Spec{WorkerID: fmt.Sprintf("w%d", i), MIMEType: MIMESource},
			unique(fixture(b, "echo"), fmt.Sprintf("%d %d", i, time.Now().UnixNano()))
	}, func() {
		for len(e.compilers.Ready()) == 0 || len(e.spares.Ready()) == 0 {
			time.Sleep(2 * time.Millisecond)
		}
	})
}
