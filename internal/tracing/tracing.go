// Package tracing owns OpenTelemetry traces: a tracer provider built from
// the standard OTEL_* environment (on only when an OTLP endpoint is set), the
// W3C Trace Context propagator, its shutdown, carrying trace context on
// outgoing gRPC calls to daprd, and trace ids in log lines.
//
// Nothing here is a global of WorkManager's: the node and the API build one
// Tracing and pass its Provider and Propagator to the packages that trace.
// Setup also installs them as OpenTelemetry's globals (and OpenTelemetry's
// error handler, which logs through slog), so that libraries that only read
// the globals agree with them.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/metadata"
)

// Tracing is the process's tracing: a real provider exporting over OTLP, or
// (off) a no-op one.
type Tracing struct {
	// Provider makes the tracers (a no-op provider when off).
	Provider trace.TracerProvider
	// Propagator reads and writes W3C traceparent/tracestate.
	Propagator propagation.TextMapPropagator
	// Exporter describes where spans go ("" when off), for the start-up log.
	Exporter string

	sdk *sdktrace.TracerProvider
}

// Enabled reports whether the environment turns tracing on: an OTLP
// endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), and neither OTEL_SDK_DISABLED=true
// nor OTEL_TRACES_EXPORTER=none says otherwise.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none") {
		return false
	}
	return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")) != "" ||
		strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) != ""
}

// On reports whether spans are recorded and exported.
func (t *Tracing) On() bool { return t != nil && t.sdk != nil }

// Off is tracing turned off: a no-op provider, the W3C propagator.
func Off() *Tracing {
	return &Tracing{Provider: noop.NewTracerProvider(), Propagator: propagation.TraceContext{}}
}

// Setup builds the process's tracing from the environment (os.Getenv).
// Off (no OTLP endpoint) it returns Off(). On, the OTel SDK reads the
// standard variables itself: OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT,
// _HEADERS, _INSECURE, _TIMEOUT, _COMPRESSION, _CERTIFICATE;
// OTEL_TRACES_SAMPLER[_ARG]; OTEL_BSP_*; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES. OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL picks
// "grpc" (default) or "http/protobuf". service is the default service name
// (OTEL_SERVICE_NAME wins); attrs are added to the resource
// (OTEL_RESOURCE_ATTRIBUTES wins).
func Setup(ctx context.Context, log *slog.Logger, service string, attrs ...attribute.KeyValue) (*Tracing, error) {
	if !Enabled(os.Getenv) {
		return Off(), nil
	}
	protocol := strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if protocol == "" {
		protocol = strings.TrimSpace(os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch protocol {
	case "", "grpc":
		protocol = "grpc"
		exp, err = otlptracegrpc.New(ctx)
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	attrs = append([]attribute.KeyValue{attribute.String("service.name", service)}, attrs...)
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	// The sampler comes from OTEL_TRACES_SAMPLER (default: parent-based,
	// always on), the batch processor's settings from OTEL_BSP_*.
	sdk := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t := &Tracing{Provider: sdk, Propagator: propagation.TraceContext{}, sdk: sdk, Exporter: "otlp " + protocol}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("opentelemetry", "err", err) }))
	otel.SetTracerProvider(sdk)
	otel.SetTextMapPropagator(t.Propagator)
	return t, nil
}

// Shutdown exports the spans still buffered and stops the exporter, giving
// up after timeout (or when ctx ends).
func (t *Tracing) Shutdown(ctx context.Context, timeout time.Duration) error {
	if !t.On() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return t.sdk.Shutdown(ctx)
}

// InjectGRPC returns ctx with the trace context of its span added to the
// outgoing gRPC metadata (traceparent, tracestate), which daprd continues:
// its publish and service invocation spans become children of it, and the
// invoked app gets the traceparent header. ctx is returned as it is when it
// carries no valid span or p is nil.
func InjectGRPC(ctx context.Context, p propagation.TextMapPropagator) context.Context {
	if p == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	var c mdCarrier
	p.Inject(ctx, &c)
	if len(c) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, c...)
}

// mdCarrier collects injected key/value pairs for AppendToOutgoingContext.
type mdCarrier []string

func (c *mdCarrier) Get(string) string { return "" }
func (c *mdCarrier) Set(k, v string)   { *c = append(*c, k, v) }
func (c *mdCarrier) Keys() []string {
	keys := make([]string, 0, len(*c)/2)
	for i := 0; i < len(*c); i += 2 {
		keys = append(keys, (*c)[i])
	}
	return keys
}

// ExtensionCarrier reads and writes W3C trace context as CloudEvent
// extensions (traceparent, tracestate: the CloudEvents distributed tracing
// extension); only string values are read.
type ExtensionCarrier map[string]any

func (c ExtensionCarrier) Get(k string) string {
	s, _ := c[k].(string)
	return s
}

func (c ExtensionCarrier) Set(k, v string) { c[k] = v }

func (c ExtensionCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// LogHandler wraps h: a record logged with a context that carries a valid
// span gets its trace_id and span_id attributes.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r = r.Clone()
			r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}
func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }
