package dotnet

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/spares"
	"github.com/virtufin/workmanager/engines/lull"
)

// Spare compilers (Config.SpareCompilers, DOTNET_SPARE_COMPILERS;
// engines/internal/spares): a C# compile is mostly Mono starting mcs and
// compiling mcs's own code (about 0.15 s of 0.16 s for an ordinary worker
// here), so compilers are started ahead of need, for no worker yet, and
// warmed: host/Compiler.cs (wmcsc.exe) loads mcs.exe and compiles a
// source of the node's (warmSource) once, then stages the compile it will
// be asked for (the references loaded and imported, about 25 of a warm
// compile's 30 ms, before there is a source) and waits, importing
// meanwhile the members of the common namespaces' types (its preload,
// stopped when the compile comes: what a compile otherwise imports from
// the assemblies' metadata each time). A
// compile takes one:
// the worker's source is written into the spare's slot
// (<cache>/compilers/owner-*/slot-*/src, bound read-only at compileSrcDir), the
// compiler's arguments are sent on its stdin, and it compiles exactly as
// mcs does (mcs's own in-process entry point resets its static state after
// the warm-up) into the slot's out directory, then exits — or, when its
// compile succeeded and the engine keeps it for that worker's next compile
// (keptcompiler.go), stages that compile again and waits. A spare
// compiles one worker's sources only, under a user id of its own, in the
// sandbox and under the limits of any compile (CompilerLimits, its
// warm-up and its earlier compiles counted), and is never given to another
// worker; what the warm-up leaves in the process is the node's own code.
// Without a spare ready, a compile starts mcs as before.

// warmSource is the warm-up's source: a worker using what workers
// commonly use (an async method, lambdas and LINQ, collections, string
// interpolation, exceptions), so that the compiler code they need is
// loaded and compiled before a worker's compile needs it (a worker using
// them compiled in 40–60 ms on a spare warmed on a bare IWorker, against
// 30–40 with this; with the preload, host/Compiler.cs, 6–12).
const warmSource = `using System;
using System.Collections.Generic;
using System.Linq;
using System.Text;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public class Warm : WorkerBase
{
    readonly Dictionary<string, int> seen = new Dictionary<string, int>();

    public Warm() : base("warm") { }

    public override async Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        var data = input.Data as JsonObject;
        if (data != null && data["fail"] != null)
            throw new InvalidOperationException("asked to fail");
        var items = new List<double> { 1.5, 2.5, Math.Sqrt(2) };
        var total = items.Where(x => x > 1).Select(x => x * 2).Sum();
        var sb = new StringBuilder();
        foreach (var i in items)
            sb.Append(i.ToString("F2")).Append(',');
        int n;
        seen.TryGetValue(input.Id, out n);
        seen[input.Id] = n + 1;
        await Task.Yield();
        try {
            var text = $"{input.Id}:{total}:{DateTime.UtcNow:o}:{sb}";
            return Response(input, new JsonObject { ["text"] = text, ["count"] = n + 1, ["data"] = data == null ? null : data.DeepClone() });
        } catch (ArgumentException e) {
            throw new InvalidOperationException(e.Message, e);
        }
    }
}
`

// readyMarker is the line wmcsc.exe writes once it is warm; stagedMarker
// the line it writes before it when it has staged its compile, and
// restagedMarker before that when it staged it on the references its last
// compile loaded and imported (a kept compiler's, host/Compiler.cs
// Staged.PrepareAgain).
const (
	readyMarker    = "\x01wmcsc ready\n"
	stagedMarker   = "\x01wmcsc staged\n"
	restagedMarker = "\x01wmcsc restaged\n"
)

// maxBeforeReady bounds what is kept of a spare compiler's output before
// it is ready (the warm-up's own messages, shown when it fails).
const maxBeforeReady = 8 << 10

// spareCompiler is a warmed compiler waiting for one compile.
type spareCompiler struct {
	slot, src, out     string // the slot and its src and out directories (host paths)
	shownSrc, shownOut string // the same as the compiler sees them
	cmd                *exec.Cmd
	stdin              *os.File
	output             *readyWriter
	done               chan struct{} // closed once the process has exited and the sandbox let go of it
	werr               error         // cmd.Wait's, once done is closed
	retire             sync.Once
	// compiles counts the compiles it ran (a kept compiler runs several
	// of one worker's, keptcompiler.go); readyVM is its address space when
	// it was first ready.
	compiles int
	readyVM  uint64
}

// Exited implements spares.Proc.
func (s *spareCompiler) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Healthy implements spares.Proc: a spare that has not exited can compile.
func (s *spareCompiler) Healthy() bool { return true }

