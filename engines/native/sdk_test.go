//go:build linux || darwin || freebsd

package native

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// buildExample runs the example's Makefile ("make package") into a temp
// build directory and returns the package.
func buildExample(t *testing.T, dir, zipName string, needs ...string) []byte {
	t.Helper()
	for _, tool := range append([]string{"make", "python3"}, needs...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not on PATH", tool)
		}
	}
	build := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-C", dir, "BUILD="+build, "package")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make package in %s: %v\n%s", dir, err, out)
	}
	return readFile(t, filepath.Join(build, zipName))
}

func TestSDKExampleC(t *testing.T) {
	code := buildExample(t, "../../sdk/native/examples/echo-c", "echo.zip", "gcc")
	modes(t, func(t *testing.T, cfg Config) {
		gw := &fakeGateway{}
		cfg.Gateway = gw
		rec := newRecorder()
		spec := testSpec
		spec.Logger = slog.New(rec)
		inst := load(t, newTestEngine(t, cfg), spec, code)

		in := enginetest.NewEvent("ex-1", "example.request", map[string]any{"sku": "A-1"}, "corr-ex")
		out := mustCall(t, inst, in)
		if len(out) != 1 || out[0].Type() != "example.echoed" || string(out[0].Data()) != `{"sku":"A-1"}` ||
			out[0].Extensions()["correlationid"] != "corr-ex" {
			t.Fatalf("echo output = %v", out)
		}
		out = mustCall(t, inst, enginetest.NewEvent("ex-2", "example.lookup", map[string]any{"sku": "A-1"}, ""))
		var got map[string]any
		if len(out) != 1 || json.Unmarshal(out[0].Data(), &got) != nil || got["answer"] != 42.0 {
			t.Fatalf("lookup output = %v", out)
		}
		if len(gw.calls) != 1 || gw.calls[0] != `inventory v1/lookup {"sku":"A-1"}` {
			t.Fatalf("gateway calls = %q", gw.calls)
		}
		gw.fail = errors.New("no such sku")
		_, err := call(t, inst, enginetest.NewEvent("ex-3", "example.lookup", map[string]any{"sku": "B"}, ""))
		if !errors.Is(err, engines.ErrWorkerFailed) || !strings.Contains(err.Error(), "native worker returned code 1: inventory lookup failed (code 1): no such sku") {
			t.Fatalf("failed lookup = %v", err)
		}
		if l := rec.lines(); len(l) == 0 || !strings.Contains(strings.Join(l, "\n"), "INFO|w-native|worker w-native got event ex-1 of type example.request") {
			t.Fatalf("log lines = %q", l)
		}
	})
}

func TestSDKExampleCpp(t *testing.T) {
	if _, err := os.Stat("/usr/include/flatbuffers/flatbuffers.h"); err != nil {
		t.Skip("FlatBuffers C++ headers not installed (apt-get install libflatbuffers-dev)")
	}
	code := buildExample(t, "../../sdk/native/examples/echo-cpp", "echocpp.zip", "g++", "flatc")
	inst := load(t, newTestEngine(t, Config{}), testSpec, code)
	in := enginetest.NewEvent("cpp-1", "example.request", []any{1, "two"}, "corr-cpp")
	out := mustCall(t, inst, in)
	if len(out) != 1 || out[0].Type() != "example.echoed" || string(out[0].Data()) != `[1,"two"]` ||
		out[0].Extensions()["correlationid"] != "corr-cpp" || out[0].DataContentType() != "application/json" {
		t.Fatalf("output = %v", out)
	}
}

// TestNativeHostBinary runs process isolation with the real cmd/native-host.
func TestNativeHostBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/native-host")
	}
	bin := filepath.Join(t.TempDir(), "native-host")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// go test puts its GOROOT/bin first on PATH (runtime.GOROOT is empty
	// in a -trimpath build, as make test's).
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, "../../cmd/native-host").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/native-host: %v\n%s", err, out)
	}
	e := newTestEngine(t, Config{Isolation: IsolationProcess, HostPath: bin})
	inst := load(t, e, testSpec, packageOf(t, flagsEcho, nil))
	if _, err := call(t, inst, typed("test.crash", nil)); !errors.Is(err, engines.ErrWorkerFailed) {
		t.Fatalf("crash: %v", err)
	}
	got := enginetest.DataOf(t, mustCall(t, inst, typed("test.identity", nil)))
	if got["worker_id"] != "w-native" || got["env_worker_id"] != "w-native" {
		t.Fatalf("identity in the host = %v", got)
	}
	err = e.Check(ctx, testSpec, packageOf(t, flagsNoFree, nil))
	checkInvalid(t, "Check in the host", err, "does not export FreeResult")
}
