package python_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// forkProbe reports what its runner is, seen from inside.
const forkProbe = `
import os, sys

def server_names():
    names = set()
    try:
        f = sys._getframe()
        while f is not None:
            names.update(f.f_globals)
            f = f.f_back
    except Exception as e:
        return "refused: %s" % e
    return sorted(n for n in names if n in ("_mount", "_syscall", "_unshare", "supervise", "setup_root"))

def process(event):
    st = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        st[k] = v.strip()
    return {"type": "r", "data": {"pid": os.getpid(), "ppid": os.getppid(), "uid": os.getuid(), "gid": os.getgid(),
        "groups": os.getgroups(), "host": os.uname().nodename, "capeff": st["CapEff"], "capprm": st["CapPrm"],
        "capbnd": st["CapBnd"], "seccomp": st["Seccomp"], "nnp": st["NoNewPrivs"],
        "mounts": open("/proc/self/mountinfo").read(), "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
        "cwd": os.getcwd(), "sid": os.getsid(0), "pwd": os.environ.get("PWD"), "server": server_names(), "modules": sorted(m for m in ("json", "fcntl", "resource", "_socket", "signal") if m in sys.modules)}}
`

// forkSandbox is a strict sandbox whose processes the fork server can
// start (it skips, or fails under sandboxtest.RequireEnv, where it cannot):
// sandboxtest.Strict's, or one with cfg when given.
func forkSandbox(t *testing.T, cfg ...sandbox.Config) *sandbox.Sandbox {
	t.Helper()
	var sb *sandbox.Sandbox
	if len(cfg) > 0 {
		sb = sandboxtest.New(t, cfg[0])
	} else {
		sb = sandboxtest.Strict(t)
	}
	if !sb.Forkable() {
		if os.Getenv(sandboxtest.RequireEnv) != "" {
			t.Fatal("a strict sandbox here is not Forkable")
		}
		t.Skip("the fork server needs root and the namespaces layer")
	}
	return sb
}

// bothWays runs test as a subtest per way a sandboxed runner starts:
// forked from the fork server ("fork server", noFork false) and through
// the sandbox's programs ("chain").
func bothWays(t *testing.T, test func(t *testing.T, noFork bool)) {
	t.Helper()
	for _, noFork := range []bool{false, true} {
		t.Run(map[bool]string{false: "fork server", true: "chain"}[noFork], func(t *testing.T) { test(t, noFork) })
	}
}

// probe calls a forkProbe instance.
func probe(t *testing.T, inst engines.Instance) map[string]any {
	t.Helper()
	return enginetest.DataOf(t, mustCall(t, inst, jsonEvent("t", map[string]any{})))
}

// procStatus is /proc/<pid>/status as a map ("" values when pid is gone).
func procStatus(pid int) map[string]string {
	m := map[string]string{}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		m[k] = strings.TrimSpace(v)
	}
	return m
}

// childOf is pid's only child (0: none or several).
func childOf(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	f := strings.Fields(string(b))
	if len(f) != 1 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

func ppidOf(pid int) int {
	n, _ := strconv.Atoi(procStatus(pid)["PPid"])
	return n
}

// living reports whether pid runs: it exists and is not a zombie (a
// forked runner's supervisor is reaped by its reaper, init here, a moment
// after it exited).
func living(pid int) bool {
	return syscall.Kill(pid, 0) == nil && !strings.HasPrefix(procStatus(pid)["State"], "Z")
}

// gone reports whether pid has exited within 10 s.
func gone(pid int) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return true
		}
		if s := procStatus(pid)["State"]; strings.HasPrefix(s, "Z") {
			return true // exited; its parent reaps it
		}
	}
	return false
}

