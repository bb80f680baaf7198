package dotnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/virtufin/workmanager/engines"
	dotnetdevkit "github.com/virtufin/workmanager/sdk/dotnet"
)

// runtime is the .NET runtime the engine runs hosts on, and the host and
// DevKit it built for it.
type runtime struct {
	mono, mcs string
	version   string // first line of `mono --version`
	dir       string // <cache>/runtime-<key>: wmhost.exe and Virtufin.Worker.dll
}

// DevKit assembly and host file names inside runtime.dir.
const (
	devKitDLL = "Virtufin.Worker.dll"
	hostExe   = "wmhost.exe"
)

func (rt *runtime) describe() string {
	return rt.version + " (" + rt.mono + "), compiler " + rt.mcs + ", DevKit " + dotnetdevkit.Version()
}

func (rt *runtime) devKit() string { return filepath.Join(rt.dir, devKitDLL) }
func (rt *runtime) host() string   { return filepath.Join(rt.dir, hostExe) }

// Where discover looks when no path is configured, in order.
var (
	monoCandidates = []string{"/usr/bin/mono", "/usr/local/bin/mono", "/opt/mono/bin/mono"}
	mcsCandidates  = []string{"/usr/bin/mcs", "/usr/local/bin/mcs", "/opt/mono/bin/mcs"}
)

