// Package enginetest owns the conformance suite every engine must pass: an
// engine's tests call Run with the engine and code fixtures written in the
// engine's language.
package enginetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
)

// Event types the fixtures react to or produce.
const (
	TypeRequest = "conformance.request" // a normal input event
	TypeRaise   = "conformance.raise"   // Raise fails on it
	TypeHang    = "conformance.hang"    // Hang never returns on it
	TypeEcho    = "conformance.echo"    // Echo's output
	TypeA       = "conformance.a"       // Multi's first output
	TypeB       = "conformance.b"       // Multi's second output
)

// Fixtures is worker code, in the engine's language, with fixed behaviour.
// "Behaves like Echo" means: returns exactly what Echo returns.
type Fixtures struct {
	// Echo returns one event of type "conformance.echo" whose data is the
	// JSON object {"id": <input id>, "data": <input data, decoded JSON>,
	// "correlationid": <the input's correlationid extension, or null>}.
	Echo []byte
	// Multi returns two events, of types "conformance.a" and then
	// "conformance.b" (any data).
	Multi []byte
	// None returns no event.
	None []byte
	// Raise fails (raises, returns an error, ...) with the message "boom" for
	// events of type "conformance.raise" and behaves like Echo otherwise.
	Raise []byte
	// Hang never returns for events of type "conformance.hang" and behaves
	// like Echo otherwise.
	Hang []byte
	// Invalid does not compile or load.
	Invalid []byte
}

// Harness is what Run needs to know about an engine.
type Harness struct {
	Engine engines.Engine
	// MIMEType is the MIME type the fixtures are written for; the engine must
	// list it in Info().MIMETypes.
	MIMEType string
	Fixtures Fixtures
	// Logger receives the workers' own output. Default: discarded.
	Logger *slog.Logger
	// HangTimeout is the Spec.Timeout used when a call is expected to time
	// out. Default 500ms.
	HangTimeout time.Duration
	// Wait bounds every single wait in the suite (a Load, a Process, a
	// Close, ...): nothing can hang longer. Default 2 minutes: a guard
	// against a hang, not a speed test; on a starved machine under -race a
	// compile or a first call has taken over a minute.
	Wait time.Duration
}

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Engine == nil {
		t.Fatal("enginetest: Harness.Engine is nil")
	}
	if h.Logger == nil {
		h.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if h.HangTimeout <= 0 {
		h.HangTimeout = 500 * time.Millisecond
	}
	if h.Wait <= 0 {
		h.Wait = 2 * time.Minute
	}
	s := &suite{h: h}
	if c, ok := h.Engine.(engines.Closer); ok {
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Errorf("engine Close: %v", err)
			}
		})
	}
	t.Run("Info", s.info)
	t.Run("Check/Valid", s.checkValid)
	t.Run("Check/Invalid", s.checkInvalid)
	t.Run("Load/Invalid", s.loadInvalid)
	t.Run("CheckThenLoad", s.checkThenLoad)
	t.Run("Echo", s.echo)
	t.Run("EchoLarge", s.echoLarge)
	t.Run("Multi", s.multi)
	t.Run("None", s.none)
	t.Run("Raise", s.raise)
	t.Run("Timeout", s.timeout)
	t.Run("ContextDeadline", s.contextDeadline)
	t.Run("Concurrent", s.concurrent)
	t.Run("Close", s.close)
	t.Run("CloseInterruptsCall", s.closeInterrupts)
}

type suite struct{ h Harness }

func (s *suite) spec(name string, timeout time.Duration) engines.Spec {
	return engines.Spec{
		WorkerID: "conformance-" + name,
		MIMEType: s.h.MIMEType,
		Topic:    "conformance-topic",
		Group:    "conformance-group",
		Timeout:  timeout,
		Logger:   s.h.Logger,
	}
}