// Issue 48: a runner forked from the fork server stands where the
// sandbox's chain puts one: the second process of its own PID namespace
// (whose first, its supervisor, reaps and reports, as bwrap's does), under
// the worker's user id with no groups, capabilities or way to gain any,
// the seccomp filter, its own host name, root and descriptors 0-4; seen
// from the node, under its supervisor, under the server, under the node.
func TestForkedRunnerIsSandboxed(t *testing.T) {
	sb := forkSandbox(t)
	secret := t.TempDir()
	e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"os", "sys"}})
	inst := load(t, e, testSpec, forkProbe)
	t.Cleanup(func() { _ = inst.Close(context.Background()) })
	server := python.ForkServerPid(e)
	if server == 0 {
		t.Fatal("no fork server runs: the runner started through the chain")
	}
	pids := python.RunnerPIDs(inst)
	if len(pids) != 1 {
		t.Fatalf("runner pids %v; want one", pids)
	}
	supervisor := pids[0]
	runner := childOf(supervisor)
	uid, ok := sb.UID(testSpec.WorkerID)
	if !ok {
		t.Fatal("no user id for the worker")
	}
	st := procStatus(runner)
	if f := strings.Fields(st["Uid"]); len(f) < 4 || f[0] != strconv.Itoa(uid) || f[1] != f[0] || f[2] != f[0] || f[3] != f[0] {
		t.Errorf("runner %d Uid %q; want %d four times", runner, st["Uid"], uid)
	}
	if f := strings.Fields(st["NSpid"]); len(f) != 2 || f[1] != "2" {
		t.Errorf("runner NSpid %q; want its host pid and 2 (its supervisor is its PID namespace's first)", st["NSpid"])
	}
	sst := procStatus(supervisor)
	if f := strings.Fields(sst["NSpid"]); len(f) != 2 || f[1] != "1" || sst["Name"] != "wm-supervisor" {
		t.Errorf("supervisor %d: Name %q NSpid %q; want wm-supervisor, the first of the runner's PID namespace", supervisor, sst["Name"], sst["NSpid"])
	}
	// The node's tree: node, fork server, supervisor, runner (the server
	// is the supervisors' subreaper; the launcher that forked one exited).
	if p, pp := ppidOf(supervisor), ppidOf(server); p != server || pp != os.Getpid() {
		t.Errorf("supervisor %d's parent %d, the fork server %d's parent %d; want the server, and this process %d", supervisor, p, server, pp, os.Getpid())
	}

	in := probe(t, inst)
	want := map[string]any{"pid": 2.0, "ppid": 1.0, "uid": float64(uid), "gid": float64(uid), "host": "worker",
		"capeff": "0000000000000000", "capprm": "0000000000000000", "capbnd": "0000000000000000", "seccomp": "2", "nnp": "1",
		"cwd": "/scratch", "pwd": "/scratch", "sid": 1.0} // its supervisor's session, as bwrap's first process's
	for k, v := range want {
		if in[k] != v {
			t.Errorf("inside the runner %s = %v; want %v", k, in[k], v)
		}
	}
	// Nothing of the server's is within the worker's reach: not its
	// functions (through the frames below the runner's), not the modules
	// it imported for itself.
	if v, ok := in["server"].([]any); !ok || len(v) != 0 {
		if str, _ := in["server"].(string); !strings.HasPrefix(str, "refused") {
			t.Errorf("the fork server's names reachable from the worker: %v", in["server"])
		}
	}
	if m, _ := in["modules"].([]any); len(m) != 0 {
		t.Errorf("modules only the fork server imports are in the worker's sys.modules: %v", m)
	}
	if g, _ := in["groups"].([]any); len(g) != 0 {
		t.Errorf("supplementary groups %v; want none", g)
	}
	for _, fd := range in["fds"].([]any) {
		if fd.(float64) > 5 { // 0-4, and the one listdir opened
			t.Errorf("descriptors %v; want 0-4 only", in["fds"])
			break
		}
	}
	mounts := in["mounts"].(string)
	if strings.Contains(mounts, secret) || strings.Contains(mounts, filepath.Dir(secret)+" ") {
		t.Errorf("the node's temporary directory is mounted in the runner:\n%s", mounts)
	}
	for _, m := range []string{" /usr ro,", " /tmp rw,", " /scratch rw,", " /proc rw,"} {
		if !strings.Contains(mounts, m) {
			t.Errorf("no mount %q in the runner:\n%s", m, mounts)
		}
	}
}

