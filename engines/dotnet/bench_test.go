package dotnet

import (
	"bytes"
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
	// echo: the conformance echo; rich: a worker using LINQ, lambdas, an
	// async method and string interpolation (what a spare's warm-up and
	// preload are for, host/Compiler.cs).
	for _, name := range []string{"echo", "rich"} {
		b.Run(name, func(b *testing.B) {
			e := newTestEngine(b, Config{SpareCompilers: 1, Spares: 1, Sandbox: sandboxtest.Strict(b)})
			b.Cleanup(func() { _ = e.Close() })
			enginetest.BenchCreate(b, e, func(i int) (engines.Spec, []byte) {
				return engines.Spec{WorkerID: fmt.Sprintf("w%d", i), MIMEType: MIMESource},
					unique(fixture(b, name), fmt.Sprintf("%d %d", i, time.Now().UnixNano()))
			}, func() {
				for len(e.compilers.Ready()) == 0 || len(e.spares.Ready()) == 0 {
					time.Sleep(2 * time.Millisecond)
				}
				// A spare waits, as between a node's creates: its
				// preload (host/Compiler.cs) and WarmRich (host/Host.cs)
				// are done by then.
				time.Sleep(spareSettled)
			})
		})
	}
}

// spareSettled is how long the benchmarks let a ready spare wait before
// taking it: a compiler's preload (60–100 ms) runs from the moment it is
// ready, a host's WarmRich (about 45 ms) after 250 ms of waiting.
const spareSettled = 500 * time.Millisecond

// BenchmarkDotnetSpareStart is what one spare costs the node before any
// worker takes it (strict sandbox, nothing else running): the time until
// it is ready (a host's hello, a compiler's ready line) and the CPU of
// its processes (the sandbox's included) until it is ready and, for a
// compiler, its preload done (host/Compiler.cs). A spare's start runs
// beside the calls that took the ones before it.
func BenchmarkDotnetSpareStart(b *testing.B) {
	e := newTestEngine(b, Config{Sandbox: sandboxtest.Strict(b)})
	b.Cleanup(func() { _ = e.Close() })
	if _, err := e.Warm(context.Background()); err != nil {
		b.Fatal(err)
	}
	// Each start returns its process's pid and its retirement.
	starts := map[string]func() (int, func(), error){
		"host": func() (int, func(), error) {
			p, err := e.startSpare()
			if err != nil {
				return 0, nil, err
			}
			return p.Pid, p.Retire, nil
		},
		"compiler": func() (int, func(), error) {
			s, err := e.startSpareCompiler()
			if err != nil {
				return 0, nil, err
			}
			return s.cmd.Process.Pid, s.Retire, nil
		},
	}
	for _, kind := range []string{"host", "compiler"} {
		b.Run(kind, func(b *testing.B) {
			var ready, cpu time.Duration
			for b.Loop() {
				t0 := time.Now()
				pid, retire, err := starts[kind]()
				if err != nil {
					b.Fatal(err)
				}
				ready += time.Since(t0)
				time.Sleep(spareSettled) // a compiler's preload, a host's WarmRich
				cpu += treeCPU(pid)
				retire()
			}
			b.ReportMetric(float64(ready.Microseconds())/float64(b.N)/1000, "ready-ms")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N)/1000, "cpu-ms")
		})
	}
}

// treeCPU is the CPU time used so far by process pid and the processes
// under it (the sandbox's and Mono), from /proc (in clock ticks of 10 ms).
func treeCPU(pid int) time.Duration {
	var total time.Duration
	for _, p := range processTree(pid) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: utime and
		// stime are the 12th and 13th.
		if i := bytes.LastIndexByte(stat, ')'); i > 0 {
			if f := strings.Fields(string(stat[i+1:])); len(f) > 12 {
				u, _ := strconv.Atoi(f[11])
				st, _ := strconv.Atoi(f[12])
				total += time.Duration(u+st) * 10 * time.Millisecond
			}
		}
	}
	return total
}

