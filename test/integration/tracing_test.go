package integration

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/dispatch"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// otlpReceiver is an in-process OTLP/gRPC trace collector: it keeps every
// span exported to it, with the service.name of its resource.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []gotSpan
}

type gotSpan struct {
	service string
	*tracepb.Span
}

func (s gotSpan) traceID() string { return hex.EncodeToString(s.TraceId) }
func (s gotSpan) spanID() string  { return hex.EncodeToString(s.SpanId) }
func (s gotSpan) parentID() string {
	return hex.EncodeToString(s.ParentSpanId)
}

func (s gotSpan) attr(k string) string {
	for _, a := range s.Attributes {
		if a.Key == k {
			if v := a.Value.GetStringValue(); v != "" {
				return v
			}
			return fmt.Sprint(a.Value.GetIntValue())
		}
	}
	return ""
}

func (r *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.Key == "service.name" {
				service = a.Value.GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, gotSpan{service: service, Span: sp})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// find returns the spans that match.
func (r *otlpReceiver) find(match func(gotSpan) bool) []gotSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []gotSpan
	for _, s := range r.spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

func startOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &otlpReceiver{}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return r, ln.Addr().String()
}

// traceparent splits a W3C traceparent into its trace and span ids.
func traceparent(t *testing.T, tp any) (traceID, spanID string) {
	t.Helper()
	s, _ := tp.(string)
	p := strings.Split(s, "-")
	if len(p) != 4 || len(p[1]) != 32 || len(p[2]) != 16 {
		t.Fatalf("not a traceparent: %v", tp)
	}
	return p[1], p[2]
}

