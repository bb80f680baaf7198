package wasm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// Escape attempts from hand-assembled modules (modbuilder_test.go): each
// process body escapes only for a big input (over 300 bytes encoded), so
// that a small one then shows the worker still serves.

const opElse = 0x05

// onBig is a process body: escape (leaving an i32) for an input over
// 300 bytes, return code 0 (no output) otherwise.
func onBig(escape []byte) []byte {
	b := []byte{opLocalGet, 1}
	b = append(b, i32c(300)...)
	b = append(b, opI32GtU, opIf, tI32)
	b = append(b, escape...)
	b = append(b, opElse)
	b = append(b, i32c(0)...)
	return append(b, opEnd)
}

func bigEvent(id string) *event.Event {
	return enginetest.NewEvent(id, "test.escape", map[string]any{"pad": strings.Repeat("x", 400)}, "")
}

func smallEvent(id string) *event.Event { return enginetest.NewEvent(id, "t", nil, "") }

// servesSmall checks that inst answers a small event (no output, no
// error).
func servesSmall(t *testing.T, inst engines.Instance, id string) {
	t.Helper()
	out, err := inst.Process(bg(t), smallEvent(id))
	if err != nil || len(out) != 0 {
		t.Fatalf("Process(small %s) = %v, %v; want no output and no error", id, out, err)
	}
}

// wantTrap checks that a big event fails the call as a worker failure
// whose message contains want, and that the instance serves afterwards.
func wantTrap(t *testing.T, inst engines.Instance, want string) {
	t.Helper()
	servesSmall(t, inst, "before")
	_, err := inst.Process(bg(t), bigEvent("escape"))
	if !errors.Is(err, engines.ErrWorkerFailed) {
		t.Fatalf("Process(escape) = %v, want a worker failure", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("Process(escape) = %q, want it to say %q", err, want)
	}
	var we *WorkerError
	if !errors.As(err, &we) || !we.Trap {
		t.Errorf("Process(escape) = %#v, want a *WorkerError with Trap", err)
	}
	if tb := engines.Traceback(err); !strings.Contains(tb, want) {
		t.Errorf("Traceback = %q, want it to contain %q", tb, want)
	}
	servesSmall(t, inst, "after")
}

func TestEscapeOutOfBoundsRead(t *testing.T) {
	e := newTestEngine(t, Config{})
	// i32.load at 0xfffffff0: far outside the one page of memory.
	body := onBig(append(i32c(-16), opI32Load, 2, 0))
	inst := load(t, e, testSpec("oob", roomy), abiModule(body, nil))
	wantTrap(t, inst, "out of bounds memory access")
}

func TestEscapeUnreachable(t *testing.T) {
	e := newTestEngine(t, Config{})
	inst := load(t, e, testSpec("unreachable", roomy), abiModule(onBig([]byte{opUnreachable}), nil))
	wantTrap(t, inst, "unreachable")
}

func TestEscapeDeepRecursion(t *testing.T) {
	e := newTestEngine(t, Config{})
	// Function 4, rec: calls itself for ever.
	rec := wasmFunc{typ: 4, body: []byte{opCall, 4}}
	body := onBig(append([]byte{opCall, 4}, i32c(0)...))
	inst := load(t, e, testSpec("recursion", roomy), abiModule(body, nil, rec))
	wantTrap(t, inst, "stack overflow")
}

func TestEscapeInfiniteLoopIsStoppedByTheTimeout(t *testing.T) {
	e := newTestEngine(t, Config{})
	body := onBig([]byte{opLoop, opBlockEmpty, opBr, 0, opEnd, opI32Const, 0})
	const timeout = 300 * time.Millisecond
	inst := load(t, e, testSpec("loop", timeout), abiModule(body, nil))
	for i := range 3 {
		servesSmall(t, inst, "before")
		start := time.Now()
		_, err := inst.Process(bg(t), bigEvent("loop"))
		took := time.Since(start)
		if !errors.Is(err, engines.ErrTimeout) {
			t.Fatalf("round %d: Process(loop) = %v, want ErrTimeout", i, err)
		}
		if took > timeout+5*time.Second {
			t.Fatalf("round %d: the loop was stopped after %v, timeout %v", i, took, timeout)
		}
		// The next call works, on a fresh instance.
		servesSmall(t, inst, "after")
	}
}

func TestEscapeMemoryGrowthPastTheCap(t *testing.T) {
	const capPages = 16
	e := newTestEngine(t, Config{MaxMemoryPages: capPages})
	// memory.grow by 100 pages past a cap of 16: -1, the return code.
	body := onBig(append(i32c(100), opMemoryGrow, 0))
	inst := load(t, e, testSpec("grow", roomy), abiModule(body, nil))
	servesSmall(t, inst, "before")
	_, err := inst.Process(bg(t), bigEvent("grow"))
	var we *WorkerError
	if !errors.As(err, &we) || we.Code != -1 {
		t.Fatalf("Process(grow past the cap) = %v, want the worker's return code -1 (memory.grow refused)", err)
	}
	// Growing within the cap works.
	body = onBig(append(append(i32c(8), opMemoryGrow, 0), append(i32c(-1), 0x46 /* i32.eq: 1 when the grow failed */)...))
	inst2 := load(t, e, testSpec("grow-ok", roomy), abiModule(body, nil))
	if _, err := inst2.Process(bg(t), bigEvent("grow-ok")); err != nil {
		t.Fatalf("Process(grow within the cap) = %v", err)
	}
	sizes := map[uint32]int{}
	for _, in := range []*Instance{inst, inst2} {
		for _, s := range idleSlots(in) {
			sizes[s.mem.Size()/65536]++
		}
	}
	// inst's modules stayed at their one page, inst2's grew to 9.
	for pages := range sizes {
		if pages != 1 && pages != 9 {
			t.Errorf("module instances by memory pages: %v, want 1 or 9 (cap %d)", sizes, capPages)
		}
	}
	if sizes[9] != 1 {
		t.Errorf("module instances by memory pages: %v, want one of 9", sizes)
	}
}

// idleSlots lists in's idle module instances.
func idleSlots(in *Instance) []*slot {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]*slot{}, in.free...)
}