// BenchmarkDotnetReloads is what reloading one worker with new C# source
// costs the node (strict sandbox, a spare compiler and a spare host, no
// other work): each reload is Check (a compile), Load and the first
// call, then the wait until the spares are ready again and settled.
// "spare" takes a spare compiler for each compile, whose replacement
// starts; "kept" compiles on the compiler kept for the worker
// (keptcompiler.go). Reported: the reload's p50 (Check to the first
// output) and the machine's busy CPU per reload (/proc/stat, the
// replacements' included).
func BenchmarkDotnetReloads(b *testing.B) {
	for _, mode := range []string{"spare", "kept"} {
		b.Run(mode, func(b *testing.B) {
			cfg := Config{SpareCompilers: 1, Spares: 1, Sandbox: sandboxtest.Strict(b)}
			if mode == "kept" {
				cfg.KeptCompilers = 1
			}
			e := newTestEngine(b, cfg)
			b.Cleanup(func() { _ = e.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			spec := engines.Spec{WorkerID: "reloaded", MIMEType: MIMESource}
			var inst engines.Instance
			reload := func(i int) {
				code := unique(fixture(b, "echo"), fmt.Sprintf("reload %d %d", i, time.Now().UnixNano()))
				if err := e.Check(ctx, spec, code); err != nil {
					b.Fatal(err)
				}
				next, err := e.Load(ctx, spec, code)
				if err != nil {
					b.Fatal(err)
				}
				if out, err := next.Process(ctx, enginetest.NewEvent(fmt.Sprint("r", i), "t", map[string]any{"i": i}, "")); err != nil || len(out) != 1 {
					b.Fatalf("reload %d: outputs %v, err %v", i, out, err)
				}
				if inst != nil {
					_ = inst.Close(ctx)
				}
				inst = next
			}
			settle := func() {
				for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Millisecond) {
					// The compiler kept for the worker, if any, staged again.
					keptReady := true
					if sc := e.kept.ready()[spec.WorkerID]; sc != nil {
						keptReady = sc.output.isReady()
					}
					if keptReady && len(e.compilers.Ready()) > 0 && len(e.spares.Ready()) > 0 {
						break
					}
					if time.Now().After(deadline) {
						b.Fatal("the spares were not ready again within a minute")
					}
				}
				time.Sleep(spareSettled)
			}
			reload(0) // the first compile starts the spares
			settle()
			reload(1)
			settle()
			var took []time.Duration
			var busy time.Duration
			i := 2
			for b.Loop() {
				c0 := enginetest.MachineBusy(b)
				t0 := time.Now()
				reload(i)
				took = append(took, time.Since(t0))
				settle()
				busy += enginetest.MachineBusy(b) - c0
				i++
			}
			if inst != nil {
				_ = inst.Close(ctx)
			}
			// What the compiler waiting for the next compile holds: the
			// one kept for the worker, else the spare.
			waiting := e.kept.ready()[spec.WorkerID]
			if ready := e.compilers.Ready(); waiting == nil && len(ready) > 0 {
				waiting = ready[0]
			}
			if waiting != nil {
				b.ReportMetric(treePSS(waiting.cmd.Process.Pid)/(1<<20), "waiting-compiler-pss-MiB")
			}
			slices.Sort(took)
			b.ReportMetric(float64(e.spareCompilerSeq.Load())/float64(len(took)), "compiler-starts/op")
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			// The settle's own sleep is idle time, not counted.
			b.ReportMetric(float64(busy.Microseconds())/float64(len(took))/1000, "machine-cpu-ms")
		})
	}
}

// treePSS is the proportional set size of process pid and the processes
// under it, in bytes (/proc/<pid>/smaps_rollup).
func treePSS(pid int) float64 {
	var total uint64
	for _, p := range processTree(pid) {
		total += procKiB(p, "smaps_rollup", "Pss:")
	}
	return float64(total)
}