// bounded runs fn and fails the test if it does not return within the
// harness' Wait. fn keeps running in the background in that case.
func (s *suite) bounded(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	timer := time.NewTimer(s.h.Wait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("%s did not return within %v", what, s.h.Wait)
	}
}

func (s *suite) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.h.Wait)
}

func (s *suite) check(t *testing.T, name string, code []byte) error {
	t.Helper()
	var err error
	s.bounded(t, "Check", func() {
		ctx, cancel := s.ctx()
		defer cancel()
		err = s.h.Engine.Check(ctx, s.spec(name, 0), code)
	})
	return err
}

// load loads code and closes the instance when the test ends.
func (s *suite) load(t *testing.T, name string, code []byte, timeout time.Duration) engines.Instance {
	t.Helper()
	inst, err := s.tryLoad(t, name, code, timeout)
	if err != nil {
		t.Fatalf("Load(%s): %v", name, err)
	}
	t.Cleanup(func() { s.closeQuietly(t, inst) })
	return inst
}

// closeQuietly closes inst (again), ignoring the result but not a hang.
func (s *suite) closeQuietly(t *testing.T, inst engines.Instance) {
	t.Helper()
	s.bounded(t, "Close", func() {
		ctx, cancel := s.ctx()
		defer cancel()
		_ = inst.Close(ctx)
	})
}

func (s *suite) tryLoad(t *testing.T, name string, code []byte, timeout time.Duration) (engines.Instance, error) {
	t.Helper()
	var inst engines.Instance
	var err error
	s.bounded(t, "Load", func() {
		ctx, cancel := s.ctx()
		defer cancel()
		inst, err = s.h.Engine.Load(ctx, s.spec(name, timeout), code)
	})
	if err == nil && inst == nil {
		t.Fatalf("Load(%s) returned neither an instance nor an error", name)
	}
	return inst, err
}

func (s *suite) process(t *testing.T, inst engines.Instance, ctx context.Context, in *event.Event) ([]event.Event, error) {
	t.Helper()
	var out []event.Event
	var err error
	s.bounded(t, "Process", func() { out, err = inst.Process(ctx, in) })
	return out, err
}

// NewEvent returns an input event with JSON data (nil data: none) and, when
// correlationID is not empty, a correlationid extension.
func NewEvent(id, typ string, data any, correlationID string) *event.Event {
	ev := event.New()
	ev.SetID(id)
	ev.SetSource("/enginetest")
	ev.SetType(typ)
	if correlationID != "" {
		ev.SetExtension("correlationid", correlationID)
	}
	if data != nil {
		if err := ev.SetData(event.ApplicationJSON, data); err != nil {
			panic(err)
		}
	}
	return &ev
}

// checkEcho verifies that out is what Echo (or a fixture behaving like Echo)
// returns for in, which was built with NewEvent.
func checkEcho(out []event.Event, in *event.Event, data any, correlationID string) error {
	if len(out) != 1 {
		return fmt.Errorf("want 1 output event, got %d", len(out))
	}
	if got := out[0].Type(); got != TypeEcho {
		return fmt.Errorf("output type = %q, want %q", got, TypeEcho)
	}
	var corr any
	if correlationID != "" {
		corr = correlationID
	}
	want, err := normalize(map[string]any{"id": in.ID(), "data": data, "correlationid": corr})
	if err != nil {
		return err
	}
	var got any
	if err := json.Unmarshal(out[0].Data(), &got); err != nil {
		return fmt.Errorf("output data %.200q is not JSON: %v", out[0].Data(), err)
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("output data = %.300s, want %.300v", out[0].Data(), want)
	}
	return nil
}

// normalize round-trips v through JSON so that it compares with decoded data.
func normalize(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	err = json.Unmarshal(b, &out)
	return out, err
}

// messageAfter returns what an error says beyond the sentinel's own text.
func messageAfter(err, sentinel error) string {
	msg := strings.Replace(err.Error(), sentinel.Error(), "", 1)
	return strings.Trim(msg, " :-\t\n")
}

