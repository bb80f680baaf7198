//go:build linux

package native

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/sandbox"
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

// TestIsolatedTimeoutWithASetsidChild is issue 42's item 8: a library
// forks a child that leaves the host's process group and session
// (setsid), so the group kill at the timeout misses it, and it keeps the
// reply pipe and the output pipe open for 20 s. The call must still end at
// its 300 ms timeout (the node closes its ends of the pipes at the kill
// instead of waiting for EOF), while the child is still alive; Close is
// prompt, and the node keeps no descriptor of that host afterwards.
// Outside the sandbox (where it was seen) and in the strict sandbox.
func TestIsolatedTimeoutWithASetsidChild(t *testing.T) {
	t.Run("no-sandbox", func(t *testing.T) { testSetsidChild(t, nil) })
	t.Run("strict", func(t *testing.T) { testSetsidChild(t, sandboxtest.Strict(t)) })
}

func testSetsidChild(t *testing.T, sb *sandbox.Sandbox) {
	fixtureLib(t, flagsEcho...) // compiled before the descriptors are counted
	pkg := packageOf(t, flagsEcho, nil)
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	fdsBefore := openPipes(t)
	e := newTestEngine(t, hostConfig(Config{Isolation: IsolationProcess, Sandbox: sb}))
	spec := testSpec
	spec.Timeout = 300 * time.Millisecond
	inst, err := e.Load(context.Background(), spec, pkg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = call(t, inst, typed("test.setsidhang", pidFile))
	took := time.Since(start)
	child := 0
	if b, rerr := os.ReadFile(pidFile); rerr == nil {
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if child > 0 {
		t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	}
	if !errors.Is(err, engines.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if sb == nil {
		// Outside a PID namespace the child survives the kill: the call
		// returned while it still held the pipes.
		if child <= 0 {
			t.Fatalf("the library wrote no child pid to %s", pidFile)
		}
		if !alive(child) {
			t.Fatalf("the setsid child %d is gone already: the test proves nothing", child)
		}
	}
	if took > 10*time.Second { // the fixture hangs 20 s
		t.Fatalf("the call took %v against a 300ms timeout (it waited for the setsid child)", took)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start = time.Now()
	if err := inst.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second { // the fixture hangs 20 s
		t.Fatalf("Close took %v", took)
	}
	// Nothing of the killed host stays open in the node while the child
	// lives (its pipes, its output reader).
	for deadline := time.Now().Add(5 * time.Second); openPipes(t) > fdsBefore; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pipes open after Close, %d before the load: %v", openPipes(t), fdsBefore, fdList(t))
		}
	}
	if sb == nil {
		if !alive(child) {
			t.Fatalf("the setsid child %d ended before the descriptors were checked", child)
		}
	}
}

// openPipes is the number of pipe descriptors open in this process.
func openPipes(t *testing.T) int {
	t.Helper()
	n := 0
	for _, fd := range fdList(t) {
		if strings.Contains(fd, "->pipe:") {
			n++
		}
	}
	return n
}

// fdList names this process' open descriptors (for a failure message).
func fdList(t *testing.T) []string {
	t.Helper()
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		target, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		out = append(out, e.Name()+"->"+target)
	}
	return out
}

// alive reports whether pid runs (exists and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// Issue 42 item 1: a socket and a file the node holds without
// close-on-exec (as an in-process native library leaves them) reach
// neither the load check's sandboxed host nor an isolated worker's: a
// constructor that writes to every socket it has writes nothing the node's
// listener sees, and no host process holds them while it serves.
func TestNodeDescriptorsDoNotReachNativeHosts(t *testing.T) {
	sb := sandboxtest.Strict(t)
	leak := sandboxtest.NodeDescriptors(t)
	e := newTestEngine(t, hostConfig(Config{Sandbox: sb}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pkg := packageOf(t, append([]string{"-DCTOR_SOCKETS"}, flagsEcho...), map[string]any{"isolation": "process"})
	if err := e.Check(ctx, testSpec, pkg); err != nil {
		t.Fatalf("load check: %v", err)
	}
	inst, err := e.Load(ctx, testSpec, pkg)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	if out := mustCall(t, inst, typed("conformance.echo", map[string]any{"x": 1})); len(out) != 1 {
		t.Fatalf("outputs %v", out)
	}
	leak.Check(t)
}
