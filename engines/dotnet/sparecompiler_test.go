package dotnet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/internal/ownerdir"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// waitSpareCompiler waits until e has a warm spare compiler other than
// the ones in not, and returns it.
func waitSpareCompiler(t *testing.T, e *Engine, not ...*spareCompiler) *spareCompiler {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		for _, s := range e.compilers.Ready() {
			seen := false
			for _, n := range not {
				seen = seen || n == s
			}
			if !seen {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no spare compiler ready after 2 minutes")
		}
	}
}

// warmedEngine is a new engine with cfg, in the strict sandbox when mode
// is "strict", its runtime found and built, and a context for its calls.
func warmedEngine(t *testing.T, cfg Config, mode string) (*Engine, context.Context) {
	t.Helper()
	if mode == "strict" {
		cfg.Sandbox = sandboxtest.Strict(t)
	}
	e := New(cfg)
	t.Cleanup(func() { _ = e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	if _, err := e.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	return e, ctx
}

// unique is code with a line of its own, so that the compile cache does
// not answer.
func unique(code []byte, tag string) []byte {
	return append(append([]byte(nil), code...), "\n// "+tag+"\n"...)
}

// takenBy waits until spare s has been used (its process exited, its slot
// removed).
func takenBy(t *testing.T, s *spareCompiler) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(s.slot); s.Exited() && os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("spare compiler %s not used (exited %v)", s.slot, s.Exited())
		}
	}
}

// A spare compiler compiles one worker's source, once, with what a
// compiler started for it would say: the same assembly (loaded by a
// host), the same errors naming Worker.cs (never the warm-up's source or
// the sandbox's paths), the same limits; it runs as a user id of its
// own; one killed while it waits is not used and compiles go on.
func TestSpareCompilerCompilesOneSourceOnce(t *testing.T) {
	for _, mode := range []string{"strict", "no sandbox"} {
		t.Run(mode, func(t *testing.T) {
			cfg := Config{CacheDir: t.TempDir(), SpareCompilers: 1}
			e, ctx := warmedEngine(t, cfg, mode)
			if e.currentRuntime().mcsExe == "" {
				t.Fatal("mcs.exe not found next to " + e.currentRuntime().mcs)
			}
			check := func(name string, code []byte) error {
				return e.Check(ctx, engines.Spec{WorkerID: name, MIMEType: MIMESource}, code)
			}
			// The first compile finds none ready and starts one.
			if err := check("first", unique(fixture(t, "echo"), "first")); err != nil {
				t.Fatal(err)
			}
			s := waitSpareCompiler(t, e)
			if !s.output.staged {
				t.Fatalf("the spare did not stage its compile (it said %q)", s.output.before())
			}
			for dir, want := range map[string][]string{s.src: {"Warm.cs"}, s.out: nil} {
				entries, err := os.ReadDir(dir)
				var names []string
				for _, d := range entries {
					names = append(names, d.Name())
				}
				if err != nil || fmt.Sprint(names) != fmt.Sprint(want) {
					t.Fatalf("a waiting spare's %s holds %v (%v), want %v", dir, names, err, want)
				}
			}
			if st, err := os.Stat(s.out); err != nil {
				t.Fatal(err)
			} else if uid := st.Sys().(*syscall.Stat_t).Uid; mode == "strict" && int(uid) == os.Getuid() {
				t.Fatalf("the spare's out directory belongs to the node's user id %d: not a user id of its own", uid)
			}

			if err := check("echo", unique(fixture(t, "echo"), "echo")); err != nil {
				t.Fatalf("echo on a spare: %v", err)
			}
			takenBy(t, s)

			s2 := waitSpareCompiler(t, e, s)
			err := check("invalid", unique(fixture(t, "invalid"), "invalid"))
			if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "Worker.cs:9:4: error CS1525") ||
				strings.Contains(err.Error(), "/compile/") || strings.Contains(err.Error(), "Warm") {
				t.Fatalf("invalid on a spare: err = %v, want ErrInvalidCode with Worker.cs:9:4: error CS1525 and nothing of the warm-up", err)
			}
			takenBy(t, s2)

			s3 := waitSpareCompiler(t, e, s, s2)
			err = check("bomb", compileBomb())
			want := fmt.Sprintf("the C# compiler exceeded its memory limit of %d MiB", DefaultCompilerMemory>>20)
			if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), want) {
				t.Fatalf("bomb on a spare: err = %v, want ErrInvalidCode with %q", err, want)
			}
			takenBy(t, s3)

			// A spare killed while it waits is not used; the compile
			// starts its own.
			s4 := waitSpareCompiler(t, e, s, s2, s3)
			if err := syscall.Kill(-s4.cmd.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(30 * time.Second); !s4.Exited(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the killed spare did not exit")
				}
			}
			if err := check("after", unique(fixture(t, "echo"), "after a spare died")); err != nil {
				t.Fatalf("after a spare died: %v", err)
			}
			takenBy(t, s4)
			if left, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "compilers", "owner-*", "slot-*")); len(left) > 1 {
				t.Fatalf("slots left: %v, want at most the next spare's", left)
			}
		})
	}
}