func (s *suite) info(t *testing.T) {
	info := s.h.Engine.Info()
	if info.Name == "" {
		t.Error("Info().Name is empty")
	}
	if !slices.Contains(info.MIMETypes, s.h.MIMEType) {
		t.Errorf("Info().MIMETypes = %v, does not contain %q", info.MIMETypes, s.h.MIMEType)
	}
	if info.Capabilities.ParallelCalls < 0 {
		t.Errorf("Capabilities.ParallelCalls = %d, want >= 0", info.Capabilities.ParallelCalls)
	}
}

func (s *suite) checkValid(t *testing.T) {
	f := s.h.Fixtures
	for _, c := range []struct {
		name string
		code []byte
	}{{"echo", f.Echo}, {"multi", f.Multi}, {"none", f.None}, {"raise", f.Raise}, {"hang", f.Hang}} {
		if err := s.check(t, c.name, c.code); err != nil {
			t.Errorf("Check(%s) = %v, want nil", c.name, err)
		}
	}
}

func (s *suite) checkInvalid(t *testing.T) {
	err := s.check(t, "invalid", s.h.Fixtures.Invalid)
	if !errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("Check(invalid) = %v, want an error wrapping ErrInvalidCode", err)
	}
	if messageAfter(err, engines.ErrInvalidCode) == "" {
		t.Errorf("Check(invalid) = %q: the error does not say what is wrong", err)
	}
}

func (s *suite) loadInvalid(t *testing.T) {
	inst, err := s.tryLoad(t, "invalid", s.h.Fixtures.Invalid, 0)
	if err == nil {
		s.closeQuietly(t, inst)
		t.Fatal("Load(invalid) succeeded, want an error wrapping ErrInvalidCode")
	}
	if !errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("Load(invalid) = %v, want an error wrapping ErrInvalidCode", err)
	}
	if messageAfter(err, engines.ErrInvalidCode) == "" {
		t.Errorf("Load(invalid) = %q: the error does not say what is wrong", err)
	}
}

// checkThenLoad: a Load right after the Check of the same worker and code
// (what CreateWorker does; an engine may hand the Load what its Check
// started) serves, and so does a second Load of that code beside it, also
// after the first is closed.
func (s *suite) checkThenLoad(t *testing.T) {
	if err := s.check(t, "check-then-load", s.h.Fixtures.Echo); err != nil {
		t.Fatalf("Check: %v", err)
	}
	first := s.load(t, "check-then-load", s.h.Fixtures.Echo, 0)
	second := s.load(t, "check-then-load", s.h.Fixtures.Echo, 0)
	for i, inst := range []engines.Instance{first, second} {
		in := NewEvent(fmt.Sprintf("ctl-%d", i), TypeRequest, map[string]any{"i": i}, "corr-ctl")
		out, err := s.process(t, inst, context.Background(), in)
		if err != nil {
			t.Fatalf("Process on load %d: %v", i+1, err)
		}
		if err := checkEcho(out, in, map[string]any{"i": i}, "corr-ctl"); err != nil {
			t.Fatalf("load %d: %v", i+1, err)
		}
	}
	s.closeQuietly(t, first)
	in := NewEvent("ctl-after", TypeRequest, map[string]any{"after": true}, "")
	out, err := s.process(t, second, context.Background(), in)
	if err != nil {
		t.Fatalf("Process on the second load after the first closed: %v", err)
	}
	if err := checkEcho(out, in, map[string]any{"after": true}, ""); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) echo(t *testing.T) {
	inst := s.load(t, "echo", s.h.Fixtures.Echo, 0)
	data := map[string]any{"n": 42, "s": "héllo \"quoted\"", "list": []any{1, 2.5, true, nil}, "nested": map[string]any{"k": "v"}}
	in := NewEvent("ev-1", TypeRequest, data, "corr-1")
	out, err := s.process(t, inst, context.Background(), in)
	if err != nil {
		t.Fatalf("Process: %v", err)
	}
	if err := checkEcho(out, in, data, "corr-1"); err != nil {
		t.Fatal(err)
	}

	// No correlationid: the worker sees none (null in the echo).
	in = NewEvent("ev-2", TypeRequest, []any{"a", 1}, "")
	out, err = s.process(t, inst, context.Background(), in)
	if err != nil {
		t.Fatalf("Process (no correlationid): %v", err)
	}
	if err := checkEcho(out, in, []any{"a", 1}, ""); err != nil {
		t.Fatalf("no correlationid: %v", err)
	}
}

