// Package apimetrics owns the control API's Prometheus metrics (served at
// /metrics beside /health by cmd/api): one counter and one latency
// histogram per WorkManager method and gRPC code, filled by a unary and a
// stream interceptor. Labels are bounded: the service's own method names
// (anything else counts as "other") and the gRPC codes.
package apimetrics

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/metrics"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Metrics are the API's metrics on a registry of their own.
type Metrics struct {
	reg      *prometheus.Registry
	calls    *prometheus.CounterVec
	duration *prometheus.HistogramVec
	methods  map[string]string // full method name → label
}

// New registers the API's metrics, and the Go and process collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metrics.Namespace, Subsystem: "api", Name: "calls_total",
			Help: "Control API calls by method and gRPC code (rate limits, authentication and validation failures included)."}, []string{"method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: metrics.Namespace, Subsystem: "api", Name: "call_duration_seconds",
			Help: "Control API call latency by method, until the answer (a stream: until it ends).", Buckets: metrics.LatencyBuckets}, []string{"method"}),
		methods: map[string]string{},
	}
	prefix := "/" + pb.WorkManagerService_ServiceDesc.ServiceName + "/"
	for _, md := range pb.WorkManagerService_ServiceDesc.Methods {
		m.methods[prefix+md.MethodName] = md.MethodName
	}
	for _, sd := range pb.WorkManagerService_ServiceDesc.Streams {
		m.methods[prefix+sd.StreamName] = sd.StreamName
	}
	m.reg.MustRegister(m.calls, m.duration, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// method is full's label: the WorkManager method's name, "health" and
// "reflection" for those services, "other" for anything else.
func (m *Metrics) method(full string) string {
	if name, ok := m.methods[full]; ok {
		return name
	}
	switch {
	case strings.HasPrefix(full, "/grpc.health."):
		return "health"
	case strings.HasPrefix(full, "/grpc.reflection."):
		return "reflection"
	}
	return "other"
}

func (m *Metrics) observe(full string, start time.Time, err error) {
	method := m.method(full)
	m.calls.WithLabelValues(method, status.Code(err).String()).Inc()
	m.duration.WithLabelValues(method).Observe(time.Since(start).Seconds())
}

// UnaryInterceptor counts and times each unary call. Put it first, so that
// calls the later interceptors refuse are counted too.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		m.observe(info.FullMethod, start, err)
		return resp, err
	}
}

// StreamInterceptor counts and times each streaming call.
func (m *Metrics) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := handler(srv, ss)
		m.observe(info.FullMethod, start, err)
		return err
	}
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
