package dotnet

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
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

// fixture reads testdata/<name>.cs.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".cs"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// newTestEngine returns an engine with a cache of the test's own.
func newTestEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	if cfg.CacheDir == "" {
		cfg.CacheDir = sharedCache(t)
	}
	return New(cfg)
}

var cacheOnce struct {
	sync.Once
	dir string
}

// sharedCache is one cache directory for the package's tests (the host
// and DevKit are built once), removed by TestMain.
func sharedCache(t testing.TB) string {
	cacheOnce.Do(func() {
		d, err := os.MkdirTemp("", "wm-dotnet-test-")
		if err != nil {
			t.Fatal(err)
		}
		cacheOnce.dir = d
	})
	return cacheOnce.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if cacheOnce.dir != "" {
		os.RemoveAll(cacheOnce.dir)
	}
	os.Exit(code)
}

// testLogger sends the workers' output to the test log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// buildPackage compiles C# sources against the DevKit into an assembly
// named name and returns it packed as a nupkg-shaped zip under
// lib/<tfm>/ (tfm "" returns the bare DLL).
func buildPackage(t testing.TB, e *Engine, name, tfm string, src []byte) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := e.runtimeFor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := compileLibrary(ctx, t, rt, t.TempDir(), name, src)
	if tfm == "" {
		return b
	}
	return zipFiles(t, map[string]string{
		name + ".nuspec":                   `<?xml version="1.0"?><package><metadata><id>` + name + `</id><version>1.0.0</version></metadata></package>`,
		"lib/" + tfm + "/" + name + ".dll": string(b),
	})
}

// compileLibrary compiles src with mcs into dir/<name>.dll, a library
// referencing the DevKit and the assemblies refs, and returns its bytes.
func compileLibrary(ctx context.Context, t testing.TB, rt *runtime, dir, name string, src []byte, refs ...string) []byte {
	t.Helper()
	cs, dll := filepath.Join(dir, name+".cs"), filepath.Join(dir, name+".dll")
	if err := os.WriteFile(cs, src, 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-target:library", "-out:" + dll, "-r:" + rt.devKit()}
	for _, r := range refs {
		args = append(args, "-r:"+r)
	}
	if out, err := exec.CommandContext(ctx, rt.mcs, append(args, cs)...).CombinedOutput(); err != nil {
		t.Fatalf("mcs %s: %v\n%s", name, err, out)
	}
	b, err := os.ReadFile(dll)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func zipFiles(t testing.TB, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, content := range files {
		w, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(content))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestConformanceSource(t *testing.T) {
	enginetest.Run(t, enginetest.Harness{
		Engine:   newTestEngine(t, Config{Processes: 2}),
		MIMEType: MIMESource,
		Fixtures: enginetest.Fixtures{
			Echo: fixture(t, "echo"), Multi: fixture(t, "multi"), None: fixture(t, "none"),
			Raise: fixture(t, "raise"), Hang: fixture(t, "hang"), Invalid: fixture(t, "invalid"),
		},
		// A bound for a hang: one Check compiles with Mono, which took over
		// a minute on a starved machine (CI-like run 31).
		Wait: 3 * time.Minute,
		// The Timeout case's first, ordinary call on the hang worker runs
		// under this timeout too; Mono compiles the worker's path on it,
		// which took over the default 500 ms under a CPU hog (CI-like
		// run 28).
		HangTimeout: 3 * time.Second,
	})
}

func TestConformancePackage(t *testing.T) {
	e := newTestEngine(t, Config{Processes: 2})
	pkg := func(name string) []byte { return buildPackage(t, e, name, "net48", fixture(t, name)) }
	enginetest.Run(t, enginetest.Harness{
		Engine:   e,
		MIMEType: MIMEPackage,
		Fixtures: enginetest.Fixtures{
			Echo: pkg("echo"), Multi: pkg("multi"), None: pkg("none"), Raise: pkg("raise"), Hang: pkg("hang"),
			Invalid: []byte("this is neither a zip archive nor a .NET assembly"),
		},
		// A bound for a hang: one Check compiles with Mono, which took over
		// a minute on a starved machine (CI-like run 31).
		Wait: 3 * time.Minute,
		// The Timeout case's first, ordinary call on the hang worker runs
		// under this timeout too; Mono compiles the worker's path on it,
		// which took over the default 500 ms under a CPU hog (CI-like
		// run 28).
		HangTimeout: 3 * time.Second,
	})
}

func TestCompileErrorNamesLineAndColumn(t *testing.T) {
	e := newTestEngine(t, Config{})
	err := e.Check(context.Background(), engines.Spec{WorkerID: "w", MIMEType: MIMESource}, fixture(t, "invalid"))
	if !errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("err = %v, want ErrInvalidCode", err)
	}
	if !strings.Contains(err.Error(), "Worker.cs:9:4: error CS1525") {
		t.Fatalf("err = %v, want Worker.cs:9:4: error CS1525", err)
	}
}

func TestNoRuntimeSaysWhatWasSearched(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	e := New(Config{CacheDir: t.TempDir(), Compiler: "/nonexistent/mcs"})
	err := e.Check(context.Background(), engines.Spec{WorkerID: "w", MIMEType: MIMESource}, fixture(t, "echo"))
	if !errors.Is(err, ErrNoRuntime) {
		t.Fatalf("err = %v, want ErrNoRuntime", err)
	}
	for _, want := range []string{"mono-runtime", "/nonexistent/mcs (configured; not an executable file)", "mono on PATH"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to name %q", err, want)
		}
	}
	if _, err := e.Warm(context.Background()); !errors.Is(err, ErrNoRuntime) {
		t.Fatalf("Warm: %v", err)
	}
}

func TestPackageErrors(t *testing.T) {
	e := newTestEngine(t, Config{})
	echo := buildPackage(t, e, "Echo", "", fixture(t, "echo"))
	for name, tc := range map[string]struct {
		code []byte
		want string
	}{
		"empty":       {nil, "the package is empty"},
		"not a zip":   {[]byte("hello"), "neither a .NET assembly nor a valid zip"},
		"no lib":      {zipFiles(t, map[string]string{"Echo.dll": string(echo)}), "no lib/<tfm>/ folder"},
		"net8 only":   {zipFiles(t, map[string]string{"lib/net8.0/Echo.dll": string(echo)}), "targets lib/net8.0 only"},
		"unsafe name": {zipFiles(t, map[string]string{"lib/net48/../../x.dll": string(echo)}), "unsafe name"},
		"no dll":      {zipFiles(t, map[string]string{"lib/net48/readme.txt": "hi"}), "holds no worker assembly"},
		"not .NET":    {zipFiles(t, map[string]string{"lib/net48/Echo.dll": "MZ but not really"}), "not a .NET assembly this runtime can load"},
		"no worker":   {buildPackage(t, e, "None2", "net48", []byte("public class Nothing { }")), "defines no public, non-abstract class"},
		"two workers": {buildPackage(t, e, "Two", "netstandard2.0", append(fixture(t, "echo"), []byte("\npublic class Echo2 : Echo { }\n")...)), "several worker classes (Echo, Echo2)"},
	} {
		t.Run(name, func(t *testing.T) {
			err := e.Check(context.Background(), engines.Spec{WorkerID: "w", MIMEType: MIMEPackage}, tc.code)
			if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalidCode with %q", err, tc.want)
			}
		})
	}
	// The best folder Mono can load wins; a bare DLL works too.
	for _, code := range [][]byte{
		zipFiles(t, map[string]string{"lib/net8.0/Echo.dll": "not loadable", "lib/net472/Echo.dll": string(echo), "lib/netstandard2.0/Echo.dll": "x"}),
		echo,
	} {
		if err := e.Check(context.Background(), engines.Spec{WorkerID: "w", MIMEType: MIMEPackage}, code); err != nil {
			t.Fatal(err)
		}
	}
}