func (s *suite) echoLarge(t *testing.T) {
	inst := s.load(t, "echo-large", s.h.Fixtures.Echo, 0)
	for _, size := range []int{64 << 10, 1 << 20} {
		data := map[string]any{"blob": strings.Repeat("0123456789abcdef", size/16)}
		in := NewEvent(fmt.Sprintf("large-%d", size), TypeRequest, data, "corr-large")
		out, err := s.process(t, inst, context.Background(), in)
		if err != nil {
			t.Fatalf("Process (%d bytes): %v", size, err)
		}
		if err := checkEcho(out, in, data, "corr-large"); err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
	}
}

func (s *suite) multi(t *testing.T) {
	inst := s.load(t, "multi", s.h.Fixtures.Multi, 0)
	out, err := s.process(t, inst, context.Background(), NewEvent("ev-m", TypeRequest, map[string]any{"x": 1}, ""))
	if err != nil {
		t.Fatalf("Process: %v", err)
	}
	var types []string
	for _, ev := range out {
		types = append(types, ev.Type())
	}
	if !slices.Equal(types, []string{TypeA, TypeB}) {
		t.Fatalf("output types = %q, want %q", types, []string{TypeA, TypeB})
	}
}

func (s *suite) none(t *testing.T) {
	inst := s.load(t, "none", s.h.Fixtures.None, 0)
	out, err := s.process(t, inst, context.Background(), NewEvent("ev-n", TypeRequest, map[string]any{"x": 1}, ""))
	if err != nil {
		t.Fatalf("Process: %v", err)
	}
	if len(out) != 0 {
		t.Fatalf("got %d output events, want none", len(out))
	}
}

func (s *suite) raise(t *testing.T) {
	inst := s.load(t, "raise", s.h.Fixtures.Raise, 0)
	for i := range 2 {
		_, err := s.process(t, inst, context.Background(), NewEvent(fmt.Sprintf("ev-r%d", i), TypeRaise, map[string]any{"x": 1}, ""))
		if !errors.Is(err, engines.ErrWorkerFailed) {
			t.Fatalf("Process (raise #%d) = %v, want an error wrapping ErrWorkerFailed", i+1, err)
		}
		if !strings.Contains(err.Error(), "boom") {
			t.Fatalf("Process (raise #%d) = %q, want the message to contain \"boom\"", i+1, err)
		}
		// The instance still serves.
		data := map[string]any{"after": i}
		in := NewEvent(fmt.Sprintf("ev-ok%d", i), TypeRequest, data, "c")
		out, err := s.process(t, inst, context.Background(), in)
		if err != nil {
			t.Fatalf("Process after a failure: %v", err)
		}
		if err := checkEcho(out, in, data, "c"); err != nil {
			t.Fatalf("after a failure: %v", err)
		}
	}
}

// serves checks that inst answers a normal event correctly.
func (s *suite) serves(t *testing.T, inst engines.Instance, id string) {
	t.Helper()
	data := map[string]any{"id": id}
	in := NewEvent(id, TypeRequest, data, "corr-"+id)
	out, err := s.process(t, inst, context.Background(), in)
	if err != nil {
		t.Fatalf("Process %s: %v", id, err)
	}
	if err := checkEcho(out, in, data, "corr-"+id); err != nil {
		t.Fatalf("Process %s: %v", id, err)
	}
}

