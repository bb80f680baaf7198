package dotnetdevkit

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// The embedded sources (AssemblySources: both namespaces) compile
// warning-free with mcs (documentation comments included), and the C# test
// program passes against them.
func TestCSharpTests(t *testing.T) {
	mcs, err := exec.LookPath("mcs")
	if err != nil {
		t.Fatal("mcs (the Mono C# compiler) is not installed: `make test` installs mono-mcs (and mono-runtime)")
	}
	mono, err := exec.LookPath("mono")
	if err != nil {
		t.Fatal("mono is not installed: `make test` installs mono-runtime (and mono-mcs)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var srcs []string
	for name, b := range AssemblySources() {
		p := filepath.Join(dir, "src", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, p)
	}
	sort.Strings(srcs)
	tests, err := filepath.Glob(filepath.Join("tests", "*.cs"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no tests/*.cs: %v", err)
	}
	run := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	lib := filepath.Join(dir, "Virtufin.Worker.dll")
	out := run(mcs, append([]string{"-target:library", "-warnaserror+", "-doc:" + filepath.Join(dir, "Virtufin.Worker.xml"), "-out:" + lib}, srcs...)...)
	if strings.Contains(out, "warning") {
		t.Fatalf("mcs warnings:\n%s", out)
	}
	var abs []string
	for _, p := range tests {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		abs = append(abs, a)
	}
	exe := filepath.Join(dir, "tests.exe")
	run(mcs, append([]string{"-warnaserror+", "-r:" + lib, "-r:Microsoft.CSharp.dll", "-out:" + exe}, abs...)...)
	out = run(mono, "--debug", exe)
	if !strings.Contains(out, " 0 failed") {
		t.Fatalf("unexpected test output:\n%s", out)
	}
	if testing.Verbose() {
		t.Log(out)
	}
}

func TestVersion(t *testing.T) {
	v := Version()
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(v) {
		t.Fatalf("Version() = %q", v)
	}
	src, err := os.ReadFile(filepath.Join("src", "DevKitInfo.cs"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(src, []byte(`public const string Version = "`+v+`";`)) {
		t.Fatalf("Version() = %q is not the line in src/DevKitInfo.cs", v)
	}
}

// Sources holds exactly src/*.cs (no tests), and Digest is a stable hash of them.
func TestSources(t *testing.T) {
	want, err := filepath.Glob(filepath.Join("src", "*.cs"))
	if err != nil {
		t.Fatal(err)
	}
	got := Sources()
	if len(got) != len(want) || len(got) == 0 {
		t.Fatalf("Sources() has %d files, src/ %d", len(got), len(want))
	}
	for _, p := range want {
		disk, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if b, ok := got[filepath.Base(p)]; !ok || !bytes.Equal(b, disk) {
			t.Errorf("%s: not in Sources() or different", p)
		}
	}
	for _, required := range []string{"DevKitInfo.cs", "CloudEvent.cs", "JsonNode.cs"} {
		if _, ok := got[required]; !ok {
			t.Errorf("Sources() lacks %s", required)
		}
	}
	got["DevKitInfo.cs"] = nil
	if len(Sources()["DevKitInfo.cs"]) == 0 {
		t.Error("changing the returned map changed the next one")
	}
	d := Digest()
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(d) || Digest() != d {
		t.Fatalf("Digest() = %q", d)
	}
}

// AssemblySources holds Sources and, for each, a copy in SeedNamespace
// with the same number of lines (compile errors keep their line numbers)
// and no trace of the other namespaces.
func TestAssemblySources(t *testing.T) {
	src, all := Sources(), AssemblySources()
	if len(all) != 2*len(src) {
		t.Fatalf("AssemblySources() has %d files, want %d", len(all), 2*len(src))
	}
	for name, b := range src {
		if !bytes.Equal(all[name], b) {
			t.Errorf("%s differs from Sources()", name)
		}
		c, ok := all["DevKit."+name]
		if !ok {
			t.Fatalf("no DevKit.%s", name)
		}
		if bytes.Count(c, []byte("\n")) != bytes.Count(b, []byte("\n")) {
			t.Errorf("DevKit.%s: %d lines, the source %d", name, bytes.Count(c, []byte("\n")), bytes.Count(b, []byte("\n")))
		}
		if !bytes.Contains(c, []byte("namespace "+SeedNamespace+"\n")) {
			t.Errorf("DevKit.%s is not in namespace %s", name, SeedNamespace)
		}
		for _, gone := range []string{"namespace Virtufin.Worker\n", "namespace Virtufin.Worker.Json\n", "using Virtufin.Worker.Json;"} {
			if bytes.Contains(c, []byte(gone)) {
				t.Errorf("DevKit.%s still has %q", name, gone)
			}
		}
	}
}
