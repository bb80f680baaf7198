package wasm

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// Tests with the C fixture (testdata/fixture.c, built with clang).

func process(t *testing.T, inst engines.Instance, typ string, data any, ext map[string]string) (map[string]any, error) {
	t.Helper()
	ev := enginetest.NewEvent("ev-"+typ, typ, data, "corr-"+typ)
	for k, v := range ext {
		ev.SetExtension(k, v)
	}
	out, err := inst.Process(bg(t), ev)
	if err != nil {
		return nil, err
	}
	if len(out) != 1 {
		t.Fatalf("%s: %d outputs, want 1", typ, len(out))
	}
	if got := out[0].Extensions()["correlationid"]; got != "corr-"+typ {
		t.Errorf("%s: output correlationid = %v, want %q", typ, got, "corr-"+typ)
	}
	var v any
	if err := json.Unmarshal(out[0].Data(), &v); err != nil {
		t.Fatalf("%s: output data %q: %v", typ, out[0].Data(), err)
	}
	m, _ := v.(map[string]any)
	if m == nil {
		m = map[string]any{"value": v}
	}
	return m, nil
}

func TestTrapsAndExitsAreFailedAttempts(t *testing.T) {
	e := newTestEngine(t, Config{})
	spec := testSpec("traps", roomy)
	spec.MaxConcurrency = 1
	inst := load(t, e, spec, fixture(t))
	for _, c := range []struct{ typ, want string }{
		{"test.unreachable", "unreachable"},
		{"test.oob", "out of bounds memory access"},
		{"test.exit", "the module exited with code 3"},
		{"test.stderr", "fixture: about to trap"},
	} {
		// State kept across calls on one instance...
		for want := 1.0; want <= 2; want++ {
			m, err := process(t, inst, "test.count", nil, nil)
			if err != nil || m["value"] != want {
				t.Fatalf("test.count = %v, %v; want %v", m, err, want)
			}
		}
		_, err := inst.Process(bg(t), enginetest.NewEvent("ev", c.typ, nil, ""))
		var we *WorkerError
		if !errors.As(err, &we) || !we.Trap || !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: Process = %v, want a trap saying %q", c.typ, err, c.want)
		}
		// ... is gone after a trap: the next call runs on a fresh instance.
		if m, err := process(t, inst, "test.count", nil, nil); err != nil || m["value"] != 1.0 {
			t.Fatalf("after %s: test.count = %v, %v; want 1 (a fresh instance)", c.typ, m, err)
		}
		// Reset the counter's instance for the next round.
		_, _ = inst.Process(bg(t), enginetest.NewEvent("ev", "test.unreachable", nil, ""))
	}
}

func TestMemoryCapHoldsForMalloc(t *testing.T) {
	e := newTestEngine(t, Config{MaxMemoryPages: 64}) // 4 MiB
	inst := load(t, e, testSpec("oom", roomy), fixture(t))
	_, err := inst.Process(bg(t), enginetest.NewEvent("ev", "test.oom", nil, ""))
	if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "out of memory after") {
		t.Fatalf("Process(test.oom) = %v, want the worker's out-of-memory report", err)
	}
	for _, s := range idleSlots(inst) {
		if s.mem.Size() > 64*65536 {
			t.Fatalf("a module instance holds %d bytes, over the cap of 4 MiB", s.mem.Size())
		}
	}
	if _, err := process(t, inst, "test.count", nil, nil); err != nil {
		t.Fatalf("after running out of memory: %v", err)
	}
}

func TestTheModuleSeesOnlyItsIdentityAndNoFiles(t *testing.T) {
	e := newTestEngine(t, Config{})
	spec := testSpec("identity", roomy)
	inst := load(t, e, spec, fixture(t))
	for _, v := range []string{"HOME", "PATH"} {
		if os.Getenv(v) == "" {
			t.Fatalf("the test needs %s set in its own environment", v)
		}
	}
	m, err := process(t, inst, "test.identity", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"VIRTUFIN_WORKER_ID": spec.WorkerID, "VIRTUFIN_WORKER_GROUP": spec.Group,
		"VIRTUFIN_WORKER_TOPIC": spec.Topic, "HOME": nil, "PATH": nil, "passwd": false, "fds": 0.0}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %v, want %v (all: %v)", k, m[k], v, m)
		}
	}
	// The monotonic clock is real; the wall clock is not the host's.
	m, err = process(t, inst, "test.clock", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if wall, _ := m["wall"].(float64); time.Unix(int64(wall), 0).After(time.Now().Add(-24 * time.Hour)) {
		t.Errorf("the module read the host's wall clock: %v", m)
	}
}

