package dispatch_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/dispatch/dispatchtest"
	"github.com/virtufin/workmanager/internal/publish/publishtest"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/testsink"
	"github.com/virtufin/workmanager/internal/tracing"
)

const (
	inTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	inSpanID  = "00f067aa0ba902b7"
	inParent  = "00-" + inTraceID + "-" + inSpanID + "-01"
)

// tracedDispatcher is a dispatcher tracing into an in-memory recorder,
// logging into buf.
func tracedDispatcher(t *testing.T, cfg dispatch.Config) (*dispatch.Dispatcher, *dispatchtest.Broker, *publishtest.Recorder, *tracetest.SpanRecorder, *testsink.Buffer) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	deps := testDeps(b, pub, state.NewMemoryStore())
	deps.TracerProvider, deps.Propagator = tp, propagation.TraceContext{}
	buf := &testsink.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	log := slog.New(tracing.LogHandler(slog.NewTextHandler(buf, nil)))
	if cfg.PubSub == "" {
		cfg.PubSub, cfg.NodeID, cfg.MaxConcurrency = "pubsub", "n1", 1
	}
	return dispatch.New(ctx, log, deps, cfg), b, pub, rec, buf
}

func tracedRequest(id, traceparent, tracestate string) *dispatchtestRequest {
	req := request(id, "corr-9")
	fields := map[string]any{"correlationid": "corr-9"}
	if traceparent != "" {
		fields["traceparent"] = traceparent
	}
	if tracestate != "" {
		fields["tracestate"] = tracestate
	}
	req.Extensions, _ = structpb.NewStruct(fields)
	return req
}

type dispatchtestRequest = runtimev1.TopicEventRequest

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, a := range s.Attributes() {
		m[a.Key] = a.Value
	}
	return m
}

// waitSpans waits until the recorder holds n ended spans.
func waitSpans(t *testing.T, rec *tracetest.SpanRecorder, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if s := rec.Ended(); len(s) >= n {
			return s
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%d spans ended, want %d", len(rec.Ended()), n)
	return nil
}

// One span per worker per message, a child of the input's traceparent,
// with the worker's and message's attributes; each output carries the
// span's own trace context, and so does the engine's ctx (gateway calls).
func TestWorkerSpanContinuesInputTraceAndOutputsCarryIt(t *testing.T) {
	d, b, pub, rec, _ := tracedDispatcher(t, dispatch.Config{})
	var callCtx trace.SpanContext
	var mu sync.Mutex
	d.Attach(dispatch.Worker{ID: "w1", Topic: "in", Group: "", Engine: "python"}, &dispatchtest.FuncInstance{Fn: outputs("out.a", "out.b"),
		Ctx: func(ctx context.Context) { mu.Lock(); callCtx = trace.SpanContextFromContext(ctx); mu.Unlock() }})
	d.Attach(dispatch.Worker{ID: "w2", Topic: "in", Engine: "native"}, &dispatchtest.FuncInstance{Fn: outputs()})
	s := waitStream(t, b, "in")
	s.In <- tracedRequest("m1", inParent, "vendor=x")
	if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
		t.Fatalf("ack %+v", a)
	}
	spans := waitSpans(t, rec, 2)
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		byName[sp.Name()] = sp
	}
	w1 := byName["worker w1"]
	if w1 == nil || byName["worker w2"] == nil {
		t.Fatalf("spans %v", spans)
	}
	for _, sp := range spans {
		if sp.SpanContext().TraceID().String() != inTraceID || sp.Parent().SpanID().String() != inSpanID || !sp.Parent().IsRemote() {
			t.Errorf("%s: trace %s parent %s, want trace %s parent %s", sp.Name(), sp.SpanContext().TraceID(), sp.Parent().SpanID(), inTraceID, inSpanID)
		}
		if sp.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("%s: kind %v", sp.Name(), sp.SpanKind())
		}
	}
	a := attrs(w1)
	want := map[attribute.Key]any{"workmanager.worker.id": "w1", "messaging.destination.name": "in", "workmanager.worker.engine": "python",
		"workmanager.attempt": int64(1), "messaging.message.id": "m1", "workmanager.correlation_id": "corr-9",
		"workmanager.outcome": "done", "workmanager.outputs": int64(2)}
	for k, v := range want {
		if got := a[k].AsInterface(); got != v {
			t.Errorf("attribute %s = %v, want %v", k, got, v)
		}
	}
	mu.Lock()
	if callCtx.SpanID() != w1.SpanContext().SpanID() {
		t.Errorf("the engine's ctx carries span %s, want w1's %s", callCtx.SpanID(), w1.SpanContext().SpanID())
	}
	mu.Unlock()
	outs := pub.All()
	if len(outs) != 2 {
		t.Fatalf("%d outputs", len(outs))
	}
	wantTP := "00-" + inTraceID + "-" + w1.SpanContext().SpanID().String() + "-01"
	for _, o := range outs {
		ext := o.Event.Extensions()
		if ext[dispatch.TraceParentExtension] != wantTP || ext[dispatch.TraceIDExtension] != wantTP || ext[dispatch.TraceStateExtension] != "vendor=x" {
			t.Errorf("output %s: traceparent %v traceid %v tracestate %v, want %s and vendor=x", o.Event.Type(),
				ext[dispatch.TraceParentExtension], ext[dispatch.TraceIDExtension], ext[dispatch.TraceStateExtension], wantTP)
		}
	}
}

