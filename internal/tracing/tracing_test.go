package tracing

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

func TestEnabledByTheStandardVariables(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4317", "OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		if got := Enabled(func(k string) string { return c.env[k] }); got != c.want {
			t.Errorf("%v: enabled %v, want %v", c.env, got, c.want)
		}
	}
}

func TestSetupOffAndOn(t *testing.T) {
	log := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	tr, err := Setup(context.Background(), log, "svc")
	if err != nil || tr.On() {
		t.Fatalf("without an endpoint: on %v, err %v", tr.On(), err)
	}
	if i, _ := tr.TemporalInterceptors(); i != nil {
		t.Fatal("Temporal interceptors while off")
	}
	for _, proto := range []string{"", "grpc", "http/protobuf"} {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
		tr, err := Setup(context.Background(), log, "svc")
		if err != nil || !tr.On() {
			t.Fatalf("protocol %q: on %v, err %v", proto, tr.On(), err)
		}
		if i, err := tr.TemporalInterceptors(); err != nil || len(i) != 1 {
			t.Fatalf("Temporal interceptors %v, %v", i, err)
		}
		_, span := tr.Provider.Tracer("t").Start(context.Background(), "s")
		if !span.SpanContext().IsValid() {
			t.Fatal("no recording span while on")
		}
		span.End()
		// Nothing listens: shutdown gives up within its timeout.
		start := time.Now()
		_ = tr.Shutdown(context.Background(), 200*time.Millisecond)
		if time.Since(start) > 5*time.Second {
			t.Fatalf("shutdown took %s", time.Since(start))
		}
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, err := Setup(context.Background(), log, "svc"); err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Fatalf("http/json: %v", err)
	}
}

func spanCtx(t *testing.T) context.Context {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	return trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
}

func TestInjectGRPC(t *testing.T) {
	ctx := InjectGRPC(spanCtx(t), propagation.TraceContext{})
	md, _ := metadata.FromOutgoingContext(ctx)
	if got := md.Get("traceparent"); len(got) != 1 || got[0] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Fatalf("traceparent metadata %v", got)
	}
	plain := context.Background()
	if InjectGRPC(plain, propagation.TraceContext{}) != plain || InjectGRPC(spanCtx(t), nil) == nil {
		t.Fatal("a context without a span changed")
	}
}

func TestLogHandlerAddsTraceID(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewTextHandler(&buf, nil))).With("worker_id", "w1")
	log.InfoContext(spanCtx(t), "traced")
	log.Info("plain")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if !strings.Contains(lines[0], "trace_id=4bf92f3577b34da6a3ce929d0e0e4736") || !strings.Contains(lines[0], "span_id=00f067aa0ba902b7") ||
		!strings.Contains(lines[0], "worker_id=w1") {
		t.Errorf("traced line %q", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("plain line %q", lines[1])
	}
}

func TestExtensionCarrier(t *testing.T) {
	ext := map[string]any{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "n": 3}
	ctx := propagation.TraceContext{}.Extract(context.Background(), ExtensionCarrier(ext))
	if sc := trace.SpanContextFromContext(ctx); !sc.IsRemote() || sc.SpanID().String() != "00f067aa0ba902b7" {
		t.Fatalf("extracted %v", sc)
	}
	if ExtensionCarrier(nil).Get("traceparent") != "" || ExtensionCarrier(ext).Get("n") != "" {
		t.Fatal("non-string or missing extensions must read empty")
	}
}