func TestModuleDeclaringMoreMemoryThanTheCapIsRefused(t *testing.T) {
	e := newTestEngine(t, Config{MaxMemoryPages: 16})
	m := module{types: []fnType{{nil, nil}}, funcs: []wasmFunc{{typ: 0}}, memMin: 64, memMax: -1,
		exports: []wasmExport{{"memory", 2, 0}}}
	err := e.Check(bg(t), testSpec("bigmem", 0), m.bytes())
	if !errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("Check(a module whose memory starts at 64 pages, cap 16) = %v, want ErrInvalidCode", err)
	}
	t.Log(err)
}

func TestUnofferedImportIsRefusedAtCreate(t *testing.T) {
	e := newTestEngine(t, Config{})
	for _, c := range []struct {
		name string
		imp  wasmImport
		want string
	}{
		{"env", wasmImport{"env", "system", 4}, "env.system"},
		{"host", wasmImport{HostModule, "open_file", 4}, "workmanager.open_file"},
		{"wasi", wasmImport{WASIModule, "no_such_call", 4}, "wasi_snapshot_preview1.no_such_call"},
		{"signature", wasmImport{HostModule, "log", 4}, "workmanager.log with type () -> ()"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code := abiModule(i32c(0), []wasmImport{c.imp})
			err := e.Check(bg(t), testSpec("import", 0), code)
			if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Check = %v, want ErrInvalidCode naming %q", err, c.want)
			}
			inst, err := e.Load(bg(t), testSpec("import", 0), code)
			if err == nil {
				inst.Close(bg(t))
				t.Fatal("Load succeeded")
			}
			if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Load = %v, want ErrInvalidCode naming %q", err, c.want)
			}
		})
	}
	// An offered import is fine.
	code := abiModule(i32c(0), []wasmImport{{HostModule, "log", 5}})
	if err := e.Check(bg(t), testSpec("import-ok", 0), code); err != nil {
		t.Fatalf("Check(importing workmanager.log) = %v", err)
	}
}

