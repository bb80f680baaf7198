package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/internal/tracing"
)

// CloudEvent extensions of the W3C trace context (the CloudEvents
// distributed tracing extension), and Dapr's legacy copy of traceparent:
// daprd keeps the traceparent of a published structured CloudEvent only
// when it also has a traceid; otherwise it puts its own span there.
const (
	TraceParentExtension = "traceparent"
	TraceStateExtension  = "tracestate"
	TraceIDExtension     = "traceid"
)

// Span attributes of a worker's attempt at a message.
const (
	attrWorkerID      = attribute.Key("workmanager.worker.id")
	attrWorkerGroup   = attribute.Key("workmanager.worker.group")
	attrWorkerEngine  = attribute.Key("workmanager.worker.engine")
	attrAttempt       = attribute.Key("workmanager.attempt")
	attrCorrelationID = attribute.Key("workmanager.correlation_id")
	attrOutcome       = attribute.Key("workmanager.outcome")
	attrOutputs       = attribute.Key("workmanager.outputs")
	attrTopic         = attribute.Key("messaging.destination.name")
	attrMessageID     = attribute.Key("messaging.message.id")
	attrEventSource   = attribute.Key("cloudevents.event_source")
	attrEventType     = attribute.Key("cloudevents.event_type")
	attrErrorType     = attribute.Key("error.type")
)

func workerSpanAttrs(w Worker) []attribute.KeyValue {
	a := []attribute.KeyValue{
		attribute.String("messaging.system", "dapr"),
		attribute.String("messaging.operation.type", "process"),
		attrTopic.String(w.Topic),
		attrWorkerID.String(w.ID),
		attrWorkerEngine.String(w.Engine),
	}
	if w.Group != "" {
		a = append(a, attrWorkerGroup.String(w.Group))
	}
	return a
}

// startSpan starts w's span for its attempt at m, a child of the trace
// context m carries (a new trace when it carries none).
func (d *Dispatcher) startSpan(ctx context.Context, w *worker, m *message, r *result) (context.Context, trace.Span) {
	ctx = d.Propagator.Extract(ctx, tracing.ExtensionCarrier(m.ec.Extensions))
	attrs := make([]attribute.KeyValue, 0, len(w.spanAttrs)+5)
	attrs = append(attrs, w.spanAttrs...)
	attrs = append(attrs, attrMessageID.String(m.id), attrAttempt.Int(int(r.attempt)),
		attrEventSource.String(m.req.GetSource()), attrEventType.String(m.req.GetType()))
	if c, ok := m.correlation.(string); ok && m.hasCorrelation {
		attrs = append(attrs, attrCorrelationID.String(c))
	}
	ctx, span := d.tracer.Start(ctx, w.spanName, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	r.trace = span.SpanContext().TraceID()
	return ctx, span
}

// endSpan records the attempt's outcome on its span and ends it.
func (d *Dispatcher) endSpan(span trace.Span, r *result, outputs int) {
	switch r.outcome {
	case outcomeDone:
		span.SetAttributes(attrOutcome.String("done"), attrOutputs.Int(outputs))
	case outcomeFailed:
		span.SetAttributes(attrOutcome.String("failed"), attrErrorType.String(string(r.reason)))
		span.SetStatus(codes.Error, d.publicText(errorText(r.err)))
	case outcomeCut:
		span.SetAttributes(attrOutcome.String("cut"))
	}
	span.End()
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// traceContext is the W3C trace context of ctx's span, to put on outputs:
// its traceparent and tracestate.
func (d *Dispatcher) traceContext(ctx context.Context) (string, string) {
	c := make(propagation.MapCarrier, 2)
	d.Propagator.Inject(ctx, c)
	return c[TraceParentExtension], c[TraceStateExtension]
}

// inputTraceContext is the trace context of outputs with tracing off: the
// input's when it carries a valid one (the node is not a hop of the trace,
// and its outputs continue the input's context unchanged, as an
// OpenTelemetry SDK without an exporter would), else rootTraceContext.
func inputTraceContext(m *message) (string, string) {
	if !inputTraceID(m).IsValid() {
		return rootTraceContext(m), ""
	}
	tp := m.ec.Extensions[TraceParentExtension].(string) // inputTraceID checked it
	if _, err := trace.SpanIDFromHex(tp[36:52]); err != nil || tp[35] != '-' {
		return rootTraceContext(m), ""
	}
	ts, _ := m.ec.Extensions[TraceStateExtension].(string)
	return tp, ts
}

// rootTraceContext is the trace the node starts for an input that carries
// none, or an invalid one such as the all-zero traceparent daprd 1.14 puts
// on a structured CloudEvent published without "traceid": a traceparent
// derived from the event's source and id (so every output of the event, on
// every attempt and node, is in one trace), not sampled (flags 00). Without
// it daprd would stamp the outputs with its all-zero traceparent.
func rootTraceContext(m *message) string {
	h := sha256.Sum256([]byte(m.ec.Source.String() + "\x00" + m.ec.ID))
	h[15] |= 1 // never the invalid all-zero trace id
	h[23] |= 1 // nor the all-zero span id
	return "00-" + hex.EncodeToString(h[:16]) + "-" + hex.EncodeToString(h[16:24]) + "-00"
}

// setTraceContext puts a trace context on an output: traceparent,
// tracestate (removed when there is none) and Dapr's traceid, so that
// daprd keeps the traceparent as it is.
func setTraceContext(o *event.Event, tp, ts string) {
	oc := o.Context.(*event.EventContextV1) // completeOutput made it one
	if oc.Extensions == nil {
		oc.Extensions = make(map[string]any, 3)
	}
	oc.Extensions[TraceParentExtension] = tp
	oc.Extensions[TraceIDExtension] = tp
	if ts != "" {
		oc.Extensions[TraceStateExtension] = ts
	} else {
		delete(oc.Extensions, TraceStateExtension)
	}
}

// logAttrs are the attributes that tie a log line to a message: its trace
// (the attempt's span's, else the input's traceparent's) and correlation id.
func logAttrs(m *message, tid trace.TraceID) []any {
	var a []any
	if !tid.IsValid() {
		tid = inputTraceID(m)
	}
	if tid.IsValid() {
		a = append(a, slog.String("trace_id", tid.String()))
	}
	if m.hasCorrelation {
		a = append(a, slog.Any(CorrelationExtension, m.correlation))
	}
	return a
}

// inputTraceID is the trace id of the input's traceparent (zero without).
func inputTraceID(m *message) trace.TraceID {
	tp, _ := m.ec.Extensions[TraceParentExtension].(string)
	// version "-" trace-id "-" parent-id "-" flags
	if len(tp) < 55 || tp[2] != '-' {
		return trace.TraceID{}
	}
	tid, err := trace.TraceIDFromHex(tp[3:35])
	if err != nil {
		return trace.TraceID{}
	}
	return tid
}
