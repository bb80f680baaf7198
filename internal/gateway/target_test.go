package gateway_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	dapr "github.com/dapr/go-sdk/client"

	"github.com/virtufin/workmanager/internal/gateway"
)

// fakeDapr records the service invocations that reach it; any other
// method of dapr.Client panics (nil embedded interface).
type fakeDapr struct {
	dapr.Client
	appID string
	calls []string
}

func (f *fakeDapr) InvokeMethodWithContent(_ context.Context, app, method, verb string, _ *dapr.DataContent) ([]byte, error) {
	f.calls = append(f.calls, app+" "+verb+" "+method)
	return []byte(`{}`), nil
}

func (f *fakeDapr) GetMetadata(context.Context) (*dapr.GetMetadataResponse, error) {
	return &dapr.GetMetadataResponse{ID: f.appID}, nil
}

// TestCallRefusesWhatIsNotAnAppIDOrClimbs: issue 32 item 1. Every bypass
// the review found (daprd's base-URL form of an app id, a method that
// climbs or carries a query, encoded and backslash spellings) and
// WorkManager's own app ids are refused in Dapr.Call before daprd sees the
// call; ordinary targets pass.
func TestCallRefusesWhatIsNotAnAppIDOrClimbs(t *testing.T) {
	f := &fakeDapr{appID: "wm-node-7"}
	g := gateway.NewDapr(f, time.Second)
	ctx := context.Background()
	for _, c := range []struct{ service, method string }{
		{"http://127.0.0.1:3500", "v1.0/state/statestore/bulk"},
		{"http://127.0.0.1:3500", "v1.0/publish/pubsub/workmanager.lifecycle"},
		{"https://127.0.0.1:3500", "v1.0/state/statestore"},
		{"HTTP://127.0.0.1:3500", "v1.0/state/statestore/bulk"},
		{"http:", "/127.0.0.1:3500/v1.0/state/statestore/bulk"},
		{"127.0.0.1:3500", "v1.0/state/statestore/bulk"},
		{"localhost:7243", "api/v1/namespaces/default/workflows/x/terminate"},
		{"billing/x", "quote"},
		{"billing\\x", "quote"},
		{"billing%2f..", "quote"},
		{"billing ", "quote"},
		{".billing", "quote"},
		{"billing..ns", "quote"},
		{"-billing", "quote"},
		{"", "quote"},
		{strings.Repeat("a", 254), "quote"},
		// WorkManager's own app ids, also with a namespace, any case, and
		// the id daprd reports for this node.
		{"workmanager", "anything"},
		{"WorkManager", "anything"},
		{"workmanager.default", "anything"},
		{"workmanager-api", "anything"},
		{"wm-node-7", "anything"},
		// Methods.
		{"admin", "../internal?debug=1"},
		{"admin", "x/../internal"},
		{"admin", "x/../../internal"},
		{"admin", ".."},
		{"admin", "."},
		{"admin", "./internal"},
		{"admin", "x/..;/internal"},
		{"admin", "x/..."},
		{"admin", "x//internal"},
		{"admin", "x/"},
		{"admin", "/internal"},
		{"admin", "//evil.example/x"},
		{"admin", "x\\..\\internal"},
		{"admin", "x%2f..%2finternal"},
		{"admin", "x/%2e%2e/internal"},
		{"admin", "x/%2E%2E/internal"},
		{"admin", "x/.%2e/internal"},
		{"admin", "x/%252e%252e/internal"},
		{"admin", "x%5c..%5cinternal"},
		{"admin", "x%3fdebug=1"},
		{"admin", "x%00"},
		{"admin", "x%zz"},
		{"admin", "x#frag"},
		{"admin", "x y"},
		{"admin", "x\r\nHost: evil"},
		{"admin", "internal?debug=1"},
		{"admin", strings.Repeat("a/", 1025)},
	} {
		_, err := g.Call(ctx, c.service, c.method, []byte(`{}`))
		if err == nil || !errors.Is(err, gateway.ErrRefused) {
			t.Errorf("Call(%q, %q): %v; want a refusal", c.service, c.method, err)
		}
	}
	if len(f.calls) != 0 {
		t.Fatalf("refused calls reached daprd: %q", f.calls)
	}
	for _, c := range []struct{ service, method string }{
		{"billing", "quote"},
		{"billing", "v1/quotes/latest"},
		{"billing.prod", "quote"},
		{"pricing_v2", "a.b/c-d_e~f"},
		{"billing", "items/a%20b"},
		{"billing", "v1.0/state"}, // a backend's path that looks like daprd's is its own
		{"workmanager2", "x"},
	} {
		if _, err := g.Call(ctx, c.service, c.method, []byte(`{}`)); err != nil {
			t.Errorf("Call(%q, %q): %v", c.service, c.method, err)
		}
	}
	if len(f.calls) != 7 || f.calls[0] != "billing post quote" {
		t.Fatalf("calls %q", f.calls)
	}
}

// TestCallQueryOnlyWhenThePolicyAllowsIt: a query passes only when the
// worker's allowed_gateway_targets (in ctx) has a matching pattern with a
// literal '?' (workerpolicy.QueryMarker); "billing/*" does not allow one.
func TestCallQueryOnlyWhenThePolicyAllowsIt(t *testing.T) {
	f := &fakeDapr{}
	g := gateway.NewDapr(f, time.Second)
	ctx := context.Background()
	for _, c := range []struct {
		allowed []string
		method  string
		ok      bool
	}{
		{nil, "search?q=1", false},
		{[]string{"billing/*"}, "search?q=1", false},
		{[]string{`billing/search\?*`}, "search?q=1", true},
		{[]string{`billing/search\?*`}, "search/../admin?q=1", false},
		{[]string{`billing/search\?*`}, "other?q=1", false},
		{[]string{`billing/search\?*`}, "search?q=1#x", false},
		{[]string{`billing/search\?*`}, "search", true},
	} {
		_, err := g.Call(gateway.WithTargets(ctx, c.allowed), "billing", c.method, nil)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, gateway.ErrRefused)) {
			t.Errorf("%q with %q: %v, want ok=%v", c.method, c.allowed, err, c.ok)
		}
	}
}