// Without a traceparent the span starts a trace; a worker's own
// traceparent on an output is replaced by its span's.
func TestWorkerSpanWithoutInputTrace(t *testing.T) {
	d, b, pub, rec, _ := tracedDispatcher(t, dispatch.Config{})
	d.Attach(dispatch.Worker{ID: "w1", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(*event.Event) ([]event.Event, error) {
		e := event.New()
		e.SetType("out")
		e.SetExtension("traceparent", inParent)
		return []event.Event{e}, nil
	}})
	s := waitStream(t, b, "in")
	s.In <- tracedRequest("m1", "", "")
	waitAck(t, b)
	sp := waitSpans(t, rec, 1)[0]
	if sp.Parent().IsValid() || !sp.SpanContext().IsValid() {
		t.Fatalf("span parent %v context %v", sp.Parent(), sp.SpanContext())
	}
	tp := pub.All()[0].Event.Extensions()[dispatch.TraceParentExtension]
	if want := "00-" + sp.SpanContext().TraceID().String() + "-" + sp.SpanContext().SpanID().String() + "-01"; tp != want {
		t.Fatalf("output traceparent %v, want %s", tp, want)
	}
	if _, ok := pub.All()[0].Event.Extensions()[dispatch.TraceStateExtension]; ok {
		t.Fatal("tracestate without one on the input")
	}
}

// A failed attempt's span has status Error, its reason as error.type and
// its attempt number; the log lines of the failure and the dead letter
// carry trace_id and correlationid.
func TestFailedAttemptSpanAndLogs(t *testing.T) {
	d, b, pub, rec, logs := tracedDispatcher(t, dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1, MaxAttempts: 2, RetryBackoff: time.Nanosecond})
	d.Attach(dispatch.Worker{ID: "w1", Topic: "in"}, &dispatchtest.FuncInstance{Fn: func(*event.Event) ([]event.Event, error) {
		return nil, fmt.Errorf("%w: boom", engines.ErrWorkerFailed)
	}})
	s := waitStream(t, b, "in")
	for i := range 2 {
		s.In <- tracedRequest("m1", inParent, "")
		if a := waitAck(t, b); (i == 0) != (a.Status == dispatch.AckRetry) {
			t.Fatalf("delivery %d: ack %+v", i, a)
		}
	}
	spans := waitSpans(t, rec, 2)
	for i, sp := range spans {
		a := attrs(sp)
		if sp.Status().Code != codes.Error || !strings.Contains(sp.Status().Description, "boom") ||
			a["error.type"].AsString() != "worker_failed" || a["workmanager.outcome"].AsString() != "failed" || a["workmanager.attempt"].AsInt64() != int64(i+1) {
			t.Errorf("span %d: status %v attributes %v", i, sp.Status(), a)
		}
	}
	if len(pub.On("in-dead")) != 1 {
		t.Fatalf("dead letters %d", len(pub.On("in-dead")))
	}
	out := logs.String()
	for _, msg := range []string{"worker attempt failed", "message dead-lettered"} {
		var line string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, msg) {
				line = l
			}
		}
		if !strings.Contains(line, "trace_id="+inTraceID) || !strings.Contains(line, "correlationid=corr-9") || !strings.Contains(line, "worker_id=w1") {
			t.Errorf("log line %q lacks trace_id, correlationid or worker_id", line)
		}
	}
}