// Issue 48: each worker's runner is a process of its own, forked for it
// and never given to another worker or reused after its worker let it go:
// two workers get two runners under two user ids; a worker closed and
// loaded again, or whose runner was killed, gets a new one.
func TestForkedRunnersAreNeverShared(t *testing.T) {
	sb := forkSandbox(t)
	e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"os", "sys"}, Spares: 1})
	specA, specB := testSpec, testSpec
	specA.WorkerID, specB.WorkerID = "fork-a", "fork-b"
	a, b := load(t, e, specA, forkProbe), load(t, e, specB, forkProbe)
	pa, pb := python.RunnerPIDs(a), python.RunnerPIDs(b)
	if len(pa) != 1 || len(pb) != 1 || pa[0] == pb[0] {
		t.Fatalf("runners of two workers: %v and %v; want one each, not the same", pa, pb)
	}
	server := python.ForkServerPid(e)
	if server == 0 || pa[0] == server || pb[0] == server {
		t.Fatalf("fork server %d, runners %v %v", server, pa, pb)
	}
	ua, ub := probe(t, a)["uid"], probe(t, b)["uid"]
	if ua == ub {
		t.Errorf("both workers' runners run as uid %v", ua)
	}
	// Closed and loaded again: a new process; the old one is gone.
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !gone(pa[0]) {
		t.Errorf("runner %d still runs after its worker closed", pa[0])
	}
	a2 := load(t, e, specA, forkProbe)
	t.Cleanup(func() { _ = a2.Close(context.Background()); _ = b.Close(context.Background()) })
	if p := python.RunnerPIDs(a2); len(p) != 1 || p[0] == pa[0] || p[0] == pb[0] {
		t.Errorf("worker loaded again runs in %v; want a new process (before: %v, the other worker's %v)", p, pa, pb)
	}
	// Killed: the next event runs in a new process, answered.
	if err := syscall.Kill(pb[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !gone(pb[0]) {
		t.Fatalf("runner %d survived SIGKILL", pb[0])
	}
	var got map[string]any
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		out, err := call(t, b, jsonEvent("t", map[string]any{}))
		if err == nil {
			got = enginetest.DataOf(t, out)
			break
		}
	}
	if got == nil || got["pid"] != 2.0 || got["uid"] == ua {
		t.Fatalf("after its runner was killed worker b answered %v; want a forked runner, not under worker a's uid %v", got, ua)
	}
	if p := python.RunnerPIDs(b); len(p) != 1 || p[0] == pb[0] {
		t.Errorf("worker b's runner after the kill: %v; want a new one (killed: %d)", p, pb[0])
	}
}

// Issue 48: the fork server's crash takes no running worker with it: a
// worker loaded before answers after the server was SIGKILLed, in the
// same runner; the next load starts a new server; closing the workers
// ends their runners.
func TestForkServerCrashLeavesRunnersRunning(t *testing.T) {
	sb := forkSandbox(t)
	python.ForkServerRetry(t, 0)
	e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"os", "sys"}})
	specA, specB := testSpec, testSpec
	specA.WorkerID, specB.WorkerID = "crash-a", "crash-b"
	a := load(t, e, specA, forkProbe)
	before := python.RunnerPIDs(a)
	server := python.ForkServerPid(e)
	if server == 0 || len(before) != 1 {
		t.Fatalf("fork server %d, runners %v", server, before)
	}
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); python.ForkServerPid(e) == server; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the fork server did not exit")
		}
	}
	if got := probe(t, a); got["pid"] != 2.0 {
		t.Fatalf("worker a after the server's crash: %v", got)
	}
	if after := python.RunnerPIDs(a); len(after) != 1 || after[0] != before[0] {
		t.Errorf("worker a's runner %v after the crash; want the same %v, still running", after, before)
	}
	b := load(t, e, specB, forkProbe)
	if next := python.ForkServerPid(e); next == 0 || next == server {
		t.Errorf("fork server after the crash: %d (the dead one %d); want a new one", next, server)
	}
	pb := python.RunnerPIDs(b)
	if got := probe(t, b); got["pid"] != 2.0 {
		t.Errorf("worker b, loaded after the crash: %v; want a forked runner", got)
	}
	for _, inst := range []engines.Instance{a, b} {
		if err := inst.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for _, pid := range append(before, pb...) {
		if !gone(pid) {
			t.Errorf("runner %d runs after its worker closed", pid)
		}
	}
}

