package python_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/python"
)

// A KeyError in the worker's own code reaches the node with a traceback
// that names the worker's file and the line that raised it, through the
// engine-neutral engines.Traceback the hot path reads (issue 44 item 2).
func TestKeyErrorTracebackNamesTheWorkerLine(t *testing.T) {
	e := newEngine(t, python.Config{})
	inst := load(t, e, testSpec, `
def total(items):
    return sum(i["price"] * i["qty"] for i in items)

def process(event):
    return {"type": "priced", "data": {"total": total(event["data"]["items"])}}
`)
	_, err := call(t, inst, jsonEvent("order", map[string]any{"items": []any{map[string]any{"sku": "b", "qty": 1}}}))
	if !errors.Is(err, engines.ErrWorkerFailed) {
		t.Fatalf("err = %v, want ErrWorkerFailed", err)
	}
	tb := engines.Traceback(err)
	for _, w := range []string{`File "<worker>", line 6, in process`, `File "<worker>", line 3, in <genexpr>`, `i["price"]`} {
		if !strings.Contains(tb, w) {
			t.Errorf("traceback lacks %q:\n%s", w, tb)
		}
	}
	if last := strings.TrimSpace(tb[strings.LastIndexByte(strings.TrimRight(tb, "\n"), '\n')+1:]); last != "KeyError: 'price'" {
		t.Errorf("traceback's last line = %q, want the exception:\n%s", last, tb)
	}
	if engines.Traceback(errors.New("no traceback")) != "" {
		t.Error("a plain error has a traceback")
	}
}
