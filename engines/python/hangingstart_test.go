package python_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/python"
)

// TestHangingReplacementCostsTheCallItsTimeout is issue 34's item 6 on
// item 5's path, end to end: the worker process dies while idle and its
// replacement's start hangs (the code's import blocks). The next call
// (no ctx deadline, as in production) fails at its timeout instead of
// holding the message and the slot for the whole load timeout; the start
// goes on in the background.
func TestHangingReplacementCostsTheCallItsTimeout(t *testing.T) {
	flag := filepath.Join(t.TempDir(), "hang")
	e := newEngine(t, python.Config{LoadTimeout: 10 * time.Second})
	spec := testSpec
	spec.Timeout = 500 * time.Millisecond
	inst := load(t, e, spec, fmt.Sprintf(`
import os, threading
if os.path.exists(%q):
    threading.Event().wait(60)  # a start that hangs

def process(event):
    if event["type"] == "die":
        threading.Timer(0.1, os._exit, [0]).start()  # dies while idle
    return None
`, flag))
	mustCall(t, inst, jsonEvent("die", nil))
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond) // exited and reaped

	start := time.Now()
	_, err := inst.Process(context.Background(), jsonEvent("next", nil))
	took := time.Since(start)
	if !errors.Is(err, engines.ErrWorkerFailed) || !errors.Is(err, procpool.ErrCannotStart) {
		t.Errorf("the call after the process died idle: %v (after %v), want ErrCannotStart", err, took)
	}
	if took > 3*time.Second {
		t.Fatalf("the call took %v against a 500ms timeout (a 10s load timeout)", took)
	}
}