// recorder is a slog.Handler that keeps the records.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) lines() map[string]slog.Level {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]slog.Level{}
	for _, rec := range r.recs {
		out[rec.Message] = rec.Level
	}
	return out
}

func TestLogLinesReachTheWorkersLogger(t *testing.T) {
	e := newTestEngine(t, Config{})
	rec := &recorder{}
	spec := testSpec("log", roomy)
	spec.Logger = slog.New(rec)
	inst := load(t, e, spec, fixture(t))
	out, err := inst.Process(bg(t), enginetest.NewEvent("ev", "test.log", nil, ""))
	if err != nil || len(out) != 0 {
		t.Fatalf("Process(test.log) = %v, %v", out, err)
	}
	lines := rec.lines()
	for msg, level := range map[string]slog.Level{"log-0": slog.LevelDebug - 4, "log-1": slog.LevelDebug, "log-2": slog.LevelInfo,
		"log-3": slog.LevelWarn, "log-4": slog.LevelError, "printed to stdout": slog.LevelInfo} {
		if got, ok := lines[msg]; !ok || got != level {
			t.Errorf("log line %q: level %v (present %v), want %v; all: %v", msg, got, ok, level, lines)
		}
	}
}

// gateway is a fake engines.Gateway that records its calls; block, when
// set, holds each call until it is closed.
type gateway struct {
	mu      sync.Mutex
	calls   []string
	fences  []*engines.Fence
	entered chan struct{}
	block   chan struct{}
}

