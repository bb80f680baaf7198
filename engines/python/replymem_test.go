package python_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
)

// TestReplyDecodingIsBounded is issue 42's item 4 for Python: a reply
// under the frame limit whose outputs would take many times the limit
// once decoded (a quarter of a million tiny outputs) is refused before
// they are decoded, and no reply, refused or accepted, makes the node's
// heap grow by more than 3x the reply limit (docs/security.md).
func TestReplyDecodingIsBounded(t *testing.T) {
	limit := engines.ReplyLimit(100, 64<<10) // about 10 MiB
	e := newEngine(t, python.Config{MaxReplyBytes: limit})
	inst := load(t, e, testSpec, `
def process(event):
    if event["type"] == "many":
        return [{"type": "a"}] * 250_000
    return [{"type": "a", "data": bytes(64 << 10)}] * 100
`)
	var out []event.Event
	var err error
	alloc, peak := enginetest.HeapDuring(func() { out, err = call(t, inst, jsonEvent("many", nil)) })
	t.Logf("250,000 tiny outputs: allocated %.2fx, peak %.2fx the limit of %d", float64(alloc)/float64(limit), float64(peak)/float64(limit), limit)
	if !errors.Is(err, engines.ErrReplyTooLarge) || !errors.Is(err, engines.ErrWorkerFailed) || len(out) != 0 {
		t.Errorf("%d outputs, err = %v; want ErrReplyTooLarge", len(out), err)
	} else if !strings.Contains(err.Error(), "would take more than the limit") {
		t.Errorf("err = %v", err)
	}
	if alloc > engines.ReplyMemoryMultiple*int64(limit) {
		t.Errorf("the refused reply cost the node %d bytes, %.1fx the limit", alloc, float64(alloc)/float64(limit))
	}

	alloc, peak = enginetest.HeapDuring(func() { out, err = call(t, inst, jsonEvent("full", nil)) })
	t.Logf("100 outputs of 64 KiB: allocated %.2fx, peak %.2fx the limit", float64(alloc)/float64(limit), float64(peak)/float64(limit))
	if err != nil || len(out) != 100 || len(out[99].Data()) != 64<<10 {
		t.Fatalf("a reply at the limit: %d outputs, %v", len(out), err)
	}
	if alloc > engines.ReplyMemoryMultiple*int64(limit) {
		t.Errorf("a reply at the limit cost the node %d bytes, %.1fx the limit", alloc, float64(alloc)/float64(limit))
	}
}

// TestLoadErrorTextIsBounded is issue 42's item 5 for Python: code that
// fails to load with a 20 MB message gives an error of a few KiB.
func TestLoadErrorTextIsBounded(t *testing.T) {
	e := newEngine(t, python.Config{})
	_, err := e.Load(t.Context(), testSpec, []byte(`raise ImportError("x" * 20_000_000)`))
	if !errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("err = %v, want ErrInvalidCode", err)
	}
	if n := len(err.Error()); n > 16<<10 {
		t.Fatalf("the load error is %d bytes", n)
	}
	err = e.Check(t.Context(), testSpec, []byte(`raise ImportError("x" * 20_000_000)`))
	if !errors.Is(err, engines.ErrInvalidCode) || len(err.Error()) > 16<<10 {
		t.Fatalf("Check: %d bytes, %v", len(err.Error()), errors.Unwrap(err))
	}
}