// Retire kills the spare (if it runs), waits for it and removes its slot.
func (s *spareCompiler) Retire() {
	s.retire.Do(func() {
		if !s.Exited() {
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		}
		<-s.done
		s.stdin.Close()
		os.RemoveAll(s.slot)
	})
}

// Release kills the spare at once and leaves the wait for its exit and
// the removal of its slot to a goroutine: the compile that took it moved
// its assembly out of the slot already, and need not wait for the sandbox
// to let go of a process that can do nothing more (8–19 ms in the strict
// sandbox, on a create's path).
func (s *spareCompiler) Release() {
	if !s.Exited() {
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
	go s.Retire()
}

// newSpareCompilers is the engine's set of spare compilers.
func (e *Engine) newSpareCompilers() *spares.Set[*spareCompiler] {
	return &spares.Set[*spareCompiler]{Want: e.cfg.SpareCompilers, Start: e.startSpareCompiler, Settle: spares.SettleAfterTake, Lull: lull.Node, OnError: func(err error) {
		e.cfg.Logger.Warn("dotnet engine: a spare compiler did not start; compiles start their own", "error", err)
	}}
}

// startSpareCompiler starts a compiler on an empty slot and waits until it
// is warm.
func (e *Engine) startSpareCompiler() (*spareCompiler, error) {
	rt := e.currentRuntime()
	if rt == nil || rt.mcsExe == "" {
		return nil, fmt.Errorf("dotnet engine: spare compiler: no compiler assembly (mcs.exe) found")
	}
	slot, err := e.newSlot("compilers")
	if err != nil {
		return nil, fmt.Errorf("dotnet engine: spare compiler: %w", err)
	}
	s := &spareCompiler{slot: slot, src: filepath.Join(slot, "src"), out: filepath.Join(slot, "out"), done: make(chan struct{})}
	fail := func(err error) (*spareCompiler, error) {
		os.RemoveAll(slot)
		return nil, fmt.Errorf("dotnet engine: spare compiler: %w", err)
	}
	for _, d := range []string{s.src, s.out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fail(err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.src, "Warm.cs"), []byte(warmSource), 0o644); err != nil {
		return fail(err)
	}
	// A user id of its own (an owner of its own: the out directory is
	// given to it), the limits of any compile.
	c := e.compilerFor(engines.Spec{})
	c.owner = fmt.Sprintf("\x00mcs-spare-%d", e.spareCompilerSeq.Add(1))
	s.shownSrc, s.shownOut = s.src, s.out
	if c.bound() {
		s.shownSrc, s.shownOut = compileSrcDir, compileOutDir
	}
	// After "--", the compile it will be asked for (compile sends the
	// same arguments): staged, its references imported while it waits.
	args := append([]string{filepath.Join(rt.dir, compilerExe), rt.mcsExe, filepath.Join(s.shownOut, "Warm.dll")},
		rt.compileArgs(s.shownSrc, s.shownOut, "Warm.cs")...)
	args = append(append(args, "--"), rt.compileArgs(s.shownSrc, s.shownOut, sourceFile)...)
	cmd, release, err := c.command(rt, rt.mono, args, s.src, s.out)
	if err != nil {
		return fail(err)
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		release()
		return fail(err)
	}
	s.cmd, s.stdin = cmd, stdinW
	s.output = &readyWriter{ready: make(chan struct{})}
	cmd.Stdin = stdinR
	cmd.Stdout, cmd.Stderr = s.output, s.output
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.WaitDelay = time.Second
	err = cmd.Start()
	stdinR.Close()
	if err != nil {
		stdinW.Close()
		release()
		return fail(err)
	}
	go func() {
		s.werr = cmd.Wait()
		release()
		close(s.done)
	}()
	timer := time.NewTimer(e.cfg.LoadTimeout)
	defer timer.Stop()
	select {
	case <-s.output.ready:
		s.readyVM = addressSpace(cmd.Process.Pid)
		if !s.output.staged && e.unstagedWarned.CompareAndSwap(false, true) {
			e.cfg.Logger.Warn("dotnet engine: a spare compiler could not stage its compile: each compile on a spare imports its references itself (about 25 ms more)")
		}
		return s, nil
	case <-s.done:
	case <-timer.C:
	}
	s.Retire()
	return nil, fmt.Errorf("dotnet engine: spare compiler: not warm (%v): %s", s.werr, s.output.before())
}

// compile compiles code with the spare (which it then belongs to: Release
// once its assembly has been moved away) and returns the assembly's path.
func (s *spareCompiler) compile(ctx context.Context, rt *runtime, c compiler, code []byte) (string, error) {
	built := filepath.Join(s.out, "Worker.dll")
	args := rt.compileArgs(s.shownSrc, s.shownOut, sourceFile)
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, "\r\n") {
			return "", fmt.Errorf("dotnet engine: compiling the C# source: an argument the spare compiler cannot be sent: %q", a)
		}
	}
	if err := os.WriteFile(filepath.Join(s.src, sourceFile), code, 0o644); err != nil {
		return "", fmt.Errorf("dotnet engine: %w", err)
	}
	var nonce [16]byte
	rand.Read(nonce[:])
	finished := s.output.expect("\x01wmcsc done " + hex.EncodeToString(nonce[:]) + "\n")
	if _, err := s.stdin.WriteString(hex.EncodeToString(nonce[:]) + "\n" + strings.Join(args, "\n") + "\n\n"); err != nil {
		// It died while it waited: the exit status says how.
		<-s.done
		return "", fmt.Errorf("dotnet engine: compiling the C# source: the spare compiler is gone (%v): %s", s.werr, s.output.before())
	}
	// Its input stays open: a kept compiler (keptcompiler.go) is told
	// "again" on it, any other is killed (Release).
	pid := s.cmd.Process.Pid
	stop := context.AfterFunc(ctx, func() { syscall.Kill(-pid, syscall.SIGKILL) })
	defer stop()
	select {
	case <-finished:
		// Compiled, the assembly written and closed: Mono's shutdown is
		// not waited for (Release kills it, Retire reaps it).
		if ctx.Err() == nil {
			return built, nil
		}
		<-s.done
	case <-s.done:
	}
	return built, rt.judge(ctx, c, s.cmd.ProcessState, s.werr, &s.output.after, s.shownSrc, built)
}

