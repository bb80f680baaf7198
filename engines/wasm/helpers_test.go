package wasm

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
)

// buildDir holds the modules the tests build (removed by TestMain).
var buildDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "wasm-engine-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	buildDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// repoRoot is the repository's root (engines/wasm is two levels down).
func repoRoot(t testing.TB) string {
	t.Helper()
	// Tests run in the package's directory (runtime.Caller's file name is
	// the module path, not a directory, under -trimpath).
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

var (
	buildMu    sync.Mutex
	buildCache = map[string][]byte{}
)

// haveClang reports whether clang can build wasm32-wasi reactors here
// (Debian: clang, lld, wasi-libc, libclang-rt-14-dev-wasm32).
func haveClang() error {
	if _, err := exec.LookPath("clang"); err != nil {
		return fmt.Errorf("clang is not installed (Debian: apt-get install clang lld wasi-libc libclang-rt-14-dev-wasm32)")
	}
	if _, err := exec.LookPath("wasm-ld"); err != nil {
		return fmt.Errorf("wasm-ld is not installed (Debian: apt-get install lld)")
	}
	return nil
}

// buildC compiles C sources into a wasm32-wasi reactor with the SDK's
// headers and returns the module; the test is skipped when the toolchain
// is absent. Builds are cached per test binary.
func buildC(t testing.TB, src string, defines ...string) []byte {
	t.Helper()
	if err := haveClang(); err != nil {
		t.Skipf("skipping: the C WebAssembly toolchain is missing: %v", err)
	}
	root := repoRoot(t)
	key := src + "|" + strings.Join(defines, " ")
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := buildCache[key]; ok {
		return b
	}
	out := filepath.Join(buildDir, fmt.Sprintf("c-%d.wasm", len(buildCache)))
	args := []string{"--target=wasm32-wasi", "-O2", "-mbulk-memory", "-mexec-model=reactor", "-Wall", "-Werror",
		"-I", filepath.Join(root, "sdk", "native"), "-I", filepath.Join(root, "sdk", "wasm", "c"), "-o", out}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	args = append(args, src)
	cmd := exec.Command("clang", args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("clang %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	buildCache[key] = b
	return b
}

// buildGo builds a Go package (a directory) for GOOS=wasip1 GOARCH=wasm
// as a reactor (-buildmode=c-shared), with extra go build flags, and
// returns the module.
func buildGo(t testing.TB, dir string, flags ...string) []byte {
	t.Helper()
	key := "go|" + dir + "|" + strings.Join(flags, " ")
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := buildCache[key]; ok {
		return b
	}
	out := filepath.Join(buildDir, fmt.Sprintf("go-%d.wasm", len(buildCache)))
	cmd := exec.Command("go", append(append([]string{"build", "-buildmode=c-shared", "-o", out}, flags...), ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOOS=wasip1 GOARCH=wasm go build in %s: %v\n%s", dir, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	buildCache[key] = b
	return b
}

// fixture is testdata/fixture.c built with defines.
func fixture(t testing.TB, defines ...string) []byte {
	t.Helper()
	return buildC(t, filepath.Join(repoRoot(t), "engines", "wasm", "testdata", "fixture.c"), defines...)
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newTestEngine is an engine closed when the test ends.
func newTestEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	e := New(cfg)
	t.Cleanup(func() { e.Close() })
	return e
}

// roomy is the call timeout of tests that do not test the timeout: a
// guard against a hang, wide enough for a starved machine under -race
// (TestEscapeDeepRecursion's recursion took over 10 s beside make test's
// integration tests, 4.7 s alone).
const roomy = 2 * time.Minute

func testSpec(name string, timeout time.Duration) engines.Spec {
	return engines.Spec{WorkerID: "wasm-" + name, MIMEType: MIMEType, Topic: "t-" + name, Group: "g-" + name,
		Timeout: timeout, Logger: quietLogger()}
}

// load loads code; the instance is closed when the test ends.
func load(t testing.TB, e *Engine, spec engines.Spec, code []byte) *Instance {
	t.Helper()
	return enginetest.Load(t, e, spec, code).(*Instance)
}

func bg(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
