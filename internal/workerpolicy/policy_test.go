package workerpolicy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/workerpolicy"
)

func TestCheckOutput(t *testing.T) {
	for _, c := range []struct {
		prefix       string
		allowed      []string
		input, topic string
		want         string // "" allowed; else part of the error
	}{
		{"acme.", nil, "acme.orders", "acme.invoices", ""},
		{"acme.", []string{"*"}, "acme.orders", "globex.invoices", "outside the tenant's topics"},
		{"acme.", nil, "acme.orders", "workmanager.lifecycle", "outside the tenant's topics"},
		{"", nil, "orders", "invoices", ""},
		{"", nil, "orders", "workmanager.lifecycle", "reserved"},
		{"", nil, "orders", "orders-dead", "reserved"},
		{"", []string{"*"}, "orders", "workmanager.lifecycle", "reserved"},
		{"", nil, "orders", "orders", "own input topic"},
		{"", []string{"orders"}, "orders", "orders", ""},
		{"", []string{"billing.*"}, "orders", "billing.invoice", ""},
		{"", []string{"billing.*"}, "orders", "shipping.label", "not in allowed_output_topics"},
	} {
		err := workerpolicy.CheckOutput(c.prefix, c.allowed, c.input, c.topic)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v %s→%s: %v", c.allowed, c.input, c.topic, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, workerpolicy.ErrDenied)):
			t.Errorf("%v %s→%s: %v, want %q", c.allowed, c.input, c.topic, err, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := workerpolicy.Validate([]string{"billing.*", "x"}, []string{"billing/*"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		outputs, targets []string
		want             string
	}{
		{[]string{"["}, nil, "syntax error in pattern"},
		{[]string{""}, nil, "1 to 256"},
		{[]string{"workmanager.lifecycle"}, nil, "reserved"},
		{nil, []string{"billing"}, `"service/method"`},
		{make([]string, 65), nil, "at most 64"},
	} {
		if err := workerpolicy.Validate(c.outputs, c.targets); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: %v, want %q", c.outputs, c.targets, err, c.want)
		}
	}
}

// TestValidateGatewayTargets: issue 32 item 1 at CreateWorker. An
// allowed_gateway_targets entry names a Dapr app id (or an app id
// pattern), never a URL, host:port or WorkManager's own app id, and a
// method that does not climb.
func TestValidateGatewayTargets(t *testing.T) {
	for _, ok := range []string{"billing/*", "billing/quote", "*/quote", "billing.prod/v1/*", "pricing_v2/a/b", `billing/search\?*`, "bill?ng/*", "[a-c]*/x"} {
		if err := workerpolicy.Validate(nil, []string{ok}); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{
		"http://127.0.0.1:3500/v1.0/state/statestore/bulk",
		"https://*/*",
		"http:*/*",
		"127.0.0.1:3500/*",
		"*:3500/*",
		"billing",
		"/quote",
		"billing/",
		"workmanager/*",
		"workmanager-api/x",
		"WorkManager.default/x",
		"billing//x",
		"billing/../admin",
		"billing/*/../admin",
		"billing/x/%2e%2e/*",
		"billing/x\\..\\y",
	} {
		if err := workerpolicy.Validate(nil, []string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestCheckTarget: the rule every gateway call passes (internal/gateway
// applies it in Dapr.Call).
func TestCheckTarget(t *testing.T) {
	reserved := append([]string{"node-1"}, workerpolicy.ReservedAppIDs...)
	for _, c := range []struct {
		service, method string
		allowed         []string
		ok              bool
	}{
		{"billing", "quote", nil, true},
		{"http://127.0.0.1:3500", "v1.0/state/statestore/bulk", nil, false},
		{"node-1", "x", nil, false},
		{"node-1.ns", "x", nil, false},
		{"admin", "admin/../internal?debug=1", nil, false},
		{"admin", "internal?debug=1", []string{"admin/*"}, false},
		{"admin", "internal?debug=1", []string{`admin/internal\?debug=*`}, true},
		{"admin", "x/%2e%2e/y", nil, false},
	} {
		err := workerpolicy.CheckTarget(c.service, c.method, reserved, c.allowed)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, workerpolicy.ErrDenied) {
			t.Errorf("%q %q %q: %v, want ok=%v", c.service, c.method, c.allowed, err, c.ok)
		}
	}
}