// TestTraces runs the node and the API with tracing on, exporting to an
// in-process OTLP receiver. A CloudEvent published with a known
// traceparent reaches a Python worker; the node's span for that worker is
// a child of the traceparent the worker saw, in the same trace; the
// output, as a subscriber receives it, carries the same trace, its parent
// the worker's span. CreateWorker is one trace from the API's server span
// through the Temporal update to the node's activities.
func TestTraces(t *testing.T) {
	inTurn(t)
	recv, addr := startOTLPReceiver(t)
	otel := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addr, "OTEL_EXPORTER_OTLP_INSECURE=true", "OTEL_BSP_SCHEDULE_DELAY=100"}
	e := newEnvWith(t, envConfig{nodeEnv: otel, apiEnv: otel})
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	id := e.createWith(t, &pb.CreateWorkerRequest{Topic: in, Code: pyCode([]byte(fmt.Sprintf(`
def process(event):
    return {"type": %q, "data": {"id": event["id"], "traceparent": event.get("traceparent"), "traceid": event.get("traceid")}}
`, out)))})

	// CreateWorker: the API's server span, the update, and the node's
	// activities, in one trace.
	var create gotSpan
	waitFor(t, 30*time.Second, "the API's CreateWorker span", func() bool {
		s := recv.find(func(s gotSpan) bool {
			return s.service == "workmanager-api" && strings.HasSuffix(s.Name, "WorkManagerService/CreateWorker")
		})
		if len(s) > 0 {
			create = s[0]
		}
		return len(s) > 0
	})
	waitFor(t, 30*time.Second, "workflow and activity spans in CreateWorker's trace", func() bool {
		in := func(prefix, service string) bool {
			return len(recv.find(func(s gotSpan) bool {
				return s.traceID() == create.traceID() && strings.HasPrefix(s.Name, prefix) && (service == "" || s.service == service)
			})) > 0
		}
		return in("UpdateWithStartWorkflow:", "workmanager-api") && in("HandleUpdate:", "workmanager-node") &&
			in("StartActivity:", "workmanager-node") && in("RunActivity:", "workmanager-node")
	})

	// A traced client publishes: the traceparent is on the CloudEvent and
	// on the request (daprd continues the header, and keeps the event's
	// traceparent only when it also carries Dapr's traceid).
	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	tp := "00-" + traceID + "-" + parentID + "-01"
	publishTraced(t, e, in, map[string]any{"id": "traced-1", "type": "test.input", "traceparent": tp, "tracestate": "wm=test",
		"datacontenttype": "application/json", "data": map[string]any{"n": 1}}, tp)
	waitFor(t, 60*time.Second, "the output of traced-1", func() bool { return len(outs.get(firstOutputID("traced-1", id))) > 0 })
	o := outs.get(firstOutputID("traced-1", id))[0]
	var seen struct{ Traceparent string }
	if err := json.Unmarshal(o.Data(), &seen); err != nil {
		t.Fatal(err)
	}
	t.Logf("published with traceparent %s on the CloudEvent and the request; the worker saw %q", tp, seen.Traceparent)
	seenTrace, seenSpan := traceparent(t, seen.Traceparent)
	if seenTrace != traceID {
		t.Fatalf("the worker saw trace %s (traceparent %s), want %s", seenTrace, seen.Traceparent, traceID)
	}
	var span gotSpan
	waitFor(t, 30*time.Second, "the node's span of worker "+id, func() bool {
		s := recv.find(func(s gotSpan) bool {
			return s.service == "workmanager-node" && s.Name == "worker "+id && s.traceID() == traceID
		})
		if len(s) > 0 {
			span = s[0]
		}
		return len(s) > 0
	})
	if span.parentID() != seenSpan {
		t.Errorf("worker span's parent %s, want the input's span %s", span.parentID(), seenSpan)
	}
	if span.Kind != tracepb.Span_SPAN_KIND_CONSUMER || span.attr("workmanager.worker.id") != id || span.attr("messaging.destination.name") != in ||
		span.attr("messaging.message.id") != "traced-1" || span.attr("workmanager.outcome") != "done" || span.attr("workmanager.attempt") != "1" {
		t.Errorf("worker span: kind %v attributes %v", span.Kind, span.Attributes)
	}
	outTrace, outParent := traceparent(t, o.Extensions()[dispatch.TraceParentExtension])
	if outTrace != traceID || outParent != span.spanID() {
		t.Errorf("output traceparent %v: want trace %s, parent the worker span %s", o.Extensions()[dispatch.TraceParentExtension], traceID, span.spanID())
	}
	if ts := o.Extensions()[dispatch.TraceStateExtension]; ts != "wm=test" {
		t.Errorf("output tracestate %v, want wm=test", ts)
	}

	// Only on the CloudEvent (no header, no traceid): what daprd makes of
	// it is logged, not asserted (it puts its own span there).
	publishTraced(t, e, in, map[string]any{"id": "traced-2", "type": "test.input", "traceparent": tp,
		"datacontenttype": "application/json", "data": map[string]any{"n": 2}}, "")
	waitFor(t, 60*time.Second, "the output of traced-2", func() bool { return len(outs.get(firstOutputID("traced-2", id))) > 0 })
	if err := json.Unmarshal(outs.get(firstOutputID("traced-2", id))[0].Data(), &seen); err != nil {
		t.Fatal(err)
	}
	t.Logf("published with traceparent %s on the CloudEvent only; the worker saw %q", tp, seen.Traceparent)
}

// publishTraced publishes ce as a structured CloudEvent through daprd's
// HTTP API, with the traceparent header when header is set.
func publishTraced(t *testing.T, e *env, topic string, ce map[string]any, header string) {
	t.Helper()
	ce["specversion"], ce["source"] = "1.0", "integration-test"
	body, _ := json.Marshal(ce)
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://%s/v1.0/publish/%s/%s", e.stack.DaprHTTPAddr, devstack.PubSubName, topic), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/cloudevents+json")
	if header != "" {
		req.Header.Set("traceparent", header)
	}
	if tok := e.stack.DaprAPIToken; tok != "" {
		req.Header.Set(daprconn.TokenHeader, tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("publish to %s: HTTP %d", topic, resp.StatusCode)
	}
}