func (s *suite) timeout(t *testing.T) {
	inst := s.load(t, "hang", s.h.Fixtures.Hang, s.h.HangTimeout)
	s.serves(t, inst, "before-hang")
	_, err := s.process(t, inst, context.Background(), NewEvent("ev-h", TypeHang, map[string]any{"x": 1}, ""))
	if !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("Process (hang) = %v, want an error wrapping ErrTimeout", err)
	}
	if s.h.Engine.Info().Capabilities.Interruptible {
		s.serves(t, inst, "after-hang")
	}
}

func (s *suite) contextDeadline(t *testing.T) {
	inst := s.load(t, "hang-ctx", s.h.Fixtures.Hang, s.h.Wait)
	ctx, cancel := context.WithTimeout(context.Background(), s.h.HangTimeout)
	defer cancel()
	_, err := s.process(t, inst, ctx, NewEvent("ev-hc", TypeHang, map[string]any{"x": 1}, ""))
	if !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("Process (hang, ctx deadline) = %v, want an error wrapping ErrTimeout", err)
	}
	if s.h.Engine.Info().Capabilities.Interruptible {
		s.serves(t, inst, "after-ctx-deadline")
	}
}

func (s *suite) concurrent(t *testing.T) {
	const goroutines, calls = 8, 5
	inst := s.load(t, "concurrent", s.h.Fixtures.Echo, 0)
	errs := make(chan error, goroutines*calls)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range calls {
				id := fmt.Sprintf("g%d-c%d", g, c)
				data := map[string]any{"g": g, "c": c}
				in := NewEvent(id, TypeRequest, data, "corr-"+id)
				out, err := inst.Process(context.Background(), in)
				if err == nil {
					err = checkEcho(out, in, data, "corr-"+id)
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", id, err)
				}
			}
		}()
	}
	s.bounded(t, "concurrent Process calls", wg.Wait)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (s *suite) close(t *testing.T) {
	inst, err := s.tryLoad(t, "close", s.h.Fixtures.Echo, 0)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	defer s.closeQuietly(t, inst)
	s.serves(t, inst, "before-close")
	s.bounded(t, "Close", func() {
		ctx, cancel := s.ctx()
		defer cancel()
		err = inst.Close(ctx)
	})
	if err != nil {
		t.Errorf("Close of an idle instance = %v, want nil", err)
	}
	_, err = s.process(t, inst, context.Background(), NewEvent("after-close", TypeRequest, map[string]any{"x": 1}, ""))
	if err == nil {
		t.Error("Process after Close succeeded, want an error")
	}
	s.bounded(t, "second Close", func() {
		ctx, cancel := s.ctx()
		defer cancel()
		_ = inst.Close(ctx)
	})
}

func (s *suite) closeInterrupts(t *testing.T) {
	inst, err := s.tryLoad(t, "close-hang", s.h.Fixtures.Hang, s.h.Wait)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	defer s.closeQuietly(t, inst)
	s.serves(t, inst, "before-close")
	callErr := make(chan error, 1)
	go func() {
		_, err := inst.Process(context.Background(), NewEvent("hang-at-close", TypeHang, map[string]any{"x": 1}, ""))
		callErr <- err
	}()
	// Give the call a moment to reach the worker (if it has not, Close
	// rejects it instead, which is fine too).
	time.Sleep(100 * time.Millisecond)
	s.bounded(t, "Close with a hanging call", func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.h.HangTimeout)
		defer cancel()
		_ = inst.Close(ctx)
	})
	if !s.h.Engine.Info().Capabilities.Interruptible {
		return
	}
	timer := time.NewTimer(s.h.Wait)
	defer timer.Stop()
	select {
	case err := <-callErr:
		if err == nil {
			t.Error("the hanging call succeeded after Close, want an error")
		}
	case <-timer.C:
		t.Fatalf("the hanging call did not return within %v of Close", s.h.Wait)
	}
}
