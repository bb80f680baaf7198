package dotnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/spares"
	"github.com/virtufin/workmanager/engines/sandbox"
	dotnetdevkit "github.com/virtufin/workmanager/sdk/dotnet"
)

// runtime is the .NET runtime the engine runs hosts on, and the host and
// DevKit it built for it.
type runtime struct {
	mono, mcs string
	version   string // first line of `mono --version`
	dir       string // <cache>/runtime-<key>: wmhost.exe, wmcsc.exe and Virtufin.Worker.dll
	// mcsExe is the compiler's assembly (what the mcs script runs), which
	// spare compilers load (sparecompiler.go); "" when it was not found:
	// no spare compilers.
	mcsExe string
}

// DevKit assembly and host file names inside runtime.dir.
const (
	devKitDLL = "Virtufin.Worker.dll"
	hostExe   = "wmhost.exe"
	// compilerExe is the spare compiler's driver (host/Compiler.cs).
	compilerExe = "wmcsc.exe"
	// seedDevKitDLL is the original DevKit's file name: a worker
	// referencing that assembly gets the node's DevKit too.
	seedDevKitDLL = "Virtufin.Worker.DevKit.dll"
)

// isDevKit reports whether a package's file is a copy of the DevKit, under
// either name: the node's own is the one every worker uses.
func isDevKit(base string) bool {
	return strings.EqualFold(base, devKitDLL) || strings.EqualFold(base, seedDevKitDLL)
}

func (rt *runtime) describe() string {
	return rt.version + " (" + rt.mono + "), compiler " + rt.mcs + ", DevKit " + dotnetdevkit.Version()
}

func (rt *runtime) devKit() string { return filepath.Join(rt.dir, devKitDLL) }
func (rt *runtime) host() string   { return filepath.Join(rt.dir, hostExe) }

// mcsExeLine finds the assembly in a launcher script such as Debian's
// /usr/bin/mcs (`exec /usr/bin/mono $MONO_OPTIONS /usr/lib/mono/4.5/mcs.exe "$@"`).
var mcsExeLine = regexp.MustCompile(`(/[^\s"']*/mcs\.exe)\b`)