// A compiled source and an unpacked package are cached per tenant: the
// same code checked for another tenant is compiled (unpacked) again into
// an entry of its own, so a create's speed never tells one tenant that
// another uploaded that code; for the same tenant, and for a spec that
// names none, the entry is shared.
func TestCacheEntriesAreTheTenantsOwn(t *testing.T) {
	e := New(Config{CacheDir: t.TempDir()})
	t.Cleanup(func() { _ = e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src := unique(fixture(t, "echo"), "cache per tenant")
	pkg := buildPackage(t, e, "EchoPerTenant", "net48", fixture(t, "echo"))
	entries := func(prefix string) int {
		t.Helper()
		dirs, err := filepath.Glob(filepath.Join(e.cfg.CacheDir, prefix+"*"))
		if err != nil {
			t.Fatal(err)
		}
		return len(dirs)
	}
	for _, c := range []struct {
		mime, prefix string
		code         []byte
	}{{MIMESource, "cs-", src}, {MIMEPackage, "pkg-", pkg}} {
		for i, call := range []struct {
			tenant, worker string
			want           int
		}{{"a", "w1", 1}, {"a", "w2", 1}, {"b", "w3", 2}, {"", "w4", 3}, {"", "w5", 3}} {
			if err := e.Check(ctx, engines.Spec{WorkerID: call.worker, Tenant: call.tenant, MIMEType: c.mime}, c.code); err != nil {
				t.Fatalf("%s check %d: %v", c.mime, i, err)
			}
			if n := entries(c.prefix); n != call.want {
				t.Fatalf("%s: after the check of %q for tenant %q, %d cache entries, want %d", c.mime, call.worker, call.tenant, n, call.want)
			}
		}
	}
}
