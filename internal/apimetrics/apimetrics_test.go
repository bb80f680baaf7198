package apimetrics

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Calls are counted by method and code, unknown methods under "other",
// and served in the Prometheus text format.
func TestCallsAreCountedByMethodAndCode(t *testing.T) {
	m := New()
	unary := m.UnaryInterceptor()
	call := func(method string, err error) {
		_, _ = unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: method},
			func(context.Context, any) (any, error) { return nil, err })
	}
	call("/workmanager.v1.WorkManagerService/CreateWorker", nil)
	call("/workmanager.v1.WorkManagerService/CreateWorker", status.Error(codes.InvalidArgument, "bad"))
	call("/workmanager.v1.WorkManagerService/GetWorker", status.Error(codes.NotFound, "no"))
	call("/evil.Service/"+strings.Repeat("x", 100), nil)
	_ = m.StreamInterceptor()(nil, nil, &grpc.StreamServerInfo{FullMethod: "/grpc.health.v1.Health/Watch"},
		func(any, grpc.ServerStream) error { return nil })

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`workmanager_api_calls_total{code="OK",method="CreateWorker"} 1`,
		`workmanager_api_calls_total{code="InvalidArgument",method="CreateWorker"} 1`,
		`workmanager_api_calls_total{code="NotFound",method="GetWorker"} 1`,
		`workmanager_api_calls_total{code="OK",method="other"} 1`,
		`workmanager_api_calls_total{code="OK",method="health"} 1`,
		`workmanager_api_call_duration_seconds_count{method="CreateWorker"} 2`,
		`go_goroutines`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(string(body), "xxxx") {
		t.Error("an unknown method's name became a label value")
	}
}
