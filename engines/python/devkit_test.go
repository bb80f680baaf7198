package python_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
	devkit "github.com/virtufin/workmanager/sdk/python"
)

const devkitCommandWorker = `
import enum
from virtufin_worker import CommandWorker, require

require("0.1")

class Command(enum.Enum):
    ADD = enum.auto()
    NEG = enum.auto()

class Calc(CommandWorker[Command]):
    def handle(self, event, command, payload):
        match command:
            case Command.ADD:
                return self.response(event, {"sum": payload["a"] + payload["b"]})
            case Command.NEG:
                return self.response(event, {"neg": -payload["a"]})

process = Calc(Command, "calc.result")
`

// installedDevKit installs the node's DevKit the way the node does.
// Sandboxed workers run as other users: the directory must be reachable
// for them (t.TempDir is not).
func installedDevKit(t *testing.T) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "devkit-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := devkit.Install(parent)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// Workers import the DevKit the node ships without shipping it (also in
// the strict sandbox, where only its directory is bound in); a worker that
// needs a newer DevKit fails its load check with a clear message.
func TestDevKitIsImportable(t *testing.T) {
	dir := installedDevKit(t)
	for name, cfg := range map[string]python.Config{
		"plain":     {DevKitDir: dir},
		"sandboxed": {DevKitDir: dir, Sandbox: sandboxtest.Strict(t), AllowedPackages: []string{}},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEngine(t, cfg)
			inst := load(t, e, testSpec, devkitCommandWorker)
			out := mustCall(t, inst, jsonEvent("calc", map[string]any{"command": "ADD", "a": 2, "b": 3}))
			if len(out) != 1 || out[0].Type() != "calc.result" || enginetest.DataOf(t, out)["sum"] != 5.0 {
				t.Fatalf("ADD: %v", out)
			}
			out = mustCall(t, inst, jsonEvent("calc", map[string]any{"command": "mul"}))
			if len(out) != 1 || out[0].Type() != "calc.result.error" || enginetest.DataOf(t, out)["error"] != "Unknown command: mul" {
				t.Fatalf("unknown command: %v", out)
			}
			err := e.Check(context.Background(), testSpec, []byte(`from virtufin_worker import require
require("99.0")
def process(event):
    return None
`))
			if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "needs virtufin_worker >= 99.0; the node provides "+devkit.Version()) {
				t.Fatalf("too old: %v", err)
			}
		})
	}
	// Without a DevKit directory the import is refused like any package.
	e := newEngine(t, python.Config{AllowedPackages: []string{}})
	err := e.Check(context.Background(), testSpec, []byte(devkitCommandWorker))
	if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "virtufin_worker") {
		t.Fatalf("no DevKit: %v", err)
	}
}
