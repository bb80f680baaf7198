package wasm

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/sdk/wasm/wmwasm"
)

// BenchmarkWasm times, in one run, a bare wazero call beside the engine's
// round trip of a 1 KiB event (go test -run '^$' -bench BenchmarkWasm
// ./engines/wasm/):
//
//   - BareWazeroCall: CallWithStack of a trivial exported function in a
//     runtime with close-on-context-done, under a deadline (what every
//     engine call pays: the runtime watches the context);
//   - BareWazeroCallNoWatch: the same without close-on-context-done;
//   - BareWazeroWorker1KiB(NoWatch): the C worker below called through
//     wazero alone (process of an event encoded once);
//   - Encode1KiB, Decode1KiB: the codec alone;
//   - Process1KiB: Instance.Process of the 1 KiB event
//     (enginetest.BenchEvent1KiB) in a C worker that returns one event
//     with its data (testdata/fixture.c, MODE_BENCH): encode, write into
//     the module's memory, process, decode; p50-ns is the median of the
//     calls;
//   - Process1KiBParallel: the same from GOMAXPROCS goroutines.
func BenchmarkWasm(b *testing.B) {
	code := fixture(b, "MODE_BENCH")
	ev := enginetest.BenchEvent1KiB(b)

	bare := func(b *testing.B, watch bool) {
		ctx := context.Background()
		rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCloseOnContextDone(watch))
		defer rt.Close(ctx)
		mod, err := rt.Instantiate(ctx, abiModule(i32c(0), nil))
		if err != nil {
			b.Fatal(err)
		}
		fn := mod.ExportedFunction("process")
		cctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		stack := make([]uint64, 4)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			stack[0], stack[1], stack[2], stack[3] = 1032, 1024, 1024, 1028
			if err := fn.CallWithStack(cctx, stack); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("BareWazeroCall", func(b *testing.B) { bare(b, true) })
	b.Run("BareWazeroCallNoWatch", func(b *testing.B) { bare(b, false) })

	// The C worker itself: its process (reading the event, building the
	// response, freeing the previous one) called through wazero without
	// the engine (input encoded once, output not decoded).
	bareWorker := func(b *testing.B, watch bool) {
		ctx := context.Background()
		rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfig().WithCloseOnContextDone(watch))
		defer rt.Close(ctx)
		if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
			b.Fatal(err)
		}
		if err := New(Config{}).instantiateHost(ctx, rt); err != nil {
			b.Fatal(err)
		}
		mod, err := rt.InstantiateWithConfig(ctx, code, wazero.NewModuleConfig().WithStartFunctions("_initialize"))
		if err != nil {
			b.Fatal(err)
		}
		input, err := newEncoder().encode(ev)
		if err != nil {
			b.Fatal(err)
		}
		res, err := mod.ExportedFunction("alloc").Call(ctx, uint64(len(input)+8))
		if err != nil {
			b.Fatal(err)
		}
		buf := uint32(res[0])
		mod.Memory().Write(buf+8, input)
		process := mod.ExportedFunction("process")
		cctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		stack := make([]uint64, 4)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			stack[0], stack[1], stack[2], stack[3] = uint64(buf+8), uint64(len(input)), uint64(buf), uint64(buf+4)
			if err := process.CallWithStack(cctx, stack); err != nil || stack[0] != 0 {
				b.Fatal(err, stack[0])
			}
		}
	}
	b.Run("BareWazeroWorker1KiB", func(b *testing.B) { bareWorker(b, true) })
	b.Run("BareWazeroWorker1KiBNoWatch", func(b *testing.B) { bareWorker(b, false) })

	b.Run("Encode1KiB", func(b *testing.B) {
		enc := newEncoder()
		b.ReportAllocs()
		for range b.N {
			if _, err := enc.encode(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Decode1KiB", func(b *testing.B) {
		resp := benchResponse(b, ev)
		b.ReportAllocs()
		for range b.N {
			if _, err := decodeResponse(resp, 0); err != nil {
				b.Fatal(err)
			}
		}
	})

	e := newTestEngine(b, Config{})
	inst := load(b, e, testSpec("bench", 10*time.Second), code)
	ctx := context.Background()
	b.Run("Process1KiB", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			out, err := inst.Process(ctx, ev)
			lat = append(lat, time.Since(t0))
			if err != nil || len(out) != 1 || len(out[0].Data()) != 1024 {
				b.Fatalf("Process = %d outputs, %v", len(out), err)
			}
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	})
	b.Run("Process1KiBParallel", func(b *testing.B) {
		b.ReportAllocs()
		var once sync.Once
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := inst.Process(ctx, ev); err != nil {
					once.Do(func() { b.Error(err) })
				}
			}
		})
	})
}

// benchResponse is the WorkerResponse the MODE_BENCH worker returns for
// ev, built with the Go SDK's encoder.
func benchResponse(b *testing.B, ev *event.Event) []byte {
	b.Helper()
	return wmwasm.BuildResponse([]wmwasm.Output{{Type: "bench.response", DataContentType: "application/json", Data: ev.Data()}}, "")
}
