package gateway_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dapr "github.com/dapr/go-sdk/client"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/gateway"
)

// TestCallThroughRealDapr invokes an HTTP backend through daprd's service
// invocation (an HTTPEndpoint resource), as native workers' gateway_call does.
func TestCallThroughRealDapr(t *testing.T) {
	var calls atomic.Int32
	var fence atomic.Value // "<group>/<token>" seen by the backend
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		fence.Store(r.Header.Get(gateway.FencingGroupHeader) + "/" + r.Header.Get(gateway.FencingTokenHeader))
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"method":"` + r.Method + `","path":"` + r.URL.Path + `","got":` + string(body) + `}`))
	}))
	defer backend.Close()
	_, conn := devstack.StartT(t, devstack.Options{
		ExtraResources: map[string]string{"pricing.yaml": devstack.HTTPEndpoint("pricing", backend.URL)}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := gateway.NewDapr(dapr.NewClientWithConnection(conn), 10*time.Second)
	resp, err := g.Call(ctx, "pricing", "quote", []byte(`{"sku":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"method":"POST","path":"/quote","got":{"sku":"a"}}`; string(resp) != want {
		t.Fatalf("response %s, want %s", resp, want)
	}
	if calls.Load() != 1 || fence.Load() != "/" {
		t.Fatalf("calls %d, fence %v: an unfenced call carries no token", calls.Load(), fence.Load())
	}

	// Under a group lock: checked first, the token reaches the backend.
	checks := 0
	held := &engines.Fence{Group: "g1", Token: 7, Check: func(context.Context) error { checks++; return nil }}
	if _, err := g.Call(engines.WithFence(ctx, held), "pricing", "quote", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if checks != 1 || calls.Load() != 2 || fence.Load() != "g1/7" {
		t.Fatalf("checks %d, calls %d, fence seen %v; want 1, 2, g1/7", checks, calls.Load(), fence.Load())
	}
	stale := errors.New("grouplock g1 token 7: stale lease")
	lost := &engines.Fence{Group: "g1", Token: 7, Check: func(context.Context) error { return stale }}
	if _, err := g.Call(engines.WithFence(ctx, lost), "pricing", "quote", []byte(`{}`)); !errors.Is(err, gateway.ErrFence) || !errors.Is(err, stale) {
		t.Fatalf("call under a lost lock: %v", err)
	}
	if calls.Load() != 2 {
		t.Fatal("a call under a lost lock reached the backend")
	}

	if _, err := g.Call(ctx, "no-such-service", "x", nil); err == nil || !strings.Contains(err.Error(), "no-such-service") {
		t.Fatalf("unknown service: %v", err)
	}
	if _, err := g.Call(ctx, "", "x", nil); err == nil {
		t.Fatal("empty service accepted")
	}
}

// TestCallCarriesTraceContext: a call made in a traced attempt (its ctx
// carries the worker's span) reaches the backend through daprd with a
// traceparent of the same trace, and without the span none is made up.
func TestCallCarriesTraceContext(t *testing.T) {
	var seen atomic.Value
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("traceparent"))
		_, _ = w.Write([]byte(`{}`))
	}))
	defer backend.Close()
	_, conn := devstack.StartT(t, devstack.Options{
		ExtraResources: map[string]string{"pricing.yaml": devstack.HTTPEndpoint("pricing", backend.URL)}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g := gateway.NewDapr(dapr.NewClientWithConnection(conn), 10*time.Second)
	g.Propagator = propagation.TraceContext{}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	tid, _ := trace.TraceIDFromHex(traceID)
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	traced := trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	if _, err := g.Call(traced, "pricing", "quote", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	tp, _ := seen.Load().(string)
	if !strings.HasPrefix(tp, "00-"+traceID+"-") {
		t.Fatalf("backend got traceparent %q, want trace %s", tp, traceID)
	}
	t.Logf("sent 00-%s-00f067aa0ba902b7-01; the backend got %s", traceID, tp)
}
