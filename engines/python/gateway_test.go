package python_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/python"
)

type fakeGateway struct {
	mu     sync.Mutex
	calls  []string
	bodies []string
	fences []*engines.Fence
}

func (g *fakeGateway) Call(ctx context.Context, service, method string, req []byte) ([]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, service+"/"+method)
	g.bodies = append(g.bodies, string(req))
	g.fences = append(g.fences, engines.FenceFrom(ctx))
	if service == "down" {
		return nil, errors.New("gateway: down/x: connection refused")
	}
	return []byte(`{"charged":` + string(req) + `}`), nil
}

// Python workers reach backends only through the node: call_gateway goes
// to the engine's Gateway with the call's context (its fence), under the
// worker's allowed targets; failures are GatewayError in the worker.
func TestPythonGateway(t *testing.T) {
	gw := &fakeGateway{}
	e := newEngine(t, python.Config{Gateway: gw})
	spec := testSpec
	spec.GatewayTargets = []string{"billing/*", "down/*"}
	inst := load(t, e, spec, `
import json
import virtufin_host

def process(event):
    d = event["data"]
    try:
        resp = virtufin_host.call_gateway(d["service"], "charge", {"amount": 5})
        return {"type": "ok", "data": json.loads(resp)}
    except virtufin_host.GatewayError as e:
        return {"type": "failed", "data": str(e)}
`)
	fence := &engines.Fence{Group: "g", Token: 7, Check: func(context.Context) error { return nil }}
	ctx := engines.WithFence(context.Background(), fence)
	out, err := inst.Process(ctx, jsonEvent("t", map[string]any{"service": "billing"}))
	if err != nil || len(out) != 1 || out[0].Type() != "ok" || string(out[0].Data()) != `{"charged":{"amount":5}}` {
		t.Fatalf("allowed call: %v %v", out, err)
	}
	for svc, want := range map[string]string{
		"users": `gateway target "users/charge" is not in allowed_gateway_targets`,
		"down":  "connection refused",
	} {
		out := mustCall(t, inst, jsonEvent("t", map[string]any{"service": svc}))
		if len(out) != 1 || out[0].Type() != "failed" || !strings.Contains(string(out[0].Data()), want) {
			t.Errorf("%s: %v, want failed with %q", svc, out, want)
		}
	}
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if len(gw.calls) != 2 || gw.calls[0] != "billing/charge" || gw.bodies[0] != `{"amount":5}` || gw.fences[0] != fence {
		t.Fatalf("gateway saw %v %v %v", gw.calls, gw.bodies, gw.fences)
	}
}

func TestPythonGatewayWithoutGateway(t *testing.T) {
	inst := load(t, newEngine(t, python.Config{}), testSpec, `
import virtufin_host

def process(event):
    try:
        virtufin_host.call_gateway("billing", "charge")
    except virtufin_host.GatewayError as e:
        return {"type": "failed", "data": str(e)}
`)
	out := mustCall(t, inst, jsonEvent("t", nil))
	if len(out) != 1 || !strings.Contains(string(out[0].Data()), "no gateway is configured") {
		t.Fatalf("%v", out)
	}
}