// forkHelperEnv makes this test binary the node of
// TestForkedRunnersDieWithTheNode.
const forkHelperEnv = "WM_FORK_SERVER_HELPER"

// Forked runners die with the node, as the chain's do (bwrap's
// --die-with-parent): a node process that forked a runner is SIGKILLed,
// and the runner, its supervisor and the fork server are gone.
func TestForkedRunnersDieWithTheNode(t *testing.T) {
	if os.Getenv(forkHelperEnv) != "" {
		e := newEngine(t, python.Config{Sandbox: forkSandbox(t), AllowedPackages: []string{"os", "sys"}})
		inst := load(t, e, testSpec, forkProbe)
		pids := python.RunnerPIDs(inst)
		fmt.Printf("runner %d supervisor %d server %d\n", childOf(pids[0]), pids[0], python.ForkServerPid(e))
		time.Sleep(time.Minute) // until killed
		return
	}
	forkSandbox(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestForkedRunnersDieWithTheNode$", "-test.v")
	cmd.Env = append(os.Environ(), forkHelperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(out)
	var runner, supervisor, server int
	for lines.Scan() {
		if n, _ := fmt.Sscanf(lines.Text(), "runner %d supervisor %d server %d", &runner, &supervisor, &server); n == 3 {
			break
		}
	}
	if runner == 0 || supervisor == 0 || server == 0 {
		t.Fatalf("the helper node said no pids (runner %d, supervisor %d, server %d)", runner, supervisor, server)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for what, pid := range map[string]int{"runner": runner, "supervisor": supervisor, "fork server": server} {
		if !gone(pid) {
			t.Errorf("the %s (%d) runs after its node was killed", what, pid)
		}
	}
}

// reapHelperEnv makes this test binary the node of
// TestSupervisorsAreReapedByTheNode.
const reapHelperEnv = "WM_FORK_REAP_HELPER"

// The fork server reaps the supervisors (their subreaper: no zombie when a
// worker closes); once it has died, a node that is its container's first
// process (or a subreaper) is their parent, and reaps each once its runner
// ends.
func TestSupervisorsAreReapedByTheNode(t *testing.T) {
	if os.Getenv(reapHelperEnv) == "" {
		forkSandbox(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestSupervisorsAreReapedByTheNode$", "-test.v")
		cmd.Env = append(os.Environ(), reapHelperEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("the helper node: %v\n%s", err, out)
		}
		return
	}
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		t.Fatal(errno)
	}
	sb := forkSandbox(t)
	python.ForkServerRetry(t, 0)
	e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"os", "sys"}})
	specA, specB, specC := testSpec, testSpec, testSpec
	specA.WorkerID, specB.WorkerID, specC.WorkerID = "reap-a", "reap-b", "reap-c"
	a, b, c := load(t, e, specA, forkProbe), load(t, e, specB, forkProbe), load(t, e, specC, forkProbe)
	server := python.ForkServerPid(e)
	reaped := func(pids ...int) {
		t.Helper()
		for _, s := range pids {
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if err := syscall.Kill(s, 0); err == syscall.ESRCH {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("supervisor %d not reaped (state %q, parent %d)", s, procStatus(s)["State"], ppidOf(s))
				}
			}
		}
	}
	// While the server lives, it reaps.
	sc := python.RunnerPIDs(c)
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	reaped(sc...)
	// The server dies: the others pass to this process, which reaps them.
	supervisors := append(python.RunnerPIDs(a), python.RunnerPIDs(b)...)
	if err := syscall.Kill(server, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, s := range supervisors {
		for deadline := time.Now().Add(10 * time.Second); ppidOf(s) != os.Getpid(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("supervisor %d's parent is %d after the server died; want this process (a subreaper)", s, ppidOf(s))
			}
		}
	}
	for _, inst := range []engines.Instance{a, b} {
		if err := inst.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	reaped(supervisors...)
}

