//go:build linux || darwin || freebsd

package native

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/ebitengine/purego"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/crashjournal"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

// The benchmarks use the fixture's BenchProcess/BenchFree pair: a trivial
// Process that returns a prebuilt response (one event with 1 KiB of data)
// and a FreeResult that does nothing, so that what is measured is the
// engine's overhead, not the worker's work.
//
//	go test -run '^$' -bench . -benchtime 200000x ./engines/native/

var benchManifest = &Manifest{ABIVersion: 1, Library: "fixture", EntryPoint: "BenchProcess", FreeResult: "BenchFree"}

// BenchmarkCall compares, in one run, a bare purego call of the
// BenchProcess+BenchFree pair with the full ABI round trip around the same
// pair (encode the 1 KiB CloudEvent to FlatBuffers, Process, decode the
// response into an event.Event, FreeResult), and its parts.
func BenchmarkCall(b *testing.B) {
	path := fixtureLib(b)
	if _, err := loader.Init(); err != nil {
		b.Fatal(err)
	}
	lib, err := openLibrary(path, benchManifest)
	if err != nil {
		b.Fatal(err)
	}
	defer lib.Close()
	ev := enginetest.BenchEvent1KiB(b)

	b.Run("BarePuregoPair", func(b *testing.B) {
		// The same two exports, resolved here (dlopen of a loaded path
		// returns the same handle) and called without the loader.
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			b.Fatal(err)
		}
		defer purego.Dlclose(h)
		process, err1 := purego.Dlsym(h, benchManifest.EntryPoint)
		freeResult, err2 := purego.Dlsym(h, benchManifest.FreeResult)
		if err1 != nil || err2 != nil {
			b.Fatal(err1, err2)
		}
		slots := new(loader.CallSlots)
		in := make([]byte, 1100)
		b.ReportAllocs()
		for b.Loop() {
			purego.SyscallN(process, 0, uintptr(unsafe.Pointer(&in[0])), uintptr(len(in)),
				uintptr(unsafe.Pointer(&slots.Out)), uintptr(unsafe.Pointer(&slots.OutLen)))
			purego.SyscallN(freeResult, slots.Out)
		}
	})
	b.Run("ABIRoundTrip1KiB", func(b *testing.B) {
		enc := newEncoder()
		slots := new(loader.CallSlots)
		b.ReportAllocs()
		for b.Loop() {
			in, err := enc.encode(ev)
			if err != nil {
				b.Fatal(err)
			}
			rc := lib.Call(0, in, slots)
			buf, err := slots.Bytes()
			if err != nil || rc != 0 {
				b.Fatal(rc, err)
			}
			out, err := decodeResponse(buf, 0)
			lib.FreeOut(slots.Out)
			if err != nil || len(out) != 1 || len(out[0].Data()) != 1024 {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("Encode1KiB", func(b *testing.B) {
		enc := newEncoder()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := enc.encode(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecodeLent1KiB", func(b *testing.B) {
		slots := new(loader.CallSlots)
		lib.Call(0, []byte{0}, slots)
		buf, _ := slots.Bytes()
		var one oneOutput
		b.ReportAllocs()
		for b.Loop() {
			one = oneOutput{}
			if _, err := decodeLent(buf, 0, &one); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Decode1KiB", func(b *testing.B) {
		slots := new(loader.CallSlots)
		lib.Call(0, []byte{0}, slots)
		buf, _ := slots.Bytes()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeResponse(buf, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkABIRatio is the figure issue 47 bounds (the ABI round trip at
// most 3 times the bare purego call pair). It times, interleaved in
// blocks of 64 calls so that a machine that gets busy slows both alike,
// the bare pair (as BenchmarkCall/BarePuregoPair) and the ABI round trip
// (as BenchmarkCall/ABIRoundTrip1KiB, with the node's default reply
// limit), and reports each one's nanoseconds per call and abi/bare, their
// ratio. Now is the engine's codec, Before the codec from before issue 47
// (legacycodec_test.go), each in its own run so that neither pays for the
// other's garbage. ns/op is the sum of the two calls.
func BenchmarkABIRatio(b *testing.B) {
	path := fixtureLib(b)
	if _, err := loader.Init(); err != nil {
		b.Fatal(err)
	}
	lib, err := openLibrary(path, benchManifest)
	if err != nil {
		b.Fatal(err)
	}
	defer lib.Close()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		b.Fatal(err)
	}
	defer purego.Dlclose(h)
	process, err1 := purego.Dlsym(h, benchManifest.EntryPoint)
	freeResult, err2 := purego.Dlsym(h, benchManifest.FreeResult)
	if err1 != nil || err2 != nil {
		b.Fatal(err1, err2)
	}
	ev := enginetest.BenchEvent1KiB(b)
	slots := new(loader.CallSlots)
	enc := newEncoder()
	bareIn := make([]byte, 1100)
	bare := func() {
		purego.SyscallN(process, 0, uintptr(unsafe.Pointer(&bareIn[0])), uintptr(len(bareIn)),
			uintptr(unsafe.Pointer(&slots.Out)), uintptr(unsafe.Pointer(&slots.OutLen)))
		purego.SyscallN(freeResult, slots.Out)
	}
	roundTrip := func(encode func(*event.Event) ([]byte, error), decode func([]byte, int) ([]event.Event, error)) func() {
		return func() {
			in, err := encode(ev)
			if err != nil {
				b.Fatal(err)
			}
			lib.Call(0, in, slots)
			buf, _ := slots.Bytes()
			out, err := decode(buf, engines.DefaultMaxReplyBytes)
			lib.FreeOut(slots.Out)
			if err != nil || len(out) != 1 || len(out[0].Data()) != 1024 {
				b.Fatal(out, err)
			}
		}
	}
	// As the dispatcher's calls run (ProcessLent): the output's data read
	// where the worker left it, its context in the call's own place,
	// FreeResult when the loan is returned.
	var one oneOutput
	lent := func() {
		in, err := enc.encode(ev)
		if err != nil {
			b.Fatal(err)
		}
		lib.Call(0, in, slots)
		buf, _ := slots.Bytes()
		out, err := decodeLent(buf, engines.DefaultMaxReplyBytes, &one)
		if err != nil || len(out) != 1 || len(out[0].Data()) != 1024 {
			b.Fatal(out, err)
		}
		lib.FreeOut(slots.Out)
		one = oneOutput{} // as the call is recycled (putCall)
	}
	run := func(abi func()) func(*testing.B) {
		return func(b *testing.B) {
			// Warmed up first: a short run (-benchtime 2000x) would
			// otherwise time the first one's heap growing on fresh pages.
			for range 4096 {
				bare()
				abi()
			}
			const block = 64
			var tBare, tABI time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for done := 0; done < b.N; done += block {
				k := min(block, b.N-done)
				start := time.Now()
				for range k {
					bare()
				}
				mid := time.Now()
				for range k {
					abi()
				}
				tBare, tABI = tBare+mid.Sub(start), tABI+time.Since(mid)
			}
			b.ReportMetric(float64(tBare.Nanoseconds())/float64(b.N), "bare-ns/call")
			b.ReportMetric(float64(tABI.Nanoseconds())/float64(b.N), "abi-ns/call")
			b.ReportMetric(float64(tABI)/float64(tBare), "abi/bare")
		}
	}
	b.Run("Now", run(lent))
	b.Run("Copied", run(roundTrip(newEncoder().encode, decodeResponse)))
	b.Run("Before", run(roundTrip(newLegacyEncoder().encode, legacyDecodeResponse)))
}

type discardSink struct{}

func (discardSink) HostLog(int32, string) {}
func (discardSink) HostGateway(string, string, []byte) ([]byte, int32) {
	return nil, loader.GatewayUnavailable
}

// BenchmarkLogCallback is one native call that makes one host->log call
// (a C->Go callback through purego), to price the host functions.
func BenchmarkLogCallback(b *testing.B) {
	path := fixtureLib(b)
	rt, err := loader.Init()
	if err != nil {
		b.Fatal(err)
	}
	lib, err := openLibrary(path, &Manifest{ABIVersion: 1, Library: "fixture", EntryPoint: "BenchLog", FreeResult: "BenchFree"})
	if err != nil {
		b.Fatal(err)
	}
	defer lib.Close()
	id := loader.RegisterSink(discardSink{})
	defer loader.UnregisterSink(id)
	abi, _ := loader.LookupABI(loader.CurrentABI)
	host := rt.NewHost(abi, id, "w", "g", "t")
	defer host.Release()
	slots := new(loader.CallSlots)
	b.ReportAllocs()
	for b.Loop() {
		lib.Call(host.Addr(), []byte{0}, slots)
	}
}

// BenchmarkInstance measures engines.Instance.Process end to end: the ABI
// round trip plus the hand-off to a goroutine that lets Process return at
// the deadline while native code keeps running.
func BenchmarkInstance(b *testing.B) {
	compileAll(b, flagsEcho)
	bench := packageOf(b, flagsEcho, map[string]any{"entry_point": "BenchProcess", "free_result": "BenchFree"})
	echo := packageOf(b, flagsEcho, nil)
	ev := enginetest.BenchEvent1KiB(b)
	// how: "serial", "parallel", or "lent" (serial, as the dispatcher
	// calls an engines.Lender: outputs lent, the loan returned).
	run := func(b *testing.B, e *Engine, code []byte, how string) {
		ctx := context.Background()
		inst, err := e.Load(ctx, engines.Spec{WorkerID: "bench", MIMEType: MIMEType}, code)
		if err != nil {
			b.Fatal(err)
		}
		defer inst.Close(ctx)
		b.ReportAllocs()
		switch how {
		case "lent":
			lender := inst.(engines.Lender)
			for b.Loop() {
				_, loan, err := lender.ProcessLent(ctx, ev)
				if err != nil {
					b.Fatal(err)
				}
				loan.Return()
			}
			return
		case "parallel":
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := inst.Process(ctx, ev); err != nil {
						b.Error(err)
						return
					}
				}
			})
			return
		}
		for b.Loop() {
			if _, err := inst.Process(ctx, ev); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("InProcess/Trivial1KiB", func(b *testing.B) { run(b, newTestEngine(b, Config{}), bench, "serial") })
	b.Run("InProcessLent/Trivial1KiB", func(b *testing.B) { run(b, newTestEngine(b, Config{}), bench, "lent") })
	b.Run("InProcess/Trivial1KiBParallel", func(b *testing.B) { run(b, newTestEngine(b, Config{}), bench, "parallel") })
	b.Run("InProcess/CEcho1KiB", func(b *testing.B) { run(b, newTestEngine(b, Config{}), echo, "serial") })
	// As a node runs them: every call in the crash journal (issue 44).
	b.Run("InProcessJournaled/Trivial1KiB", func(b *testing.B) {
		j, _, err := crashjournal.Open(b.TempDir(), crashjournal.Options{Slots: 64})
		if err != nil {
			b.Fatal(err)
		}
		defer j.Close()
		run(b, newTestEngine(b, Config{Journal: j}), bench, "serial")
	})
	b.Run("ProcessIsolation/Trivial1KiB", func(b *testing.B) {
		run(b, newTestEngine(b, hostConfig(Config{Isolation: IsolationProcess})), bench, "serial")
	})
}
