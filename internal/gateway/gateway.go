// Package gateway owns how worker code reaches backend services: an
// engines.Gateway that calls them through Dapr service invocation (a Dapr app
// id or an HTTPEndpoint resource name), POSTing the request as JSON. A call
// made under a group lock is checked against the lock first and carries its
// fencing token to the backend.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	dapr "github.com/dapr/go-sdk/client"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/metadata"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/tracing"
)

// Metadata (HTTP headers at the backend) of a call made under a group lock:
// the lock's fencing token (decimal) and group. A backend that remembers the
// highest token it saw per group can refuse a stale holder's late call.
const (
	FencingTokenHeader = "fencingtoken"
	FencingGroupHeader = "fencinggroup"
)

// ErrFence: the call was refused because the group lock it was made under
// could not be confirmed (it is no longer held, or the store could not tell).
var ErrFence = errors.New("call refused: its group lock could not be confirmed")

// Dapr is an engines.Gateway over Dapr service invocation.
type Dapr struct {
	client  dapr.Client
	timeout time.Duration
	// Propagator, when set, sends the trace context of the call's span
	// (the worker's attempt) to daprd as gRPC metadata (traceparent,
	// tracestate); daprd continues it and passes traceparent on to the
	// invoked service as an HTTP header.
	Propagator propagation.TextMapPropagator
}

// NewDapr calls services through client; each call is bounded by timeout
// (0: 30s).
func NewDapr(client dapr.Client, timeout time.Duration) *Dapr {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return &Dapr{client: client, timeout: timeout}
}

// Call implements engines.Gateway.
func (d *Dapr) Call(ctx context.Context, service, method string, request []byte) ([]byte, error) {
	if service == "" || method == "" {
		return nil, errors.New("gateway: service and method are required")
	}
	if f := engines.FenceFrom(ctx); f != nil {
		if err := f.Check(ctx); err != nil {
			return nil, fmt.Errorf("gateway: %s/%s under group %s token %d: %w: %w", service, method, f.Group, f.Token, ErrFence, err)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, FencingTokenHeader, strconv.FormatInt(f.Token, 10), FencingGroupHeader, f.Group)
	}
	if d.Propagator != nil {
		ctx = tracing.InjectGRPC(ctx, d.Propagator)
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	resp, err := d.client.InvokeMethodWithContent(ctx, service, method, "post",
		&dapr.DataContent{ContentType: "application/json", Data: request})
	if err != nil {
		return nil, fmt.Errorf("gateway: %s/%s: %w", service, method, err)
	}
	return resp, nil
}