// A waiting spare imports the members of the types workers use most (its
// preload thread, host/Compiler.cs) and compiles what a compiler started
// for it compiles: a worker using LINQ, lambdas, an async method and
// string interpolation answers as it should, and an invalid source gets a
// fresh compiler's errors, whether the spare was taken as soon as it was
// ready (its preload stopped part way) or after its preload was done.
func TestSpareCompilerPreloadChangesNothingButSpeed(t *testing.T) {
	e := New(Config{CacheDir: t.TempDir(), SpareCompilers: 1, Sandbox: sandboxtest.Strict(t)})
	t.Cleanup(func() { _ = e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	if _, err := e.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	// The first compile finds none ready and starts one.
	if err := e.Check(ctx, engines.Spec{WorkerID: "first", MIMEType: MIMESource}, unique(fixture(t, "echo"), "first")); err != nil {
		t.Fatal(err)
	}
	var taken []*spareCompiler
	for _, wait := range []bool{false, true} {
		s := waitSpareCompiler(t, e, taken...)
		taken = append(taken, s)
		if wait {
			waitPreloaded(t, s)
		}
		tag := fmt.Sprintf("rich waited=%v", wait)
		spec := engines.Spec{WorkerID: tag, MIMEType: MIMESource}
		code := unique(fixture(t, "rich"), tag)
		if err := e.Check(ctx, spec, code); err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		takenBy(t, s)
		servesRich(t, ctx, e, spec, code, tag)

		s = waitSpareCompiler(t, e, taken...)
		taken = append(taken, s)
		if wait {
			waitPreloaded(t, s)
		}
		err := e.Check(ctx, engines.Spec{WorkerID: "invalid", MIMEType: MIMESource}, unique(fixture(t, "invalid"), tag))
		if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "Worker.cs:9:4: error CS1525") {
			t.Fatalf("%s: invalid: err = %v, want ErrInvalidCode with Worker.cs:9:4: error CS1525", tag, err)
		}
		takenBy(t, s)
	}
}

// servesRich loads code, testdata/rich.cs checked for spec, and requires
// its answer to an event (what tag names fails).
func servesRich(t *testing.T, ctx context.Context, e *Engine, spec engines.Spec, code []byte, tag string) {
	t.Helper()
	inst, err := e.Load(ctx, spec, code)
	if err != nil {
		t.Fatal(err)
	}
	out, err := inst.Process(ctx, enginetest.NewEvent("r1", "t", map[string]any{"x": 1}, ""))
	_ = inst.Close(ctx)
	if err != nil || len(out) != 1 || out[0].Type() != "rich.out" {
		t.Fatalf("%s: outputs %v, err %v", tag, out, err)
	}
	var got map[string]any
	if err := out[0].DataAs(&got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"total": 13.0, "names": "4.0+2.5+1.5", "rounded": "2;2;4;", "count": 1.0, "summary": "r1:13.0:3", "input": map[string]any{"x": 1.0}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: the rich worker answered %v, want %v", tag, got, want)
	}
}

// waitPreloaded waits until spare s's preload thread (started before the
// spare says it is ready) has ended.
func waitPreloaded(t *testing.T, s *spareCompiler) {
	t.Helper()
	mono := monoUnder(t, s.cmd.Process.Pid)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		comms, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/comm", mono))
		running := false
		for _, c := range comms {
			b, _ := os.ReadFile(c)
			running = running || strings.TrimSpace(string(b)) == "wmcsc preload"
		}
		if !running && len(comms) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the spare's preload did not end within a minute")
		}
	}
}