func TestGarbageIsRefusedAtCreate(t *testing.T) {
	e := newTestEngine(t, Config{MaxModuleBytes: 4096})
	valid := abiModule(i32c(0), nil)
	for _, c := range []struct {
		name string
		code []byte
		want string
	}{
		{"empty", nil, "not a WebAssembly module"},
		{"text", []byte("#!/bin/sh\nrm -rf /\n"), "not a WebAssembly module"},
		{"elf", []byte("\x7fELF\x02\x01\x01\x00rest"), "not a WebAssembly module"},
		{"component", []byte("\x00asm\x0d\x00\x01\x00"), "components are not supported"},
		{"truncated", valid[:len(valid)-3], "does not compile"},
		{"junk sections", append([]byte("\x00asm\x01\x00\x00\x00"), 0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2, 3), "does not compile"},
		{"too big", append(append([]byte{}, valid...), make([]byte, 5000)...), "more than the limit of 4096"},
		{"no exports", module{types: []fnType{{nil, nil}}, funcs: []wasmFunc{{typ: 0}}, memMin: 1, memMax: -1,
			exports: []wasmExport{{"memory", 2, 0}}}.bytes(), `does not export "abi_version"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := e.Check(bg(t), testSpec("garbage", 0), c.code)
			if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Check = %v, want ErrInvalidCode saying %q", err, c.want)
			}
			if _, err := e.Load(bg(t), testSpec("garbage", 0), c.code); !errors.Is(err, engines.ErrInvalidCode) {
				t.Fatalf("Load = %v, want ErrInvalidCode", err)
			}
		})
	}
}

func TestABIVersionMismatchIsRefused(t *testing.T) {
	e := newTestEngine(t, Config{})
	m := module{
		types:   []fnType{{nil, []byte{tI32}}, {[]byte{tI32}, []byte{tI32}}, {[]byte{tI32}, nil}, {[]byte{tI32, tI32, tI32, tI32}, []byte{tI32}}},
		funcs:   []wasmFunc{{0, i32c(2)}, {1, i32c(1024)}, {2, nil}, {3, i32c(0)}},
		memMin:  1,
		memMax:  -1,
		exports: []wasmExport{{"memory", 2, 0}, {"abi_version", 0, 0}, {"alloc", 0, 1}, {"dealloc", 0, 2}, {"process", 0, 3}},
	}
	err := e.Check(bg(t), testSpec("abi2", 0), m.bytes())
	if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "abi_version() is 2") {
		t.Fatalf("Check = %v, want ErrInvalidCode saying abi_version() is 2", err)
	}
}

func TestCallsRunInParallelUpToTheWorkersConcurrency(t *testing.T) {
	e := newTestEngine(t, Config{})
	body := onBig([]byte{opLoop, opBlockEmpty, opBr, 0, opEnd, opI32Const, 0})
	for _, c := range []struct {
		conc        int
		wantWaiting bool
	}{{2, false}, {1, true}} {
		spec := testSpec("parallel", 400*time.Millisecond)
		spec.MaxConcurrency = c.conc
		inst := load(t, e, spec, abiModule(body, nil))
		if inst.MaxCalls() != c.conc {
			t.Fatalf("MaxCalls = %d, want %d", inst.MaxCalls(), c.conc)
		}
		// A runs (and loops) first; B comes while A is in its module,
		// with a deadline before A's.
		errA := make(chan error, 1)
		go func() {
			_, err := inst.Process(context.Background(), bigEvent("a"))
			errA <- err
		}()
		enginetest.WaitFor(t, "call A to be running", func() bool {
			inst.mu.Lock()
			defer inst.mu.Unlock()
			return len(inst.busy) == 1
		})
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		_, errB := inst.Process(ctx, bigEvent("b"))
		cancel()
		if err := <-errA; !errors.Is(err, engines.ErrTimeout) {
			t.Fatalf("concurrency %d: call A = %v, want ErrTimeout", c.conc, err)
		}
		if !errors.Is(errB, engines.ErrTimeout) {
			t.Fatalf("concurrency %d: call B = %v, want ErrTimeout", c.conc, errB)
		}
		if waiting := strings.Contains(errB.Error(), "waiting for a free module instance"); waiting != c.wantWaiting {
			t.Errorf("concurrency %d: call B = %v; want it to have waited for an instance: %v", c.conc, errB, c.wantWaiting)
		}
		servesSmall(t, inst, "after")
	}
}

// A module whose _initialize never returns is refused at create once the
// worker's timeout passed; one whose _initialize traps is refused at once.
func TestInitializeThatHangsOrTrapsIsRefused(t *testing.T) {
	e := newTestEngine(t, Config{})
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"hang", []byte{opLoop, opBlockEmpty, opBr, 0, opEnd}, "stopped at the deadline"},
		{"trap", []byte{opUnreachable}, "unreachable"},
	} {
		m := module{
			types: []fnType{{nil, []byte{tI32}}, {[]byte{tI32}, []byte{tI32}}, {[]byte{tI32}, nil},
				{[]byte{tI32, tI32, tI32, tI32}, []byte{tI32}}, {nil, nil}},
			funcs:  []wasmFunc{{0, i32c(ABIVersion)}, {1, i32c(1024)}, {2, nil}, {3, i32c(0)}, {4, c.body}},
			memMin: 1, memMax: -1,
			exports: []wasmExport{{"memory", 2, 0}, {"abi_version", 0, 0}, {"alloc", 0, 1}, {"dealloc", 0, 2},
				{"process", 0, 3}, {"_initialize", 0, 4}},
		}
		start := time.Now()
		_, err := e.Load(bg(t), testSpec("init-"+c.name, 300*time.Millisecond), m.bytes())
		if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: Load = %v, want ErrInvalidCode saying %q", c.name, err, c.want)
		}
		if took := time.Since(start); took > time.Minute {
			t.Fatalf("%s: Load took %v", c.name, took)
		}
	}
}

// A call waiting for a module instance is given back at a stop.
func TestWaitingCallIsGivenBack(t *testing.T) {
	e := newTestEngine(t, Config{})
	spec := testSpec("giveback", time.Second)
	spec.MaxConcurrency = 1
	inst := load(t, e, spec, abiModule(onBig([]byte{opLoop, opBlockEmpty, opBr, 0, opEnd, opI32Const, 0}), nil))
	errA := make(chan error, 1)
	go func() {
		_, err := inst.Process(context.Background(), bigEvent("a"))
		errA <- err
	}()
	enginetest.WaitFor(t, "call A to be running", func() bool {
		inst.mu.Lock()
		defer inst.mu.Unlock()
		return len(inst.busy) == 1
	})
	giveBack := make(chan struct{})
	errB := make(chan error, 1)
	go func() {
		_, err := inst.Process(engines.WithGiveBack(context.Background(), giveBack), smallEvent("b"))
		errB <- err
	}()
	close(giveBack)
	if err := <-errB; !errors.Is(err, engines.ErrGivenBack) {
		t.Fatalf("the waiting call = %v, want ErrGivenBack", err)
	}
	if err := <-errA; !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("the looping call = %v, want ErrTimeout", err)
	}
	servesSmall(t, inst, "after")
}