// With tracing off the node is not a hop of the trace: outputs carry the
// input's valid trace context unchanged (traceparent, traceid, tracestate).
// When the input's is missing or invalid (daprd's all-zero one), the node
// starts a trace of the event's own (derived from its source and id: the
// same on every delivery), never an all-zero one, and no empty tracestate.
func TestTracingOffPassesInputTraceContextOn(t *testing.T) {
	b, pub := dispatchtest.NewBroker(), &publishtest.Recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	d := dispatch.New(ctx, slog.New(slog.DiscardHandler), testDeps(b, pub, state.NewMemoryStore()), dispatch.Config{PubSub: "pubsub", NodeID: "n1", MaxConcurrency: 1})
	d.Attach(dispatch.Worker{ID: "w1", Topic: "in"}, &dispatchtest.FuncInstance{Fn: outputs("out")})
	s := waitStream(t, b, "in")
	cases := []struct{ id, tp, ts, want string }{
		{"valid", inParent, "vendor=x", inParent},
		{"zero", "00-00000000000000000000000000000000-0000000000000000-00", "", "root"},
		{"zero-span", "00-" + inTraceID + "-0000000000000000-01", "", "root"},
		{"garbage", "not a traceparent", "", "root"},
		{"none", "", "", "root"},
	}
	roots := map[string]string{}
	for _, c := range cases {
		s.In <- tracedRequest(c.id, c.tp, c.ts)
		if a := waitAck(t, b); a.Status != dispatch.AckSuccess {
			t.Fatalf("%s: ack %+v", c.id, a)
		}
		outs := pub.On("out")
		x := outs[len(outs)-1].Extensions()
		got, _ := x[dispatch.TraceParentExtension].(string)
		if id, _ := x[dispatch.TraceIDExtension].(string); id != got {
			t.Errorf("%s: output traceid %q, traceparent %q: want them equal", c.id, id, got)
		}
		if c.want != "root" {
			if got != c.want {
				t.Errorf("%s: output traceparent %q, want %q", c.id, got, c.want)
			}
			if ts, _ := x[dispatch.TraceStateExtension].(string); ts != c.ts {
				t.Errorf("%s: output tracestate %q, want %q", c.id, ts, c.ts)
			}
			continue
		}
		tp, err := propagationParse(got)
		if err != nil || strings.Contains(got, "00000000000000000000000000000000") || strings.Contains(got, "-0000000000000000-") {
			t.Errorf("%s: output traceparent %q is not a valid new trace (%v)", c.id, got, err)
		}
		if _, ok := x[dispatch.TraceStateExtension]; ok {
			t.Errorf("%s: output carries a tracestate %v, want none", c.id, x[dispatch.TraceStateExtension])
		}
		roots[tp] = c.id
	}
	if len(roots) != 4 {
		t.Errorf("traces started %v: want one of its own per event", roots)
	}
}

// propagationParse returns the trace id of a W3C traceparent, or an error
// when it is not a valid one.
func propagationParse(tp string) (string, error) {
	ctx := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", fmt.Errorf("invalid traceparent %q", tp)
	}
	return sc.TraceID().String(), nil
}