// What a worker's processes leave behind is reaped inside its sandbox, both
// ways (by bwrap's first process, or by the fork server's supervisor): a
// process the worker started that started one in the background and
// exited leaves no zombie behind (which would count against the worker's
// process limit until its runner ended).
func TestOrphansOfAWorkerAreReaped(t *testing.T) {
	sb := forkSandbox(t)
	bothWays(t, func(t *testing.T, noFork bool) {
		e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"os", "subprocess", "time"}, NoForkServer: noFork})
		inst := load(t, e, testSpec, `
import os, subprocess, time

def zombies():
    n = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split()[0] == "Z":
                    n += 1
            except OSError:
                pass
    return n

def process(event):
    subprocess.run(["/bin/sh", "-c", "sleep 0.2 & exit 0"], check=True)
    for _ in range(50):
        time.sleep(0.1)
        if zombies() == 0 and len([p for p in os.listdir("/proc") if p.isdigit()]) <= 2:
            return {"type": "r", "data": {"zombies": 0}}
    return {"type": "r", "data": {"zombies": zombies()}}
`)
		got := enginetest.DataOf(t, mustCall(t, inst, jsonEvent("t", map[string]any{})))
		if got["zombies"] != 0.0 {
			t.Errorf("zombies in the worker's sandbox: %v; want none", got["zombies"])
		}
	})
}

// A forked runner ends as a started one does when its worker closes: the
// threads the worker started are joined (a line such a thread prints
// late still reaches the log) and atexit's functions run, both ways.
func TestForkedRunnerEndsAsAnInterpreterWould(t *testing.T) {
	sb := forkSandbox(t)
	bothWays(t, func(t *testing.T, noFork bool) {
		rec := &recorder{}
		e := newEngine(t, python.Config{Sandbox: sb, AllowedPackages: []string{"threading", "atexit"}, NoForkServer: noFork})
		spec := testSpec
		spec.Logger = slog.New(rec)
		inst := load(t, e, spec, `
import atexit, threading, time
atexit.register(lambda: print("at exit", flush=True))

def process(event):
    def late():
        time.sleep(0.2)
        print("late line", flush=True)
    threading.Thread(target=late).start()
    return None
`)
		mustCall(t, inst, jsonEvent("t", map[string]any{}))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := inst.Close(ctx); err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		var got []string
		for _, r := range rec.records {
			got = append(got, r.Message)
		}
		if !slices.Contains(got, "late line") || !slices.Contains(got, "at exit") {
			t.Errorf("the worker's log after Close: %q; want the thread's late line and the atexit function's", got)
		}
	})
}

// A forked runner's resource limits are the chain's (prlimit's), field
// for field, the CPU limit and the fixed ones (no core files, 64 KiB of
// locked memory) included: /proc/self/limits read by the worker both ways.
func TestForkedRunnerHasTheChainsLimits(t *testing.T) {
	limits := sandbox.DefaultLimits
	limits.FileSize, limits.CPUSeconds = 16<<20, 7
	sb := forkSandbox(t, sandbox.Config{Mode: sandbox.Strict, Log: slog.New(slog.DiscardHandler), Limits: limits})
	read := func(noFork bool) string {
		e := newEngine(t, python.Config{Sandbox: sb, NoForkServer: noFork})
		inst := load(t, e, testSpec, `
def process(event):
    return {"type": "r", "data": open("/proc/self/limits").read()}
`)
		defer inst.Close(context.Background())
		out := mustCall(t, inst, jsonEvent("t", map[string]any{}))
		var s string
		if err := out[0].DataAs(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	forked, chain := read(false), read(true)
	if forked != chain {
		t.Errorf("limits differ:\nforked:\n%s\nchain:\n%s", forked, chain)
	}
	for _, want := range []string{"Max cpu time              7                    8", "Max core file size        0", "Max locked memory         65536"} {
		if !strings.Contains(forked, want) {
			t.Errorf("forked runner's limits lack %q:\n%s", want, forked)
		}
	}
}