// A spare compiler asked for a compile other than the one it staged, or
// whose staging failed, compiles from the start, as mcs would: the staged
// state is never what answers a different compile.
func TestSpareCompilerUnstagedCompilesFromTheStart(t *testing.T) {
	e := New(Config{CacheDir: t.TempDir()})
	t.Cleanup(func() { _ = e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := e.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	rt := e.currentRuntime()
	// run starts wmcsc.exe staging stage (nil: nothing), sends it args and
	// returns what it said and its exit status.
	run := func(t *testing.T, dir string, stage, args []string) (string, error) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "Warm.cs"), []byte(warmSource), 0o644); err != nil {
			t.Fatal(err)
		}
		cmdArgs := append([]string{filepath.Join(rt.dir, compilerExe), rt.mcsExe, filepath.Join(dir, "Warm.dll")}, rt.compileArgs(dir, dir, "Warm.cs")...)
		if stage != nil {
			cmdArgs = append(append(cmdArgs, "--"), stage...)
		}
		cmd := exec.CommandContext(ctx, rt.mono, cmdArgs...)
		cmd.Stdin = strings.NewReader("0123\n" + strings.Join(args, "\n") + "\n\n")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	src := func(t *testing.T, code []byte) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, sourceFile), code, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}

	t.Run("other arguments", func(t *testing.T) {
		dir := src(t, fixture(t, "echo"))
		staged := rt.compileArgs(dir, dir, sourceFile)
		other := append(append([]string(nil), staged[:len(staged)-1]...), "-out:"+filepath.Join(dir, "Other.dll"), staged[len(staged)-1])
		out, err := run(t, dir, staged, other)
		if err != nil || !strings.Contains(out, stagedMarker+readyMarker) || !strings.Contains(out, "\x01wmcsc done 0123") {
			t.Fatalf("err = %v, output %q: want staged, then done", err, out)
		}
		// The last -out: wins, as for mcs: the staged Worker.dll is not
		// what was written.
		if _, err := os.Stat(filepath.Join(dir, "Other.dll")); err != nil {
			t.Fatalf("the compile asked for did not write Other.dll: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "Worker.dll")); err == nil {
			t.Fatal("the staged compile wrote Worker.dll for a compile that asked for Other.dll")
		}
	})

	t.Run("staging failed", func(t *testing.T) {
		dir := src(t, fixture(t, "echo"))
		args := append(rt.compileArgs(dir, dir, sourceFile), "-r:/nonexistent/Missing.dll")
		out, err := run(t, dir, args, args)
		mcsOut, _ := exec.CommandContext(ctx, rt.mcs, args...).CombinedOutput()
		if err == nil || strings.Contains(out, stagedMarker) || !strings.Contains(out, "error CS0006: Metadata file `/nonexistent/Missing.dll' could not be found") ||
			!strings.Contains(string(mcsOut), "error CS0006: Metadata file `/nonexistent/Missing.dll' could not be found") {
			t.Fatalf("err = %v, output %q (mcs: %q): want no staging and mcs's error", err, out, mcsOut)
		}
	})
}

