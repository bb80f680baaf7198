package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/grpc"

	"github.com/virtufin/workmanager/internal/health"
)

// flakyOperator refuses the first registration, then takes it.
type flakyOperator struct {
	operatorservice.OperatorServiceClient
	mu    sync.Mutex
	attrs map[string]enumspb.IndexedValueType
	fails int
}

func (o *flakyOperator) ListSearchAttributes(context.Context, *operatorservice.ListSearchAttributesRequest, ...grpc.CallOption) (*operatorservice.ListSearchAttributesResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := map[string]enumspb.IndexedValueType{}
	for k, v := range o.attrs {
		m[k] = v
	}
	return &operatorservice.ListSearchAttributesResponse{CustomAttributes: m}, nil
}

func (o *flakyOperator) AddSearchAttributes(_ context.Context, req *operatorservice.AddSearchAttributesRequest, _ ...grpc.CallOption) (*operatorservice.AddSearchAttributesResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fails > 0 {
		o.fails--
		return nil, errors.New("PermissionDenied: not an admin")
	}
	for k, v := range req.GetSearchAttributes() {
		o.attrs[k] = v
	}
	return &operatorservice.AddSearchAttributesResponse{}, nil
}

// Issue 46 item 5: the API registers the search attributes at start; a
// refusal is reported (health Degraded with the reason) and tried again
// until it succeeds.
func TestRegisterSearchAttributesReportsAndRetries(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	op := &flakyOperator{attrs: map[string]enumspb.IndexedValueType{}, fails: 1}
	hs := health.NewEmpty()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The retry is long: the refusal stays reported until the wait ends.
	first, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); registerSearchAttributes(first, log, op, "wm", hs, time.Hour) }()
	waitCheck(ctx, t, hs, func(c health.Check) bool {
		return c.Status == health.Degraded && strings.Contains(c.Detail, "PermissionDenied") && strings.Contains(c.Detail, "register them yourself")
	})
	stop()
	<-done
	// The next try succeeds.
	registerSearchAttributes(ctx, log, op, "wm", hs, time.Hour)
	waitCheck(ctx, t, hs, func(c health.Check) bool { return c.Status == health.Healthy })
	if len(op.attrs) != 5 {
		t.Fatalf("attributes %v", op.attrs)
	}
}

func waitCheck(ctx context.Context, t *testing.T, hs *health.State, ok func(health.Check) bool) {
	t.Helper()
	for {
		c := hs.Report().Checks[SearchAttributesCheck]
		if ok(c) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("health check %s stayed %+v", SearchAttributesCheck, c)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

type oldServer struct {
	workflowservice.WorkflowServiceClient
}

func (oldServer) GetSystemInfo(context.Context, *workflowservice.GetSystemInfoRequest, ...grpc.CallOption) (*workflowservice.GetSystemInfoResponse, error) {
	return &workflowservice.GetSystemInfoResponse{ServerVersion: "1.24.2"}, nil
}

// A Temporal server older than the minimum is reported on /health.
func TestTemporalVersionReported(t *testing.T) {
	hs := health.NewEmpty()
	checkTemporalVersion(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), oldServer{}, hs)
	if c := hs.Report().Checks[TemporalVersionCheck]; c.Status != health.Degraded || !strings.Contains(c.Detail, "1.24.2 is older than 1.27.0") {
		t.Fatalf("%+v", c)
	}
}
