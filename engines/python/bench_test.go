package python_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// reportLatencies reports p50/p99 of the per-iteration durations.
func reportLatencies(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	pct := func(p float64) float64 {
		return float64(d[int(p*float64(len(d)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

const benchEcho = `
def process(event):
    return {"type": "bench.echo", "data": event["data"], "correlationid": event.get("correlationid")}
`

func BenchmarkPythonRoundTrip1KiB(b *testing.B) {
	benchRoundTrip(b, python.Config{})
}

// BenchmarkPythonRoundTrip1KiBNoSpin is the same without busy-polling: every
// reply and request wakes a sleeping thread.
func BenchmarkPythonRoundTrip1KiBNoSpin(b *testing.B) {
	benchRoundTrip(b, python.Config{SpinWait: -1})
}

// BenchmarkPythonRoundTrip1KiBSandboxed is the same call inside every OS
// layer (SANDBOX=strict): the sandbox must add nothing per message.
func BenchmarkPythonRoundTrip1KiBSandboxed(b *testing.B) {
	benchRoundTrip(b, python.Config{Sandbox: sandboxtest.Strict(b)})
}

// BenchmarkPythonStartup is one Check: start a runner, load the code, stop;
// the Sandboxed variant adds the OS layers, applied by a runner forked
// from the fork server to itself, and SandboxedChain, its baseline in the
// same run, by the chain of programs (sandbox-exec, bwrap, prlimit,
// setpriv) in front of an interpreter started anew.
func BenchmarkPythonStartup(b *testing.B) { benchStartup(b, python.Config{}) }

func BenchmarkPythonStartupSandboxed(b *testing.B) {
	benchStartup(b, python.Config{Sandbox: sandboxtest.Strict(b)})
}

func BenchmarkPythonStartupSandboxedChain(b *testing.B) {
	benchStartup(b, python.Config{Sandbox: sandboxtest.Strict(b), NoForkServer: true})
}

// The baseline of SandboxedChain in the same run: runners started from
// runner.py's source, as before the engine compiled it once (the
// fallback when it cannot).
func BenchmarkPythonStartupSandboxedFromSource(b *testing.B) {
	benchStartup(b, python.Config{Sandbox: sandboxtest.Strict(b), NoForkServer: true}, true)
}

// benchStartup times a Check: a runner started, the code compiled in it.
// fromSource: runners start from runner.py's source (the baseline).
// It reports the machine's busy CPU per start too (/proc/stat: the node's,
// the server's, the chain's and the runner's together).
func benchStartup(b *testing.B, cfg python.Config, fromSource ...bool) {
	e := newEngine(b, cfg)
	python.RunnerStart(b, e, len(fromSource) > 0 && fromSource[0])
	ctx := context.Background()
	start := enginetest.MachineBusy(b)
	for b.Loop() {
		if err := e.Check(ctx, engines.Spec{WorkerID: "bench", MIMEType: python.MIMEType}, []byte(benchEcho)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((enginetest.MachineBusy(b)-start).Milliseconds())/float64(b.N), "cpu-ms/op")
}

// What a CreateWorker costs the engine: Check, then Load, of a sandboxed
// worker (closed again), with the checked runner parked for the Load and,
// as the baseline, without (ParkTTL -1: two runners started).
func BenchmarkPythonCreateSandboxed(b *testing.B) {
	benchCreate(b, python.Config{Sandbox: sandboxtest.Strict(b)})
}

func BenchmarkPythonCreateSandboxedNoParking(b *testing.B) {
	benchCreate(b, python.Config{Sandbox: sandboxtest.Strict(b), ParkTTL: -1})
}

func benchCreate(b *testing.B, cfg python.Config) {
	e := newEngine(b, cfg)
	ctx := context.Background()
	spec := engines.Spec{WorkerID: "bench", MIMEType: python.MIMEType}
	for b.Loop() {
		if err := e.Check(ctx, spec, []byte(benchEcho)); err != nil {
			b.Fatal(err)
		}
		inst, err := e.Load(ctx, spec, []byte(benchEcho))
		if err != nil {
			b.Fatal(err)
		}
		if err := inst.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// loadBenchEcho loads the echo worker (closed when the benchmark ends) and
// returns it with a 1 KiB event.
func loadBenchEcho(b *testing.B, cfg python.Config) (engines.Instance, *event.Event) {
	e := newEngine(b, cfg)
	ctx := context.Background()
	inst, err := e.Load(ctx, engines.Spec{WorkerID: "bench", MIMEType: python.MIMEType}, []byte(benchEcho))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { inst.Close(ctx) })
	return inst, enginetest.BenchEvent1KiB(b)
}

func benchRoundTrip(b *testing.B, cfg python.Config) {
	ctx := context.Background()
	inst, in := loadBenchEcho(b, cfg)
	for range 1000 { // warm up
		if _, err := inst.Process(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		out, err := inst.Process(ctx, in)
		lat = append(lat, time.Since(t0))
		if err != nil || len(out) != 1 || len(out[0].Data()) != 1024 {
			b.Fatalf("Process: %v (%d outputs)", err, len(out))
		}
	}
	b.StopTimer()
	reportLatencies(b, lat)
}

// bareEcho is the naive baseline: length-prefixed JSON over stdin/stdout.
const bareEcho = `
import json, struct, sys
r, w = sys.stdin.buffer, sys.stdout.buffer
while True:
    h = r.read(4)
    if len(h) < 4:
        break
    msg = json.loads(r.read(struct.unpack("<I", h)[0]))
    out = json.dumps(msg).encode()
    w.write(struct.pack("<I", len(out)) + out)
    w.flush()
`

func BenchmarkBarePipeEcho1KiB(b *testing.B) {
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(strings.TrimSpace(string(out)), "-I", "-c", bareEcho)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	in := enginetest.BenchEvent1KiB(b)
	var hdr [4]byte
	roundTrip := func() event.Event {
		payload, err := json.Marshal(in)
		if err != nil {
			b.Fatal(err)
		}
		msg := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
		if _, err := stdin.Write(append(msg, payload...)); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(stdout, hdr[:]); err != nil {
			b.Fatal(err)
		}
		reply := make([]byte, binary.LittleEndian.Uint32(hdr[:]))
		if _, err := io.ReadFull(stdout, reply); err != nil {
			b.Fatal(err)
		}
		var ev event.Event
		if err := json.Unmarshal(reply, &ev); err != nil {
			b.Fatal(err)
		}
		return ev
	}
	for range 1000 {
		roundTrip()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		ev := roundTrip()
		lat = append(lat, time.Since(t0))
		if len(ev.Data()) < 1024 {
			b.Fatalf("echo data is %d bytes", len(ev.Data()))
		}
	}
	b.StopTimer()
	reportLatencies(b, lat)
}

// BenchmarkPythonParallel1KiB measures throughput with two processes serving
// calls from several goroutines.
func BenchmarkPythonParallel1KiB(b *testing.B) {
	ctx := context.Background()
	inst, in := loadBenchEcho(b, python.Config{Processes: 2})
	b.ReportAllocs()
	b.SetParallelism(2)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if out, err := inst.Process(ctx, in); err != nil || len(out) != 1 {
				b.Errorf("Process: %v", err)
				return
			}
		}
	})
}

// BenchmarkPythonQueued1KiB is one worker process under load: 8 callers (a
// worker's default concurrency on a node) share one context, as the
// dispatcher's calls do, so that queued calls go in batches; …NoBatch is the
// same with MaxBatch 1, the baseline in the same run.
func BenchmarkPythonQueued1KiB(b *testing.B) { benchQueued(b, python.Config{}) }

func BenchmarkPythonQueued1KiBNoBatch(b *testing.B) { benchQueued(b, python.Config{MaxBatch: 1}) }

func benchQueued(b *testing.B, cfg python.Config) {
	ctx := context.Background()
	inst, in := loadBenchEcho(b, cfg)
	b.ReportAllocs()
	b.SetParallelism(8 / max(1, runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if out, err := inst.Process(ctx, in); err != nil || len(out) != 1 {
				b.Errorf("Process: %v", err)
				return
			}
		}
	})
}