// findMcsExe is the assembly mcs runs: mcs itself when it is one, else the
// one its launcher script names, else <prefix>/lib/mono/4.5/mcs.exe next
// to mono; "" when none is a file.
func findMcsExe(mono, mcs string) string {
	if strings.HasSuffix(mcs, ".exe") {
		return mcs
	}
	var candidates []string
	if f, err := os.Open(mcs); err == nil {
		head := make([]byte, 4<<10)
		n, _ := io.ReadFull(f, head)
		f.Close()
		if m := mcsExeLine.FindSubmatch(head[:n]); m != nil {
			candidates = append(candidates, string(m[1]))
		}
	}
	candidates = append(candidates, filepath.Join(filepath.Dir(filepath.Dir(mono)), "lib", "mono", "4.5", "mcs.exe"))
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return c
		}
	}
	return ""
}

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
func (rt *runtime) build(ctx context.Context, cache string, host, driver []byte, logger *slog.Logger) error {
	out, err := exec.CommandContext(ctx, rt.mono, "--version").Output()
	if err != nil {
		return fmt.Errorf("dotnet engine: running %s --version: %w", rt.mono, err)
	}
	rt.version, _, _ = strings.Cut(string(out), "\n")
	rt.version = strings.TrimSpace(strings.TrimSuffix(rt.version, "(Debian"))
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00", rt.mono, rt.mcs, out, dotnetdevkit.Digest())
	h.Write([]byte("precompiled+wmcsc\x00")) // the build's steps (precompile)
	h.Write(host)
	h.Write(driver)
	rt.dir = filepath.Join(cache, "runtime-"+hex.EncodeToString(h.Sum(nil))[:16])
	rt.mcsExe = findMcsExe(rt.mono, rt.mcs)
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
	for name, b := range dotnetdevkit.AssemblySources() {
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
	driverFile := filepath.Join(src, "Compiler.cs")
	if err := os.WriteFile(driverFile, driver, 0o644); err != nil {
		return fmt.Errorf("dotnet engine: %w", err)
	}
	if diags, err := rt.mcsRun(ctx, []string{"-target:exe", "-out:" + filepath.Join(tmp, compilerExe), driverFile}); err != nil {
		return fmt.Errorf("dotnet engine: compiling the spare compiler: %w%s", err, diags.summary(src))
	}
	if err := os.RemoveAll(src); err != nil {
		return fmt.Errorf("dotnet engine: %w", err)
	}
	if err := rt.precompile(ctx, tmp); err != nil && logger != nil {
		logger.Warn("dotnet engine: the host's code is not precompiled; hosts compile it as they run it (a slower load and first call)", "error", err)
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

// precompile compiles the host's, the DevKit's and the spare compiler's
// driver's code to native code ahead of time (mono --aot: <assembly>.so
// beside each, which Mono loads instead of compiling the methods as they
// are first called), so that a host loading a worker and running its
// first call compiles only the worker's own code, and a spare compiler
// its driver's methods not at all. Best effort: without the native
// assembler and linker (binutils, which mono-devel depends on) or with an
// image Mono refuses, no image is left and the hosts compile those
// methods as before; the error says why.
func (rt *runtime) precompile(ctx context.Context, dir string) error {
	var errs []error
	for _, name := range []string{hostExe, devKitDLL, compilerExe} {
		cmd := exec.CommandContext(ctx, rt.mono, "--aot", filepath.Join(dir, name))
		cmd.Dir = dir
		cmd.Env = compilerEnv
		out := &boundedBuffer{max: 2 << 10}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Run(); err != nil {
			os.Remove(filepath.Join(dir, name+".so"))
			errs = append(errs, fmt.Errorf("mono --aot %s: %w: %s", name, err, out.text(512)))
		}
	}
	return errors.Join(errs...)
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

// mcsRun runs the compiler with args as the node (the DevKit and the
// host: the node's own sources, not a worker's); a failed compilation
// returns its diagnostics and an error. Its output is kept up to
// compilerOutputBytes.
func (rt *runtime) mcsRun(ctx context.Context, args []string) (diagnostics, error) {
	cmd := exec.CommandContext(ctx, rt.mcs, append([]string{"-debug-", "-optimize+"}, args...)...)
	out := &boundedBuffer{max: compilerOutputBytes}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.Env = append(os.Environ(), "LANG=C.UTF-8")
	err := cmd.Run()
	diags := parseDiagnostics(out.String())
	if ctx.Err() != nil {
		return diags, fmt.Errorf("the compiler did not finish: %w", ctx.Err())
	}
	if err != nil {
		if len(diags) == 0 {
			return nil, fmt.Errorf("%s failed (%v): %s", filepath.Base(rt.mcs), err, out.text(maxFailureText))
		}
		return diags, fmt.Errorf("%s failed", filepath.Base(rt.mcs))
	}
	return diags, nil
}

func parseDiagnostics(out string) diagnostics {
	var diags diagnostics
	for _, l := range strings.Split(out, "\n") {
		if m := mcsLine.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			diags = append(diags, diagnostic{file: m[1], line: m[2], column: m[3], severity: m[4], code: m[5], message: m[6]})
		}
	}
	return diags
}

// Bounds of one compile of a worker's C# source (Config.CompilerLimits
// sets others). mcs on Mono compiles an ordinary worker in about 0.2 CPU
// seconds with a peak of about 55 MiB resident and needs an address space
// of about 96 MiB (README.md has the measurements); a source that needs
// more than the defaults is refused as invalid code, naming the limit.
const (
	// DefaultCompilerMemory is the compiler's address space (RLIMIT_AS).
	DefaultCompilerMemory = 512 << 20
	// DefaultCompilerCPUSeconds is its CPU time (RLIMIT_CPU).
	DefaultCompilerCPUSeconds = 30
	// DefaultCompilerFileSize bounds the assembly it writes (RLIMIT_FSIZE).
	DefaultCompilerFileSize = 64 << 20
	// compilerOutputBytes is what is kept of its stdout and stderr
	// together; the rest is counted and dropped.
	compilerOutputBytes = 64 << 10
	// maxFailureText bounds the compiler's output quoted in an error that
	// is not a list of diagnostics.
	maxFailureText = 4 << 10
)

// compilerEnv is the compiler's whole environment: nothing of the node's.
var compilerEnv = []string{"LANG=C.UTF-8", "MONO_DISABLE_SHARED_AREA=1"}

// compiler is how a worker's C# source is compiled: inside the sandbox
// (sb, not Off) as a user id of its own, or, with no sandbox or
// SANDBOX=off, as the node under prlimit when there is one; in both cases
// with an empty environment and limits.
type compiler struct {
	sb *sandbox.Sandbox
	// owner is the sandbox owner the compile runs as (a user id of its
	// own, not the worker's: the worker's running hosts do not share the
	// compiler's process limit).
	owner  string
	limits sandbox.Limits
	// spares are the engine's spare compilers (sparecompiler.go); nil or
	// none ready: the compile starts its own.
	spares *spares.Set[*spareCompiler]
	// keptOwner is whose kept compilers the compile may take and keeps
	// its compiler for (keptOwner: the worker's tenant, else the worker;
	// "": none); kept the compilers kept for their owners' next compiles
	// (keptcompiler.go).
	keptOwner string
	kept      *keptCompilers
	// tenant scopes the compiled assembly's cache entry (cacheKey).
	tenant string
}

// cacheKey names a cache entry of parts (a source or a package, what it
// was built with) for tenant: a tenant's entries are its own, so no
// tenant learns from a create's speed that another uploaded the same
// code (a hit is a compile or an unpack skipped). With no tenant (a
// spec that names none) the entry is the content's alone, as before.
func cacheKey(tenant string, parts ...[]byte) string {
	h := sha256.New()
	if tenant != "" {
		h.Write([]byte("tenant\x00" + tenant + "\x00"))
	}
	for _, p := range parts {
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// compilerFor is how the source of the worker spec describes is compiled.
func (e *Engine) compilerFor(spec engines.Spec) compiler {
	l := e.cfg.CompilerLimits
	if l.AddressSpace == 0 {
		l.AddressSpace = DefaultCompilerMemory
	}
	if l.CPUSeconds == 0 {
		l.CPUSeconds = DefaultCompilerCPUSeconds
	}
	if l.FileSize == 0 {
		l.FileSize = DefaultCompilerFileSize
	}
	return compiler{sb: e.cfg.Sandbox, owner: spec.WorkerID + "\x00mcs", limits: l, spares: e.compilers, keptOwner: keptOwner(spec.Tenant, spec.WorkerID), kept: e.kept, tenant: spec.Tenant}
}

func (c compiler) sandboxed() bool { return c.sb != nil && c.sb.Mode() != sandbox.Off }

// bound reports whether the compiler sees its directories bound at
// compileSrcDir and compileOutDir: in the sandbox's namespaces (without
// them, an unprivileged container, it runs under the other layers on the
// host paths).
func (c compiler) bound() bool { return c.sandboxed() && c.sb.HasNamespaces() }

// Where the source and output directories are inside the sandbox.
const (
	compileSrcDir = "/compile/src"
	compileOutDir = "/compile/out"
)

// command is program (the compiler, or mono for a spare compiler) with
// args, reading srcDir and writing outDir (host paths; args name them as
// compileSrcDir and compileOutDir when sandboxed), and the function to
// call once it has exited.
func (c compiler) command(rt *runtime, program string, args []string, srcDir, outDir string) (*exec.Cmd, func(), error) {
	if !c.sandboxed() {
		path := program
		if pl, err := exec.LookPath("prlimit"); err == nil {
			l := c.limits
			pa := []string{"--core=0"}
			for _, x := range []struct {
				flag string
				v    uint64
			}{{"as", l.AddressSpace}, {"fsize", l.FileSize}, {"nofile", l.OpenFiles}, {"nproc", l.Processes}} {
				if x.v > 0 {
					pa = append(pa, fmt.Sprintf("--%s=%d", x.flag, x.v))
				}
			}
			if l.CPUSeconds > 0 { // SIGXCPU at the limit, as in the sandbox
				pa = append(pa, fmt.Sprintf("--cpu=%d:%d", l.CPUSeconds, l.CPUSeconds+1))
			}
			path, args = pl, append(append(pa, "--", program), args...)
		}
		cmd := exec.Command(path, args...)
		cmd.Env = compilerEnv
		cmd.Dir = srcDir
		return cmd, func() {}, nil
	}
	ro := []string{"/etc/mono", rt.dir}
	for _, p := range []string{rt.mcs, rt.mono} {
		// A runtime installed outside /usr (/opt/mono/bin/mono): its prefix.
		if prefix := filepath.Dir(filepath.Dir(p)); prefix != "/" && prefix != "/usr" && !strings.HasPrefix(prefix, "/usr/") {
			ro = append(ro, prefix)
		}
	}
	limits := c.limits
	cmd, release, err := c.sb.Command(sandbox.Spec{
		Owner: c.owner, Path: program, Args: args, Env: compilerEnv, ReadOnly: ro,
		Binds: []sandbox.Bind{
			{Src: srcDir, Dst: compileSrcDir},
			{Src: outDir, Dst: compileOutDir, Writable: true},
		},
		Limits: &limits,
	})
	if err != nil {
		return nil, nil, err
	}
	if uid, ok := c.sb.UID(c.owner); ok {
		if err := os.Chown(outDir, uid, uid); err != nil {
			release()
			return nil, nil, err
		}
	}
	return cmd, release, nil
}

// boundedBuffer keeps the first max bytes written to it and counts the
// rest.
type boundedBuffer struct {
	max     int
	b       []byte
	dropped int64
}

func (w *boundedBuffer) Write(p []byte) (int, error) {
	n := min(len(p), w.max-len(w.b))
	w.b = append(w.b, p[:n]...)
	w.dropped += int64(len(p) - n)
	return len(p), nil
}

func (w *boundedBuffer) String() string { return string(w.b) }

// text is what was kept, cut to limit bytes, trimmed, with a note of what
// was left out.
func (w *boundedBuffer) text(limit int) string {
	s := strings.TrimSpace(string(w.b))
	more := w.dropped
	if len(s) > limit {
		more += int64(len(s) - limit)
		s = strings.ToValidUTF8(s[:limit], "")
	}
	if more > 0 {
		s += fmt.Sprintf(" … (%d more bytes)", more)
	}
	return s
}

// outOfMemory reports whether the compiler's output says Mono ran out of
// memory: an OutOfMemoryException (mcs's internal compiler error CS0584,
// or unhandled) or the runtime's own allocation failure. Only lines the
// runtime writes match (a diagnostic starts with its file name).
func outOfMemory(out string) bool {
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "System.OutOfMemoryException"),
			strings.HasPrefix(l, "[ERROR] FATAL UNHANDLED EXCEPTION: System.OutOfMemoryException"),
			strings.HasPrefix(l, "Could not allocate "),
			strings.HasPrefix(l, "Error: Garbage collector could not allocate"):
			return true
		}
		if m := mcsLine.FindStringSubmatch(l); m != nil && m[5] == "CS0584" && strings.HasPrefix(m[6], "Internal compiler error: Out of memory") {
			return true
		}
		if strings.HasPrefix(l, "error CS0584: Internal compiler error: Out of memory") {
			return true
		}
	}
	return false
}

// signalOf is the signal that ended the compiler, if one did: directly, or
// as bwrap reports its child's (exit status 128+n; mcs itself exits 0 or
// 1).
func signalOf(st *os.ProcessState) syscall.Signal {
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok {
		return 0
	}
	if ws.Signaled() {
		return ws.Signal()
	}
	if code := ws.ExitStatus(); code > 128 && code < 128+65 {
		return syscall.Signal(code - 128)
	}
	return 0
}

// compileArgs are the compiler's arguments for srcDir/Worker.cs into
// outDir/Worker.dll (paths as the compiler sees them).
func (rt *runtime) compileArgs(srcDir, outDir, name string) []string {
	return []string{"-debug-", "-optimize+", "-target:library", "-out:" + filepath.Join(outDir, strings.TrimSuffix(name, ".cs")+".dll"),
		"-r:" + rt.devKit(), "-r:System.Net.Http.dll", "-r:Microsoft.CSharp.dll", "-r:System.Numerics.dll",
		filepath.Join(srcDir, name)}
}

// spareCompilerWait bounds how long a compile waits for a spare compiler
// being started (about 150 ms from its start on two idle cores) before it
// starts mcs itself (about 135 ms).
const spareCompilerWait = 400 * time.Millisecond

// runCompiler compiles code (Worker.cs) with c: in a compiler kept for
// c's tenant or worker (keptcompiler.go) or a spare compiler when one is ready
// (sparecompiler.go), else in a compiler started for it that reads
// dir/src and writes dir/out. It returns where the assembly is and a
// function to call once the assembly has been moved away (moved true) or
// will not be (false). Compile errors, and a source that takes the
// compiler past a limit, are ErrInvalidCode.
func (rt *runtime) runCompiler(ctx context.Context, c compiler, code []byte, dir string) (string, func(moved bool), error) {
	if c.spares != nil && rt.mcsExe != "" {
		// A compiler kept for the worker's tenant (or the worker) when one
		// is ready; else a spare ready now (a kept compiler staging again
		// after the compile just before, calls back to back, is not
		// ready); else a kept one once it is ready; else a spare being started, waited
		// for rather than starting mcs beside it (spares.Set.TakeAwaiting).
		refill := func() {}
		sc := c.kept.take(ctx, c.keptOwner, rt, 0)
		if sc == nil {
			var ok bool
			if sc, ok, refill = c.spares.TakeDeferred(); !ok {
				if sc = c.kept.take(ctx, c.keptOwner, rt, keptWait); sc == nil {
					sc, _, refill = c.spares.TakeAwaiting(ctx, spareCompilerWait)
				}
			}
		}
		// The next spare starts once this compile is done.
		defer refill()
		if sc != nil {
			built, err := sc.compile(ctx, rt, c, code)
			return built, func(moved bool) {
				if !moved || !c.kept.keep(c.keptOwner, rt, sc) {
					sc.Release()
				}
			}, err
		}
	}
	// The compiler reads src (its own copy of the source) and writes out,
	// which is its user id's while it runs.
	srcDir, outDir := filepath.Join(dir, "src"), filepath.Join(dir, "out")
	for _, d := range []string{srcDir, outDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", nil, fmt.Errorf("dotnet engine: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(srcDir, sourceFile), code, 0o644); err != nil {
		return "", nil, fmt.Errorf("dotnet engine: %w", err)
	}
	shownSrc, shownOut := srcDir, outDir
	if c.bound() {
		shownSrc, shownOut = compileSrcDir, compileOutDir
	}
	cmd, release, err := c.command(rt, rt.mcs, rt.compileArgs(shownSrc, shownOut, sourceFile), srcDir, outDir)
	if err != nil {
		return "", nil, fmt.Errorf("dotnet engine: compiling the C# source: %w", err)
	}
	out := &boundedBuffer{max: compilerOutputBytes}
	cmd.Stdout, cmd.Stderr = out, out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		release()
		return "", nil, fmt.Errorf("dotnet engine: starting the C# compiler: %w", err)
	}
	pid := cmd.Process.Pid
	stop := context.AfterFunc(ctx, func() { syscall.Kill(-pid, syscall.SIGKILL) })
	werr := cmd.Wait()
	stop()
	release()
	built := filepath.Join(outDir, "Worker.dll")
	return built, func(bool) {}, rt.judge(ctx, c, cmd.ProcessState, werr, out, shownSrc, built)
}

// judge is what a compile that ended with st and werr (cmd.Wait's), with
// output out, comes to: nil when it succeeded; ErrInvalidCode naming the
// limit or the compile errors (paths relative to shownSrc) when the source
// is at fault; another error otherwise.
func (rt *runtime) judge(ctx context.Context, c compiler, st *os.ProcessState, werr error, out *boundedBuffer, shownSrc, built string) error {
	if ctx.Err() != nil {
		return engines.ContextError(ctx, "dotnet", "compiling the C# source")
	}
	if werr == nil {
		return nil
	}
	if st == nil { // not an exit status: the output could not be copied
		return fmt.Errorf("dotnet engine: compiling the C# source: %w", werr)
	}
	l := c.limits
	sig := signalOf(st)
	// The CPU limit shows as SIGXCPU (Mono does not handle it); a SIGKILL
	// at the CPU limit would be the hard limit a second later. The CPU
	// time the node sees is the compiler's only without the sandbox (bwrap
	// does not pass on its children's usage).
	cpu := st.UserTime() + st.SystemTime()
	text := out.String()
	switch {
	case l.CPUSeconds > 0 && (sig == syscall.SIGXCPU || sig == syscall.SIGKILL && cpu >= time.Duration(l.CPUSeconds)*time.Second):
		return fmt.Errorf("%w: the C# compiler exceeded its CPU time limit of %d s compiling this source", engines.ErrInvalidCode, l.CPUSeconds)
	case l.AddressSpace > 0 && (outOfMemory(text) || sig == syscall.SIGKILL):
		// SIGKILL: the memory cgroup's OOM killer (the sandbox's memory
		// layer), whose bound is above the address space's.
		return fmt.Errorf("%w: the C# compiler exceeded its memory limit of %s compiling this source (string constants that double, huge initializers?)", engines.ErrInvalidCode, bytesText(l.AddressSpace))
	case l.FileSize > 0 && (sig == syscall.SIGXFSZ || fileAtLeast(built, l.FileSize)):
		return fmt.Errorf("%w: the assembly compiled from this source exceeds the compiler's file size limit of %s", engines.ErrInvalidCode, bytesText(l.FileSize))
	}
	if sum := parseDiagnostics(text).summary(shownSrc); sum != "" {
		return fmt.Errorf("%w: compile error%s", engines.ErrInvalidCode, sum)
	}
	return fmt.Errorf("dotnet engine: compiling the C# source: %s failed (%v): %s", filepath.Base(rt.mcs), werr, out.text(maxFailureText))
}

// bytesText is n in MiB, KiB or bytes, whichever is whole.
func bytesText(n uint64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// fileAtLeast reports whether p is a file of n bytes or more.
func fileAtLeast(p string, n uint64) bool {
	st, err := os.Lstat(p)
	return err == nil && uint64(st.Size()) >= n
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

// compile compiles a C# source worker into <cache>/cs-<key>/Worker.dll
// with c, unless it is there already (Check then Load, a reload of the
// same code, another node sharing the cache). Compiler errors are
// ErrInvalidCode with Worker.cs:line:column for each, and so is a source
// that takes the compiler past one of its limits.
func (rt *runtime) compile(ctx context.Context, cache string, code []byte, c compiler) (*workerCode, error) {
	if len(bytes.TrimSpace(code)) == 0 {
		return nil, fmt.Errorf("%w: the C# source is empty", engines.ErrInvalidCode)
	}
	dir := filepath.Join(cache, "cs-"+cacheKey(c.tenant, []byte(rt.dir), code))
	dll := filepath.Join(dir, "Worker.dll")
	w := &workerCode{assemblies: []string{dll}, probe: []string{dir}, dir: dir}
	if _, err := os.Stat(dll); err == nil {
		return w, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, fmt.Errorf("dotnet engine: cache directory: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, ".cs-")
	if err != nil {
		return nil, fmt.Errorf("dotnet engine: cache directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	built, done, err := rt.runCompiler(ctx, c, code, tmp)
	if err != nil {
		if done != nil {
			done(false)
		}
		return nil, err
	}
	moved := false
	defer func() { done(moved) }()
	// The assembly becomes the node's, read-only for everyone else, before
	// it moves into place.
	st, err := os.Lstat(built)
	if err != nil || !st.Mode().IsRegular() {
		return nil, fmt.Errorf("dotnet engine: the C# compiler succeeded but wrote no assembly (%v)", err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink != 1 {
		return nil, fmt.Errorf("dotnet engine: the C# compiler's assembly has %d links", sys.Nlink)
	}
	if err := os.Lchown(built, os.Getuid(), os.Getgid()); err != nil {
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	if err := os.Chmod(built, 0o644); err != nil {
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	if err := os.Rename(built, filepath.Join(tmp, "Worker.dll")); err != nil {
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	moved = true
	for _, d := range []string{"src", "out"} {
		if err := os.RemoveAll(filepath.Join(tmp, d)); err != nil {
			return nil, fmt.Errorf("dotnet engine: %w", err)
		}
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