func (g *gateway) Call(ctx context.Context, service, method string, req []byte) ([]byte, error) {
	g.mu.Lock()
	g.calls = append(g.calls, service+"/"+method)
	g.fences = append(g.fences, engines.FenceFrom(ctx))
	g.mu.Unlock()
	if g.entered != nil {
		g.entered <- struct{}{}
	}
	if g.block != nil {
		select {
		case <-g.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if strings.HasSuffix(method, "fail") {
		return nil, errors.New("backend says no")
	}
	return append([]byte(`{"echo":`), append(req, '}')...), nil
}

func TestGatewayCallsCarryTheFenceAndHonourTheTargets(t *testing.T) {
	gw := &gateway{}
	e := newTestEngine(t, Config{Gateway: gw})
	spec := testSpec("gateway", roomy)
	spec.GatewayTargets = []string{"svc/do/*"}
	inst := load(t, e, spec, fixture(t))
	fence := &engines.Fence{Group: spec.Group, Token: 42, Check: func(context.Context) error { return nil }}
	ctx := engines.WithFence(bg(t), fence)
	ev := enginetest.NewEvent("gw-1", "test.gateway", map[string]any{"q": 1}, "c")
	ev.SetExtension("gwmethod", "do/it")
	out, err := inst.Process(ctx, ev)
	if err != nil {
		t.Fatalf("Process(test.gateway) = %v", err)
	}
	if got := string(out[0].Data()); got != `{"echo":{"q":1}}` {
		t.Errorf("gateway response = %s", got)
	}
	gw.mu.Lock()
	if len(gw.fences) != 1 || gw.fences[0] != fence || gw.calls[0] != "svc/do/it" {
		t.Errorf("gateway calls %v with fences %v, want svc/do/it under the call's fence", gw.calls, gw.fences)
	}
	gw.mu.Unlock()

	// Outside allowed_gateway_targets: refused before the gateway.
	ev.SetExtension("gwmethod", "other")
	if _, err := inst.Process(ctx, ev); err == nil || !strings.Contains(err.Error(), "gateway code 1") || !strings.Contains(err.Error(), "not in allowed_gateway_targets") {
		t.Fatalf("Process(a gateway call outside the targets) = %v", err)
	}
	// The backend's error reaches the worker.
	ev.SetExtension("gwmethod", "do/fail")
	if _, err := inst.Process(ctx, ev); err == nil || !strings.Contains(err.Error(), "gateway code 1: backend says no") {
		t.Fatalf("Process(a failing gateway call) = %v", err)
	}
	// No gateway: code 2.
	inst2 := load(t, newTestEngine(t, Config{}), spec, fixture(t))
	ev.SetExtension("gwmethod", "do/it")
	if _, err := inst2.Process(ctx, ev); err == nil || !strings.Contains(err.Error(), "gateway code 2") {
		t.Fatalf("Process(no gateway) = %v", err)
	}
	// The fencing token extension reaches the module as it is.
	m, err := process(t, inst, "test.fence", nil, map[string]string{"fencingtoken": "42"})
	if err != nil || m["value"] != "42" {
		t.Fatalf("test.fence = %v, %v", m, err)
	}
}

// A reload: the new version serves while a call still runs on the old
// one, which Close lets finish.
func TestReloadLetsInFlightCallsFinishOnTheOldModule(t *testing.T) {
	gw := &gateway{entered: make(chan struct{}, 1), block: make(chan struct{})}
	e := newTestEngine(t, Config{Gateway: gw})
	spec := testSpec("reload", roomy)
	v1, err := e.Load(bg(t), spec, fixture(t))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		data string
		err  error
	}
	inflight := make(chan result, 1)
	go func() {
		ev := enginetest.NewEvent("slow", "test.gateway", map[string]any{"v": 1}, "")
		out, err := v1.Process(context.Background(), ev)
		r := result{err: err}
		if err == nil && len(out) == 1 {
			r.data = string(out[0].Data())
		}
		inflight <- r
	}()
	<-gw.entered
	v2 := load(t, e, spec, fixture(t, "MODE_RAISE"))
	if _, err := v2.Process(bg(t), enginetest.NewEvent("r", "conformance.raise", nil, "")); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("v2 Process(raise) = %v, want boom (the new version)", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- v1.Close(bg(t)) }()
	enginetest.WaitFor(t, "v1 to refuse new calls", func() bool {
		_, err := v1.Process(bg(t), smallEvent("late"))
		return errors.Is(err, engines.ErrClosed)
	})
	close(gw.block)
	if r := <-inflight; r.err != nil || r.data != `{"echo":{"v":1}}` {
		t.Fatalf("the in-flight call on v1 = %+v, want its gateway answer", r)
	}
	if err := <-closed; err != nil {
		t.Fatalf("v1 Close = %v", err)
	}
}

func TestCompiledOncePerModule(t *testing.T) {
	dir := t.TempDir()
	e := newTestEngine(t, Config{CacheDir: dir})
	code := fixture(t)
	if err := e.Check(bg(t), testSpec("once", 0), code); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	after := len(e.compiled)
	var c *compiled
	for _, v := range e.compiled {
		c = v
	}
	e.mu.Unlock()
	a := load(t, e, testSpec("once", 0), code)
	b := load(t, e, testSpec("once-2", 0), code)
	if after != 1 || a.comp != c || b.comp != c {
		t.Fatalf("Check then two Loads of one module: %d compiled, shared %v %v", after, a.comp == c, b.comp == c)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) == 0 {
		t.Fatalf("the compilation cache directory is empty (%v)", err)
	}
	// Another engine (a node restart) loads from the cache directory.
	e2 := newTestEngine(t, Config{CacheDir: dir})
	inst := load(t, e2, testSpec("once-3", 0), code)
	if _, err := process(t, inst, "test.count", nil, nil); err != nil {
		t.Fatal(err)
	}
}

// The module releases each response at its next call (WM_PROCESS): many
// calls do not grow its memory.
func TestResponsesDoNotLeakTheModulesMemory(t *testing.T) {
	e := newTestEngine(t, Config{})
	spec := testSpec("leak", roomy)
	spec.MaxConcurrency = 1
	inst := load(t, e, spec, fixture(t, "MODE_BENCH"))
	ev := enginetest.BenchEvent1KiB(t)
	for i := range 5000 {
		if out, err := inst.Process(bg(t), ev); err != nil || len(out) != 1 {
			t.Fatalf("call %d: %v, %v", i, out, err)
		}
	}
	for _, s := range idleSlots(inst) {
		if s.mem.Size() > 16*65536 {
			t.Fatalf("after 5000 calls the module holds %d bytes of memory: responses leak", s.mem.Size())
		}
	}
}
