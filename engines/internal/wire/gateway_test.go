package wire

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
)

// gatewayFunc is an engines.Gateway made of a function.
type gatewayFunc func(ctx context.Context, service, method string, request []byte) ([]byte, error)

func (f gatewayFunc) Call(ctx context.Context, service, method string, request []byte) ([]byte, error) {
	return f(ctx, service, method, request)
}

// The gateway gets the worker's allowed targets with the call (what only
// the policy may allow, such as a query, is decided there).
func TestServeGatewayPassesTheWorkersTargets(t *testing.T) {
	targets := []string{`billing/search\?*`}
	var got []string
	gw := gatewayFunc(func(ctx context.Context, _, _ string, _ []byte) ([]byte, error) {
		got = engines.GatewayTargetsFrom(ctx)
		return []byte("ok"), nil
	})
	reply := ServeGateway(context.Background(), gw, targets, []byte(`{"service":"billing","method":"search?q=1"}`+"\n{}"))
	if string(reply) != "\x00ok" || !slices.Equal(got, targets) {
		t.Fatalf("reply %q, targets at the gateway %q; want ok and %q", reply, got, targets)
	}
}

// ServeGatewayUntil ends a backend call at the call's deadline and when the
// instance closes, and says which of the two ended it.
func TestServeGatewayUntilEndsAtTheDeadlineOrClose(t *testing.T) {
	slow := gatewayFunc(func(ctx context.Context, _, _ string, _ []byte) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	payload := []byte(`{"service":"billing","method":"charge"}` + "\n{}")

	reply, expired := ServeGatewayUntil(context.Background(), context.Background(), time.Now().Add(50*time.Millisecond), slow, nil, payload)
	if !expired || len(reply) == 0 || reply[0] != 1 {
		t.Fatalf("at the deadline: reply %q, expired %v; want an error and expired", reply, expired)
	}

	closed, close := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, close)
	reply, expired = ServeGatewayUntil(context.Background(), closed, time.Now().Add(time.Hour), slow, nil, payload)
	if expired || len(reply) == 0 || reply[0] != 1 || !errors.Is(closed.Err(), context.Canceled) {
		t.Fatalf("at close: reply %q, expired %v; want an error, not expired", reply, expired)
	}
}
