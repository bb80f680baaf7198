// Package gateway owns how worker code reaches backend services: an
// engines.Gateway that calls them through Dapr service invocation (a Dapr app
// id or an HTTPEndpoint resource name), POSTing the request as JSON. Every
// call of every engine passes Dapr.Call, which refuses a target that is not
// a Dapr app id (a URL, host:port, a path), that is WorkManager's own app
// id, or whose method climbs or carries a query the worker's policy does
// not allow (workerpolicy.CheckTarget), before anything reaches daprd. A
// call made under a group lock is checked against the lock first and
// carries its fencing token to the backend.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	dapr "github.com/dapr/go-sdk/client"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/metadata"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/tracing"
	"github.com/virtufin/workmanager/internal/workerpolicy"
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

// ErrRefused is wrapped by a call refused for its target (its service or
// method), before it reached daprd.
var ErrRefused = workerpolicy.ErrDenied

// Dapr is an engines.Gateway over Dapr service invocation.
type Dapr struct {
	client  dapr.Client
	timeout time.Duration
	// reserved are the app ids no call may reach: workerpolicy's
	// ReservedAppIDs, APP_ID (set by Dapr's sidecar injector) and, once
	// learned, the app id daprd reports for this node.
	mu       sync.Mutex
	reserved []string
	ownKnown bool
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
	d := &Dapr{client: client, timeout: timeout, reserved: append([]string(nil), workerpolicy.ReservedAppIDs...)}
	if id := os.Getenv("APP_ID"); id != "" {
		d.reserved = append(d.reserved, id)
	}
	return d
}

// Reserve adds app ids no call may reach.
func (d *Dapr) Reserve(ids ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reserved = append(d.reserved, ids...)
}

// reservedIDs returns the app ids no call may reach, asking daprd for its
// own app id until it has answered once.
func (d *Dapr) reservedIDs(ctx context.Context) []string {
	d.mu.Lock()
	known := d.ownKnown
	ids := d.reserved
	d.mu.Unlock()
	if known || d.client == nil {
		return ids
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	md, err := d.client.GetMetadata(ctx)
	if err != nil || md == nil {
		return ids // daprd does not answer: the call will fail there too
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ownKnown {
		d.ownKnown = true
		if md.ID != "" {
			d.reserved = append(d.reserved, md.ID)
		}
	}
	return d.reserved
}

// WithTargets returns ctx carrying the calling worker's
// allowed_gateway_targets (engines.WithGatewayTargets, which the engines
// set on every call), for what only the policy may allow (a query:
// workerpolicy.QueryMarker). Without them no call carries a query.
func WithTargets(ctx context.Context, allowed []string) context.Context {
	return engines.WithGatewayTargets(ctx, allowed)
}

// Check refuses a target no call may reach (workerpolicy.CheckTarget with
// the reserved app ids and the policy in ctx); Call runs it first.
func (d *Dapr) Check(ctx context.Context, service, method string) error {
	allowed := engines.GatewayTargetsFrom(ctx)
	if err := workerpolicy.CheckTarget(service, method, workerpolicy.ReservedAppIDs, allowed); err != nil {
		return err
	}
	return workerpolicy.CheckTarget(service, method, d.reservedIDs(ctx), allowed)
}

// Call implements engines.Gateway.
func (d *Dapr) Call(ctx context.Context, service, method string, request []byte) ([]byte, error) {
	if service == "" || method == "" {
		return nil, fmt.Errorf("gateway: service and method are required: %w", ErrRefused)
	}
	if err := d.Check(ctx, service, method); err != nil {
		return nil, fmt.Errorf("gateway: call refused: %w", err)
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
