//go:build linux || darwin || freebsd

package native

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

type recordingGateway struct{ calls []string }

func (g *recordingGateway) Call(_ context.Context, service, method string, _ []byte) ([]byte, error) {
	g.calls = append(g.calls, service+"/"+method)
	return []byte(`{}`), nil
}

// A gateway call outside the worker's allowed targets never reaches the
// gateway; one inside does.
func TestGatewayCallHonoursAllowedTargets(t *testing.T) {
	g := &recordingGateway{}
	spec := engines.Spec{WorkerID: "w", GatewayTargets: []string{"billing/*"}}
	msg, code := gatewayCall(context.Background(), g, spec, "users", "delete", nil)
	if code != loader.GatewayError || !strings.Contains(string(msg), `gateway target "users/delete" is not in allowed_gateway_targets`) {
		t.Fatalf("refused call: %d %q", code, msg)
	}
	if _, code := gatewayCall(context.Background(), g, spec, "billing", "charge", nil); code != loader.GatewayOK {
		t.Fatalf("allowed call: %d", code)
	}
	if strings.Join(g.calls, ",") != "billing/charge" {
		t.Fatalf("gateway saw %v", g.calls)
	}
}

func TestCheckGatewayTarget(t *testing.T) {
	if err := engines.CheckGatewayTarget(nil, "any", "thing"); err != nil {
		t.Fatal(err)
	}
	if err := engines.CheckGatewayTarget([]string{"billing/*"}, "billing", "charge"); err != nil {
		t.Fatal(err)
	}
	if err := engines.CheckGatewayTarget([]string{"billing/*"}, "users", "delete"); !errors.Is(err, engines.ErrGatewayDenied) {
		t.Fatalf("err = %v", err)
	}
}