// readyWriter takes a spare compiler's stdout and stderr (one writer:
// exec.Cmd then writes from one goroutine): what comes before the ready
// marker is kept apart (bounded), what comes after is the compile's
// output, bounded as a compile's is, watched for the done line (expect).
type readyWriter struct {
	ready chan struct{} // closed when the marker has been seen
	mu    sync.Mutex
	seen  bool
	// staged is whether the spare said it staged its compile, set when
	// the ready marker comes.
	staged bool
	// restaged is whether it staged it on its last compile's references
	// (a kept compiler staging again), set with staged.
	restaged bool
	pre      []byte
	after    boundedBuffer
	// done is the line that says the compile succeeded, finished the
	// channel closed when it came; tail is the end of the output so far
	// (a line may come in pieces).
	done     []byte
	finished chan struct{}
	tail     []byte
}

// rearm makes the writer wait for the ready marker again (a kept
// compiler staging its next compile, keptcompiler.go) and returns the
// channel it closes when the marker comes.
func (w *readyWriter) rearm() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ready = make(chan struct{})
	w.seen, w.staged, w.restaged = false, false, false
	w.pre, w.tail = nil, nil
	w.after = boundedBuffer{}
	w.done, w.finished = nil, nil
	return w.ready
}

// isReady reports whether the ready marker has come (since the last
// rearm).
func (w *readyWriter) isReady() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// isRestaged reports whether the compiler staged its compile on its last
// compile's references (set with the ready marker, cleared by rearm).
func (w *readyWriter) isRestaged() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.restaged
}

// expect makes the writer close the channel it returns once line has
// been written after the ready marker.
func (w *readyWriter) expect(line string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done, w.finished = []byte(line), make(chan struct{})
	return w.finished
}

func (w *readyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen {
		if w.done != nil && w.finished != nil {
			w.tail = append(w.tail, p...)
			if bytes.Contains(w.tail, w.done) {
				close(w.finished)
				w.done = nil
			} else if n := len(w.done); len(w.tail) > n {
				w.tail = append(w.tail[:0], w.tail[len(w.tail)-n:]...)
			}
		}
		return w.after.Write(p)
	}
	if len(w.pre)+len(p) > maxBeforeReady {
		// No marker in what it may say first: never ready.
		w.pre = append(w.pre, p[:max(0, maxBeforeReady-len(w.pre))]...)
		return len(p), nil
	}
	w.pre = append(w.pre, p...)
	if i := bytes.Index(w.pre, []byte(readyMarker)); i >= 0 {
		rest := w.pre[i+len(readyMarker):]
		w.pre = w.pre[:i]
		w.staged = bytes.Contains(w.pre, []byte(stagedMarker))
		w.restaged = w.staged && bytes.Contains(w.pre, []byte(restagedMarker))
		w.seen = true
		close(w.ready)
		w.after.max = compilerOutputBytes
		w.after.Write(rest)
	}
	return len(p), nil
}

// before is what the spare said before it was ready (or instead).
func (w *readyWriter) before() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := strings.TrimSpace(string(w.pre))
	if s == "" {
		return "no output"
	}
	return s
}