// discover finds mono and mcs: the configured paths, else PATH, else the
// usual install locations. The error names every path it tried, and a
// CoreCLR install (DOTNET_ROOT, dotnet on PATH) if there is one, which
// this build does not run workers on (README.md says why).
func discover(mono, mcs string) (*runtime, error) {
	var tried []string
	find := func(configured, name string, candidates []string) string {
		if configured != "" {
			if isExecutable(configured) {
				return configured
			}
			tried = append(tried, configured+" (configured; not an executable file)")
			return ""
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
		tried = append(tried, name+" on PATH ("+os.Getenv("PATH")+")")
		for _, c := range candidates {
			if isExecutable(c) {
				return c
			}
			tried = append(tried, c)
		}
		return ""
	}
	rt := &runtime{mono: find(mono, "mono", monoCandidates), mcs: find(mcs, "mcs", mcsCandidates)}
	if rt.mono != "" && rt.mcs != "" {
		return rt, nil
	}
	missing := "the Mono runtime (mono)"
	if rt.mono != "" {
		missing = "the Mono C# compiler (mcs)"
	} else if rt.mcs == "" {
		missing = "the Mono runtime (mono) and C# compiler (mcs)"
	}
	msg := fmt.Sprintf("this engine runs .NET workers on %s (Debian packages mono-runtime, mono-mcs and mono-devel; `make test` and `make run` install them); searched: %s",
		missing, strings.Join(tried, ", "))
	if core := coreCLR(); core != "" {
		msg += "; found CoreCLR at " + core + ", which this build does not host (see engines/dotnet/README.md)"
	}
	return nil, fmt.Errorf("dotnet engine: %w: %s", ErrNoRuntime, msg)
}

// coreCLR returns where a dotnet host is installed, if anywhere.
func coreCLR() string {
	if root := os.Getenv("DOTNET_ROOT"); root != "" && isExecutable(filepath.Join(root, "dotnet")) {
		return filepath.Join(root, "dotnet")
	}
	if p, err := exec.LookPath("dotnet"); err == nil {
		return p
	}
	for _, c := range []string{"/usr/share/dotnet/dotnet", "/usr/lib/dotnet/dotnet", "/usr/local/share/dotnet/dotnet"} {
		if isExecutable(c) {
			return c
		}
	}
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// build compiles the DevKit and the host into <cache>/runtime-<key>, key
// naming the compiler, the runtime and every source, unless a complete
// build is there already (another node sharing the cache may have made
// it). Files are world-readable: sandboxed hosts run as other users.
func (rt *runtime) build(ctx context.Context, cache string, host []byte) error {
	out, err := exec.CommandContext(ctx, rt.mono, "--version").Output()
	if err != nil {
		return fmt.Errorf("dotnet engine: running %s --version: %w", rt.mono, err)
	}
	rt.version, _, _ = strings.Cut(string(out), "\n")
	rt.version = strings.TrimSpace(strings.TrimSuffix(rt.version, "(Debian"))
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00", rt.mono, rt.mcs, out, dotnetdevkit.Digest())
	h.Write(host)
	rt.dir = filepath.Join(cache, "runtime-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(rt.dir, hostExe)); err == nil {
		return nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return fmt.Errorf("dotnet engine: cache directory: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, ".build-")
	if err != nil {
		return fmt.Errorf("dotnet engine: cache directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return fmt.Errorf("dotnet engine: %w", err)
	}
	var devkitFiles []string
	for name, b := range dotnetdevkit.Sources() {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return fmt.Errorf("dotnet engine: %w", err)
		}
		devkitFiles = append(devkitFiles, p)
	}
	sort.Strings(devkitFiles)
	hostFile := filepath.Join(src, "Host.cs")
	if err := os.WriteFile(hostFile, host, 0o644); err != nil {
		return fmt.Errorf("dotnet engine: %w", err)
	}
	lib := filepath.Join(tmp, devKitDLL)
	if diags, err := rt.mcsRun(ctx, append([]string{"-target:library", "-out:" + lib}, devkitFiles...)); err != nil {
		return fmt.Errorf("dotnet engine: compiling the DevKit: %w%s", err, diags.summary(src))
	}
	exe := filepath.Join(tmp, hostExe)
	if diags, err := rt.mcsRun(ctx, []string{"-target:exe", "-out:" + exe, "-r:" + lib, hostFile}); err != nil {
		return fmt.Errorf("dotnet engine: compiling the worker host: %w%s", err, diags.summary(src))
	}
	if err := os.RemoveAll(src); err != nil {
		return fmt.Errorf("dotnet engine: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("dotnet engine: %w", err)
	}
	if err := os.Rename(tmp, rt.dir); err != nil {
		if _, serr := os.Stat(filepath.Join(rt.dir, hostExe)); serr == nil {
			return nil // another node finished the same build first
		}
		return fmt.Errorf("dotnet engine: %w", err)
	}
	return nil
}

// diagnostic is one compiler message.
type diagnostic struct {
	file         string
	line, column string
	severity     string // "error" or "warning"
	code         string // CS1002
	message      string
}

type diagnostics []diagnostic

// mcsLine matches `path(line,col): error CS1002: ; expected`.
var mcsLine = regexp.MustCompile(`^(.*)\((\d+),(\d+)\): (error|warning) (CS\d+): (.*)$`)

// mcsRun runs the compiler with args; a failed compilation returns its
// diagnostics and an error.
func (rt *runtime) mcsRun(ctx context.Context, args []string) (diagnostics, error) {
	cmd := exec.CommandContext(ctx, rt.mcs, append([]string{"-debug-", "-optimize+"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.Env = append(os.Environ(), "LANG=C.UTF-8")
	err := cmd.Run()
	var diags diagnostics
	for _, l := range strings.Split(out.String(), "\n") {
		if m := mcsLine.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			diags = append(diags, diagnostic{file: m[1], line: m[2], column: m[3], severity: m[4], code: m[5], message: m[6]})
		}
	}
	if ctx.Err() != nil {
		return diags, fmt.Errorf("the compiler did not finish: %w", ctx.Err())
	}
	if err != nil {
		if len(diags) == 0 {
			return nil, fmt.Errorf("%s failed (%v): %s", filepath.Base(rt.mcs), err, strings.TrimSpace(out.String()))
		}
		return diags, fmt.Errorf("%s failed", filepath.Base(rt.mcs))
	}
	return diags, nil
}

// maxDiagnostics bounds the errors quoted in one message.
const maxDiagnostics = 10

// summary formats the errors, paths relative to dir.
func (d diagnostics) summary(dir string) string {
	var parts []string
	n := 0
	for _, x := range d {
		if x.severity != "error" {
			continue
		}
		n++
		if len(parts) < maxDiagnostics {
			file := x.file
			if rel, err := filepath.Rel(dir, file); err == nil && !strings.HasPrefix(rel, "..") {
				file = rel
			}
			parts = append(parts, fmt.Sprintf("%s:%s:%s: error %s: %s", file, x.line, x.column, x.code, x.message))
		}
	}
	if n == 0 {
		return ""
	}
	s := ": " + strings.Join(parts, "; ")
	if n > len(parts) {
		s += fmt.Sprintf("; and %d more errors", n-len(parts))
	}
	return s
}

// workerCode is what a host loads: assemblies and the directories their
// dependencies are resolved from.
type workerCode struct {
	assemblies []string
	probe      []string
	// dir is the directory to bind into the sandbox (it holds the rest).
	dir string
}

// sourceFile is the name a C# source worker's code has in compiler
// messages.
const sourceFile = "Worker.cs"

// compile compiles a C# source worker into <cache>/cs-<key>/Worker.dll,
// unless it is there already (Check then Load, a reload of the same code,
// another node sharing the cache). Compiler errors are ErrInvalidCode with
// Worker.cs:line:column for each.
func (rt *runtime) compile(ctx context.Context, cache string, code []byte) (*workerCode, error) {
	if len(bytes.TrimSpace(code)) == 0 {
		return nil, fmt.Errorf("%w: the C# source is empty", engines.ErrInvalidCode)
	}
	h := sha256.New()
	h.Write([]byte(rt.dir))
	h.Write(code)
	dir := filepath.Join(cache, "cs-"+hex.EncodeToString(h.Sum(nil))[:24])
	dll := filepath.Join(dir, "Worker.dll")
	w := &workerCode{assemblies: []string{dll}, probe: []string{dir}, dir: dir}
	if _, err := os.Stat(dll); err == nil {
		return w, nil
	}
	tmp, err := os.MkdirTemp(cache, ".cs-")
	if err != nil {
		return nil, fmt.Errorf("dotnet engine: cache directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, sourceFile)
	if err := os.WriteFile(src, code, 0o644); err != nil {
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	diags, err := rt.mcsRun(ctx, []string{"-target:library", "-out:" + filepath.Join(tmp, "Worker.dll"),
		"-r:" + rt.devKit(), "-r:System.Net.Http.dll", "-r:Microsoft.CSharp.dll", "-r:System.Numerics.dll", src})
	if err != nil {
		if ctx.Err() != nil {
			return nil, engines.ContextError(ctx, "dotnet", "compiling the C# source")
		}
		if len(diags) == 0 {
			return nil, fmt.Errorf("dotnet engine: compiling the C# source: %w", err)
		}
		return nil, fmt.Errorf("%w: compile error%s", engines.ErrInvalidCode, diags.summary(tmp))
	}
	if err := os.Remove(src); err != nil {
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, serr := os.Stat(dll); serr != nil {
			return nil, fmt.Errorf("dotnet engine: %w", err)
		}
	}
	return w, nil
}
