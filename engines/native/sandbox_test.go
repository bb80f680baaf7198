//go:build linux

package native

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// With a sandbox, the load check of an uploaded package runs in a
// sandboxed host, never in this process: a constructor that writes a file
// writes nothing the node can see, one that kills its parent kills only
// the sandbox, and the package is refused with a clear error.
func TestCheckRunsConstructorsOutsideTheNode(t *testing.T) {
	sb := sandboxtest.Strict(t)
	mark := filepath.Join(t.TempDir(), "ctor-ran")
	e := newTestEngine(t, hostConfig(Config{Sandbox: sb}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	writer := packageOf(t, []string{`-DCTOR_WRITE="` + mark + `"`}, nil)
	if err := e.Check(ctx, testSpec, writer); err != nil {
		t.Fatalf("Check of a package whose constructor writes a file: %v", err)
	}
	if _, err := os.Stat(mark); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the constructor wrote %s on the node's file system (stat: %v)", mark, err)
	}

	killer := packageOf(t, []string{"-DCTOR_KILL"}, nil)
	err := e.Check(ctx, testSpec, killer)
	if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "native host exited while loading") {
		t.Fatalf("Check of a package whose constructor kills its parent: %v", err)
	}
	// This process (the node's stand-in) is alive, and a good package
	// still checks and runs isolated in the sandbox.
	inst, err := e.Load(ctx, testSpec, packageOf(t, flagsEcho, map[string]any{"isolation": "process"}))
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	if out := mustCall(t, inst, typed("conformance.echo", map[string]any{"x": 1})); len(out) != 1 {
		t.Fatalf("outputs %v", out)
	}
}

// Extracted packages count against NATIVE_MAX_EXTRACTED_BYTES while they
// are loaded; past it a load fails and says so; closing gives the bytes
// back.
func TestExtractedBytesAreBounded(t *testing.T) {
	pkg := packageOf(t, flagsEcho, nil)
	size := int64(len(readFile(t, fixtureLib(t, flagsEcho...))))
	e := newTestEngine(t, Config{MaxExtractedBytes: size + size/2})
	ctx := context.Background()
	first, err := e.Load(ctx, testSpec, pkg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Load(ctx, testSpec, pkg); err == nil || !strings.Contains(err.Error(), "NATIVE_MAX_EXTRACTED_BYTES") {
		t.Fatalf("second load: %v", err)
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := e.Load(ctx, testSpec, pkg)
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	second.Close(ctx)
}