// A compile on a spare stays under the compiler's CPU-time limit, its
// warm-up counted.
func TestSpareCompilerLimits(t *testing.T) {
	cfg := Config{CacheDir: t.TempDir(), SpareCompilers: 1, Sandbox: sandboxtest.Strict(t)}
	cfg.CompilerLimits.CPUSeconds = 2
	e := New(cfg)
	t.Cleanup(func() { _ = e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := e.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(ctx, engines.Spec{WorkerID: "first", MIMEType: MIMESource}, unique(fixture(t, "echo"), "limits first")); err != nil {
		t.Fatal(err)
	}
	s := waitSpareCompiler(t, e)
	err := e.Check(ctx, engines.Spec{WorkerID: "cpu", MIMEType: MIMESource}, unique(cpuBomb(9), "limits cpu"))
	if want := "the C# compiler exceeded its CPU time limit of 2 s"; !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want ErrInvalidCode with %q", err, want)
	}
	takenBy(t, s)
}

// The ready marker and the done line are found whatever pieces the output
// comes in; a done line with another nonce (or before the marker) is not
// the one expected.
func TestReadyWriterFindsItsLinesInPieces(t *testing.T) {
	out := "warming\n" + readyMarker + "Worker.cs(1,1): warning CS0000: \x01wmcsc done 0000\n\x01wmcsc done abcd\n"
	for _, piece := range []int{1, 2, 3, 7, len(out)} {
		w := &readyWriter{ready: make(chan struct{})}
		var finished <-chan struct{}
		for i := 0; i < len(out); i += piece {
			select {
			case <-w.ready:
				if finished == nil {
					finished = w.expect("\x01wmcsc done abcd\n")
				}
			default:
			}
			w.Write([]byte(out[i:min(i+piece, len(out))]))
			if finished != nil && i+piece < len(out)-1 {
				select {
				case <-finished:
					t.Fatalf("pieces of %d: done after %q", piece, out[:i+piece])
				default:
				}
			}
		}
		select {
		case <-w.ready:
		default:
			t.Fatalf("pieces of %d: not ready", piece)
		}
		if finished == nil {
			finished = w.expect("\x01wmcsc done abcd\n") // the marker came in the last piece
		}
		if piece != len(out) {
			select {
			case <-finished:
			default:
				t.Fatalf("pieces of %d: the done line was not found", piece)
			}
		}
		if got := w.before(); got != "warming" {
			t.Fatalf("pieces of %d: before = %q", piece, got)
		}
		if !strings.HasPrefix(w.after.String(), "Worker.cs(1,1)") {
			t.Fatalf("pieces of %d: after = %q", piece, w.after.String())
		}
	}
}

// What a crashed node left in a shared cache (its owner directories of
// slots, whose locks nobody holds; old slots of the layout before owners;
// unfinished compile directories) is removed by the next engine that
// starts a spare; a live engine's directories, and recent ones no lock
// covers, are left alone; a closed engine leaves nothing of its spares.
func TestStaleSlotsAreSwept(t *testing.T) {
	cache := t.TempDir()
	mk := func(path string, age time.Duration) string {
		t.Helper()
		if err := os.MkdirAll(path, 0o755); err != nil {
			t.Fatal(err)
		}
		if age > 0 {
			old := time.Now().Add(-age)
			if err := os.Chtimes(path, old, old); err != nil {
				t.Fatal(err)
			}
		}
		return path
	}
	compilers := filepath.Join(cache, "compilers")
	// A live engine's owner directory: its lock held (here, by the test).
	live := mk(filepath.Join(compilers, "owner-live", "slot-a"), 0)
	lock, err := os.OpenFile(filepath.Join(compilers, "owner-live", ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	dead := mk(filepath.Join(compilers, "owner-dead", "slot-b"), 0)
	if err := os.WriteFile(filepath.Join(compilers, "owner-dead", ".lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	oldSlot := mk(filepath.Join(compilers, "slot-old"), time.Hour)
	newSlot := mk(filepath.Join(compilers, "slot-new"), 0)
	oldCompile := mk(filepath.Join(cache, ".cs-old"), time.Hour)
	newCompile := mk(filepath.Join(cache, ".cs-new"), 0)

	e := New(Config{CacheDir: cache, SpareCompilers: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := e.Check(ctx, engines.Spec{WorkerID: "sweep", MIMEType: MIMESource}, unique(fixture(t, "echo"), "sweep")); err != nil {
		t.Fatal(err)
	}
	s := waitSpareCompiler(t, e)
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	for _, p := range []string{live, newSlot, newCompile, s.slot} {
		if !exists(p) {
			t.Errorf("%s was removed", p)
		}
	}
	for _, p := range []string{filepath.Dir(dead), oldSlot, oldCompile} {
		if exists(p) {
			t.Errorf("%s was left", p)
		}
	}
	owner := filepath.Dir(s.slot)
	if !strings.HasPrefix(filepath.Base(owner), "owner-") || !ownerdir.Alive(owner) {
		t.Fatalf("the spare's slot %s is not in a locked owner directory", s.slot)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if exists(owner) {
		entries, _ := os.ReadDir(owner)
		t.Fatalf("the closed engine left %s: %v", owner, entries)
	}
}

// Without bubblewrap (the sandbox's namespaces layer missing: an
// unprivileged container) nothing is bound at /compile: the compiler reads
// and writes the host paths, under the layers there are (prlimit, the
// memory cgroup); with a spare compiler and without.
func TestCompileWithoutNamespaces(t *testing.T) {
	sb := sandboxtest.New(t, sandbox.Config{Mode: sandbox.Standard, Bwrap: "/nonexistent/bwrap", Log: slog.New(slog.DiscardHandler)})
	if sb.HasNamespaces() {
		t.Fatal("the sandbox has namespaces without bwrap")
	}
	for _, spares := range []int{0, 1} {
		e := New(Config{CacheDir: t.TempDir(), Sandbox: sb, SpareCompilers: spares})
		t.Cleanup(func() { _ = e.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		check := func(name string, code []byte) error {
			return e.Check(ctx, engines.Spec{WorkerID: name, MIMEType: MIMESource}, code)
		}
		if err := check("echo", unique(fixture(t, "echo"), "no namespaces")); err != nil {
			t.Fatalf("spares %d: echo: %v", spares, err)
		}
		if spares > 0 {
			waitSpareCompiler(t, e)
		}
		err := check("invalid", unique(fixture(t, "invalid"), "no namespaces"))
		if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "Worker.cs:9:4: error CS1525") || strings.Contains(err.Error(), "/compile/") {
			t.Fatalf("spares %d: invalid: err = %v, want ErrInvalidCode with Worker.cs:9:4: error CS1525", spares, err)
		}
	}
}

// waitKept waits until e keeps s for worker, staged again and ready.
func waitKept(t *testing.T, e *Engine, worker string, s *spareCompiler) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		if e.kept.ready()[worker] == s && s.output.isReady() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("compiler %s not kept ready for %s (kept: %v)", s.slot, worker, e.kept.ready())
		}
	}
}

// A compiler that compiled a worker's source is kept for that worker's
// next compile, and only that worker's: the next source compiles on it
// into the code the worker then serves; another worker's compile never
// takes it; a compile that failed there gets a fresh compiler's errors
// and ends it; at most KeptCompilers are kept (the least recently used
// retired first), each for KeptCompilerIdle, at most keptCompiles
// compiles and while its address space grew less than keptGrowth.
func TestKeptCompilerCompilesItsWorkersNextSource(t *testing.T) {
	for _, mode := range []string{"strict", "no sandbox"} {
		t.Run(mode, func(t *testing.T) {
			e, ctx := warmedEngine(t, Config{CacheDir: t.TempDir(), SpareCompilers: 1, KeptCompilers: 2}, mode)
			check := func(name string, code []byte) error {
				return e.Check(ctx, engines.Spec{WorkerID: name, MIMEType: MIMESource}, code)
			}
			echo := func(answer string) []byte {
				return bytes.Replace(fixture(t, "echo"), []byte(`"conformance.echo"`), []byte(strconv.Quote(answer)), 1)
			}
			serves := func(name string, code []byte, want string) {
				t.Helper()
				inst, err := e.Load(ctx, engines.Spec{WorkerID: name, MIMEType: MIMESource}, code)
				if err != nil {
					t.Fatal(err)
				}
				out, err := inst.Process(ctx, enginetest.NewEvent("k1", "t", map[string]any{"x": 1}, ""))
				_ = inst.Close(ctx)
				if err != nil || len(out) != 1 || out[0].Type() != want {
					t.Fatalf("%s: outputs %v, err %v, want one of type %s", name, out, err, want)
				}
			}
			// The first compile finds none ready and starts one.
			if err := check("first", unique(fixture(t, "echo"), "first")); err != nil {
				t.Fatal(err)
			}

			s := waitSpareCompiler(t, e)
			v1, v2 := unique(echo("v1.out"), "w v1"), unique(echo("v2.out"), "w v2")
			if err := check("w", v1); err != nil {
				t.Fatal(err)
			}
			waitKept(t, e, "w", s)
			serves("w", v1, "v1.out")
			if err := check("w", v2); err != nil {
				t.Fatal(err)
			}
			waitKept(t, e, "w", s) // the same process, kept again
			if s.compiles != 2 {
				t.Fatalf("the kept compiler ran %d compiles, want 2", s.compiles)
			}
			// It staged the next compile on the references it had loaded
			// and imported (host/Compiler.cs, Staged.PrepareAgain), and v2
			// compiled there into the code served below.
			if !s.output.isRestaged() {
				t.Fatalf("the kept compiler staged again from the start (said before ready: %q)", s.output.before())
			}
			serves("w", v2, "v2.out")

			// Another worker's compile takes a spare, never w's compiler.
			s2 := waitSpareCompiler(t, e, s)
			if err := check("x", unique(echo("x.out"), "x")); err != nil {
				t.Fatal(err)
			}
			waitKept(t, e, "x", s2)
			if got := e.kept.ready()["w"]; got != s || s.compiles != 2 {
				t.Fatalf("w's compiler after x's compile: kept %v, %d compiles; want %s, 2", got, s.compiles, s.slot)
			}

			// A compile that fails on the kept compiler says what a fresh
			// one says, and the compiler is not kept.
			err := check("x", unique(fixture(t, "invalid"), "x invalid"))
			if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "Worker.cs:9:4: error CS1525") ||
				strings.Contains(err.Error(), "/compile/") || strings.Contains(err.Error(), "Warm") {
				t.Fatalf("invalid on a kept compiler: err = %v, want ErrInvalidCode with Worker.cs:9:4: error CS1525 and nothing else", err)
			}
			takenBy(t, s2)
			if _, ok := e.kept.ready()["x"]; ok {
				t.Fatal("a compiler whose compile failed is still kept")
			}

			// Two kept at most: a third worker's retires the least
			// recently used.
			s3 := waitSpareCompiler(t, e, s, s2)
			if err := check("y", unique(echo("y.out"), "y")); err != nil {
				t.Fatal(err)
			}
			waitKept(t, e, "y", s3)
			s4 := waitSpareCompiler(t, e, s, s2, s3)
			if err := check("z", unique(echo("z.out"), "z")); err != nil {
				t.Fatal(err)
			}
			waitKept(t, e, "z", s4)
			takenBy(t, s) // w's, used before y's
			if got := e.kept.ready()["y"]; got != s3 {
				t.Fatalf("y's compiler %v retired, want w's retired", got)
			}
			if grown := addressSpace(s3.cmd.Process.Pid); grown > s3.readyVM+keptGrowth || s3.readyVM == 0 {
				t.Fatalf("y's kept compiler holds %d MiB of address space, %d when it was ready: more than keptGrowth", grown>>20, s3.readyVM>>20)
			}
			// One that grew past keptGrowth is let go, not used: the
			// compile takes a spare.
			s3.readyVM = 1
			if err := check("y", unique(echo("y.out"), "y grown")); err != nil {
				t.Fatal(err)
			}
			takenBy(t, s3)
			if s3.compiles != 1 {
				t.Fatalf("the grown compiler ran %d compiles, want 1", s3.compiles)
			}

			// keptCompiles compiles at most, then it is let go.
			for i := 2; i <= keptCompiles; i++ {
				if err := check("z", unique(echo("z.out"), fmt.Sprint("z ", i))); err != nil {
					t.Fatal(err)
				}
				if i < keptCompiles {
					waitKept(t, e, "z", s4)
				}
			}
			takenBy(t, s4)
			if s4.compiles != keptCompiles {
				t.Fatalf("z's compiler ran %d compiles, want %d", s4.compiles, keptCompiles)
			}

			// One not used for KeptCompilerIdle is retired.
			e.kept.mu.Lock()
			e.kept.idle = 100 * time.Millisecond
			e.kept.mu.Unlock()
			s5 := waitSpareCompiler(t, e, s, s2, s3, s4)
			if err := check("i", unique(echo("i.out"), "i")); err != nil {
				t.Fatal(err)
			}
			takenBy(t, s5)
			if _, ok := e.kept.ready()["i"]; ok {
				t.Fatal("an idle kept compiler is still kept")
			}
		})
	}
}

// waitKeptFor waits until e keeps exactly want for owner, each staged
// again and ready.
func waitKeptFor(t *testing.T, e *Engine, owner string, want ...*spareCompiler) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		got := e.kept.keptFor(owner)
		ok := len(got) == len(want)
		for _, w := range want {
			ok = ok && slices.Contains(got, w) && w.output.isReady()
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kept for %q: %v, want %v ready", owner, got, want)
		}
	}
}

// A kept compiler staged again on its last compile's references
// (host/Compiler.cs, Staged.PrepareAgain) compiles as a fresh compiler
// does: the worker's next source, one using LINQ, lambdas, an async
// method and interpolation, answers as it should, and a source with a
// type error gets the errors a fresh compiler gives it.
func TestKeptCompilerRestagedCompilesAsFresh(t *testing.T) {
	e, ctx := warmedEngine(t, Config{CacheDir: t.TempDir(), SpareCompilers: 1, KeptCompilers: 1}, "strict")
	spec := engines.Spec{WorkerID: "w", MIMEType: MIMESource}
	// The first compile finds none ready and starts one.
	if err := e.Check(ctx, engines.Spec{WorkerID: "first", MIMEType: MIMESource}, unique(fixture(t, "echo"), "first")); err != nil {
		t.Fatal(err)
	}
	s := waitSpareCompiler(t, e)
	if err := e.Check(ctx, spec, unique(fixture(t, "echo"), "w v1")); err != nil {
		t.Fatal(err)
	}
	waitKept(t, e, "w", s)
	if !s.output.isRestaged() {
		t.Fatalf("the kept compiler staged again from the start (said before ready: %q)", s.output.before())
	}
	rich := unique(fixture(t, "rich"), "w v2")
	if err := e.Check(ctx, spec, rich); err != nil {
		t.Fatal(err)
	}
	if s.compiles != 2 {
		t.Fatalf("the kept compiler ran %d compiles, want 2", s.compiles)
	}
	servesRich(t, ctx, e, spec, rich, "rich on the restaged compiler")

	waitKept(t, e, "w", s)
	bad := unique(bytes.Replace(fixture(t, "echo"), []byte("return"), []byte("NoSuchType x = null; return"), 1), "bad")
	errKept := e.Check(ctx, spec, bad)
	takenBy(t, s) // compiled there, failed, and let go
	if _, ok := e.kept.ready()["w"]; ok {
		t.Fatal("a compiler whose compile failed is still kept")
	}
	s2 := waitSpareCompiler(t, e, s)
	errFresh := e.Check(ctx, engines.Spec{WorkerID: "fresh", MIMEType: MIMESource}, bad)
	takenBy(t, s2)
	if !errors.Is(errKept, engines.ErrInvalidCode) || !strings.Contains(errKept.Error(), "error CS0246") || errFresh == nil || errKept.Error() != errFresh.Error() {
		t.Fatalf("a type error on the restaged compiler: %v; on a fresh one: %v; want the same ErrInvalidCode with error CS0246", errKept, errFresh)
	}
}

// Compilers are kept for a worker's tenant: another worker of the same
// tenant compiles on the one its tenant's last compile left (its own
// source, into the code it then serves), another tenant's compile never
// takes it, calls at once keep two for one tenant (no more), and the
// engine keeps KeptCompilers in all, the least recently used retired
// first.
func TestKeptCompilersServeTheirTenantOnly(t *testing.T) {
	e, ctx := warmedEngine(t, Config{CacheDir: t.TempDir(), SpareCompilers: 1, KeptCompilers: 3}, "strict")
	spec := func(tenant, worker string) engines.Spec {
		return engines.Spec{WorkerID: worker, Tenant: tenant, MIMEType: MIMESource}
	}
	echo := func(answer, tag string) []byte {
		return unique(bytes.Replace(fixture(t, "echo"), []byte(`"conformance.echo"`), []byte(strconv.Quote(answer)), 1), tag)
	}
	check := func(tenant, worker string, code []byte) {
		t.Helper()
		if err := e.Check(ctx, spec(tenant, worker), code); err != nil {
			t.Fatalf("%s/%s: %v", tenant, worker, err)
		}
	}
	t1, t2 := keptOwner("t1", "a"), keptOwner("t2", "c")
	if t1 == "a" || t1 != keptOwner("t1", "b") || t1 == t2 || keptOwner("", "a") != "a" {
		t.Fatalf("kept owners: t1/a %q, t1/b %q, t2/c %q, none/a %q", t1, keptOwner("t1", "b"), t2, keptOwner("", "a"))
	}

	// The first compile finds none ready and starts one.
	check("", "first", echo("first.out", "first"))
	s1 := waitSpareCompiler(t, e)
	check("t1", "a", echo("a.out", "a"))
	waitKeptFor(t, e, t1, s1)

	// b, of t1 too, compiles on a's compiler and serves its own code.
	s2 := waitSpareCompiler(t, e, s1)
	b := echo("b.out", "b")
	check("t1", "b", b)
	waitKeptFor(t, e, t1, s1)
	if s1.compiles != 2 || !s2.output.isReady() || s2.Exited() {
		t.Fatalf("b's compile: t1's compiler ran %d compiles (want 2), the spare ready %v", s1.compiles, s2.output.isReady())
	}
	inst, err := e.Load(ctx, spec("t1", "b"), b)
	if err != nil {
		t.Fatal(err)
	}
	out, err := inst.Process(ctx, enginetest.NewEvent("k1", "t", map[string]any{"x": 1}, ""))
	_ = inst.Close(ctx)
	if err != nil || len(out) != 1 || out[0].Type() != "b.out" {
		t.Fatalf("b serves %v (err %v), want one output of type b.out", out, err)
	}

	// c, of t2, takes the spare, never t1's compiler.
	check("t2", "c", echo("c.out", "c"))
	waitKeptFor(t, e, t2, s2)
	waitKeptFor(t, e, t1, s1)
	if s1.compiles != 2 {
		t.Fatalf("t1's compiler ran %d compiles after t2's, want 2", s1.compiles)
	}

	// Two compiles of t1 at once: one takes t1's compiler, the other the
	// spare; both are kept for t1.
	s3 := waitSpareCompiler(t, e, s1, s2)
	var wg sync.WaitGroup
	for _, w := range []string{"d", "e"} {
		wg.Go(func() { check("t1", w, echo(w+".out", w)) })
	}
	wg.Wait()
	waitKeptFor(t, e, t1, s1, s3)
	waitKeptFor(t, e, t2, s2)

	// Three kept in all: a fourth owner's retires the least recently
	// used (t2's).
	s4 := waitSpareCompiler(t, e, s1, s2, s3)
	check("t3", "f", echo("f.out", "f"))
	waitKeptFor(t, e, keptOwner("t3", "f"), s4)
	takenBy(t, s2)
	waitKeptFor(t, e, t2)
	waitKeptFor(t, e, t1, s1, s3)
}
