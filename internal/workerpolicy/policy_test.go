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
