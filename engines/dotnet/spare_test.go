package dotnet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
)

// whoAmIWorker answers with its worker's variables, its user id and its
// sandbox layers (lines of /proc/self/status).
const whoAmIWorker = `
using System;
using System.IO;
using System.Linq;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public class WhoAmI : IWorker
{
    public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        var status = File.ReadAllLines("/proc/self/status");
        var layers = string.Join("|", status.Where(l => l.StartsWith("Seccomp") || l.StartsWith("NoNewPrivs:") || l.StartsWith("CapEff:")));
        var uid = status.First(l => l.StartsWith("Uid:")).Split('\t')[1];
        var data = new JsonObject {
            ["id"] = Environment.GetEnvironmentVariable("VIRTUFIN_WORKER_ID"),
            ["topic"] = Environment.GetEnvironmentVariable("VIRTUFIN_WORKER_TOPIC"),
            ["uid"] = uid, ["layers"] = layers,
            ["warm"] = Environment.GetEnvironmentVariable("WMHOST_WARM"),
        };
        return Task.FromResult(new CloudEvent { Type = "who", DataContentType = "application/json", Data = data });
    }
}
`

type hostWho struct{ ID, Topic, UID, Layers, Warm string }

func askHost(t *testing.T, inst engines.Instance) hostWho {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := inst.Process(ctx, enginetest.NewEvent("q", "ask", nil, ""))
	if err != nil || len(out) != 1 {
		t.Fatalf("outputs %v, err %v", out, err)
	}
	var w hostWho
	if err := out[0].DataAs(&w); err != nil {
		t.Fatal(err)
	}
	return w
}

// layer is the value of the line of layers (askHost's) that starts with
// name ("" when there is none).
func layer(layers, name string) string {
	for _, l := range strings.Split(layers, "|") {
		if v, ok := strings.CutPrefix(l, name); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// filtersOf is the Seccomp_filters counts of process pid's threads, as
// /proc shows them, each once: one count when every thread has as many.
func filtersOf(t *testing.T, pid int) string {
	t.Helper()
	statuses, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(statuses) == 0 {
		t.Fatalf("no threads of %d (%v)", pid, err)
	}
	var counts []string
	for _, f := range statuses {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that ended meanwhile
		}
		if n := layer(strings.ReplaceAll(string(b), "\n", "|"), "Seccomp_filters:"); !slices.Contains(counts, n) {
			counts = append(counts, n)
		}
	}
	slices.Sort(counts)
	return strings.Join(counts, ",")
}

// monoUnder is the Mono process that is pid or runs under it (a sandbox's
// launcher starts it as a descendant), found through the kernel's lists
// of children.
func monoUnder(t *testing.T, pid int) int {
	t.Helper()
	for _, p := range processTree(pid) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); strings.HasPrefix(string(comm), "mono") {
			return p
		}
	}
	t.Fatalf("no Mono process at or under pid %d", pid)
	return 0
}

func hostPID(t *testing.T, inst engines.Instance) int {
	t.Helper()
	procs := inst.(*Instance).pool.Tracked()
	if len(procs) != 1 {
		t.Fatalf("%d hosts, want one", len(procs))
	}
	return procs[0].Pid
}

func waitSpareHost(t *testing.T, e *Engine) *proc {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if r := e.spares.Ready(); len(r) == 1 {
			return r[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("no spare host ready after 2 minutes")
		}
	}
}

func hostSpec(id string) engines.Spec {
	return engines.Spec{WorkerID: id, Topic: "topic-" + id, MIMEType: MIMESource}
}

// A spare host serves one worker, once, sandboxed like a host started for
// its worker: it sees that worker's variables and files (hard-linked into
// its own slot, removed when it exits), never another's; a spare that died
// while it waited is not given out.
func TestSpareHostServesOneWorkerOnce(t *testing.T) {
	testSpareHosts(t, Config{Spares: 1})
}

func TestSpareHostServesOneWorkerOnceSandboxed(t *testing.T) {
	testSpareHosts(t, Config{Spares: 1, Sandbox: sandboxtest.Strict(t)})
}

func testSpareHosts(t *testing.T, cfg Config) {
	e := newTestEngine(t, cfg)
	t.Cleanup(func() { _ = e.Close() })
	a := enginetest.Load(t, e, hostSpec("a"), []byte(whoAmIWorker))
	wa := askHost(t, a)
	spare := waitSpareHost(t, e)
	if entries, err := os.ReadDir(spare.slot); err != nil || len(entries) != 0 {
		t.Fatalf("a waiting spare's slot %s holds %v (%v), want nothing", spare.slot, entries, err)
	}
	// The spare waits with the lockdown filter installed (Host.cs,
	// LockdownEarly), on every thread (WarmRich's and the ones it
	// started too): as many filters as a's host has with a worker.
	if e.lockdown != nil {
		if got, want := filtersOf(t, monoUnder(t, spare.Pid)), layer(wa.Layers, "Seccomp_filters:"); got != want {
			t.Fatalf("a waiting spare has %q seccomp filters, a host serving a worker %q", got, want)
		}
	}

	b := enginetest.Load(t, e, hostSpec("b"), []byte(whoAmIWorker))
	if got := hostPID(t, b); got != spare.Pid {
		t.Fatalf("b runs in host %d, want the spare %d", got, spare.Pid)
	}
	wb := askHost(t, b)
	if wb.ID != "b" || wb.Topic != "topic-b" || wb.Warm != "" {
		t.Fatalf("the spare's variables: %+v, want b's (and none of its warm-up, WarmSetup)", wb)
	}
	if wb.Layers != wa.Layers {
		t.Fatalf("a spare's layers %q, a host started for its worker %q", wb.Layers, wa.Layers)
	}
	if cfg.Sandbox != nil && wb.UID == wa.UID {
		t.Fatalf("workers a and b share uid %s", wa.UID)
	}
	if entries, _ := os.ReadDir(spare.slot); len(entries) == 0 {
		t.Fatal("b's files are not in its spare's slot")
	}
	next := waitSpareHost(t, e)
	if next.Pid == spare.Pid || next.slot == spare.slot {
		t.Fatal("the next spare is the one given out")
	}
	if err := b.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(spare.slot); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's slot %s still there after b closed", spare.slot)
		}
	}

	// A spare killed while it waits is not given out; running workers
	// go on.
	if err := syscall.Kill(next.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !next.Exited(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the killed spare did not exit")
		}
	}
	if w := askHost(t, a); w.ID != "a" {
		t.Fatalf("a after a spare died: %+v", w)
	}
	c := enginetest.Load(t, e, hostSpec("c"), []byte(whoAmIWorker))
	if got := hostPID(t, c); slices.Contains([]int{spare.Pid, next.Pid}, got) {
		t.Fatalf("c runs in host %d: given out before, or dead", got)
	}
	if w := askHost(t, c); w.ID != "c" || !strings.Contains(w.Layers, "Seccomp") {
		t.Fatalf("c: %+v", w)
	}

	// A spare warmed its code on the host's own echo (Host.cs, Warm),
	// which no worker's load can take: code without a worker class is
	// refused on a spare as on a host started for it.
	waitSpareHost(t, e)
	_, err := e.Load(t.Context(), hostSpec("nothing"), []byte("public class Nothing { }"))
	if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), "defines no public, non-abstract class") {
		t.Fatalf("code without a worker class on a spare: err = %v, want ErrInvalidCode saying it defines no worker class", err)
	}
}

// The host's and the DevKit's code is compiled ahead of time (mono --aot)
// when the runtime is built, and the hosts map those images.
func TestHostCodeIsPrecompiled(t *testing.T) {
	if _, err := exec.LookPath("as"); err != nil {
		t.Skip("no native assembler (binutils): the hosts compile their code as they run it")
	}
	e := newTestEngine(t, Config{Spares: 1, SpareCompilers: 1})
	t.Cleanup(func() { _ = e.Close() })
	// A source of its own: its compile (not the cache) takes a spare
	// compiler, and the next one starts.
	inst := enginetest.Load(t, e, hostSpec("a"), unique([]byte(whoAmIWorker), fmt.Sprint(t.Name(), time.Now().UnixNano())))
	rt := e.currentRuntime()
	for _, name := range []string{hostExe, devKitDLL, compilerExe} {
		if _, err := os.Stat(filepath.Join(rt.dir, name+".so")); err != nil {
			t.Fatalf("no ahead-of-time image of %s: %v", name, err)
		}
	}
	// The spare compiler's driver too (host/Compiler.cs).
	compiler := processTree(waitSpareCompiler(t, e).cmd.Process.Pid)
	mapsOf := func(pids []int) string {
		var all []byte
		for _, pid := range pids {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
			all = append(all, b...)
		}
		return string(all)
	}
	if !strings.Contains(mapsOf(compiler), filepath.Join(rt.dir, compilerExe+".so")) {
		t.Fatalf("the spare compiler (processes %v) does not map %s.so", compiler, compilerExe)
	}
	for _, pid := range []int{hostPID(t, inst), waitSpareHost(t, e).Pid} {
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{hostExe, devKitDLL} {
			if !strings.Contains(string(maps), filepath.Join(rt.dir, name+".so")) {
				t.Fatalf("host %d does not map %s.so", pid, name)
			}
		}
	}
}

// A package worker (its assemblies unpacked in the cache) runs on a spare
// too: its files are linked into the slot and its paths moved there.
func TestSpareHostRunsAPackage(t *testing.T) {
	e := newTestEngine(t, Config{Spares: 1})
	t.Cleanup(func() { _ = e.Close() })
	pkg := buildPackage(t, e, "echo", "net48", fixture(t, "echo"))
	enginetest.Load(t, e, hostSpec("first"), []byte(whoAmIWorker))
	spare := waitSpareHost(t, e)
	spec := hostSpec("pkg")
	spec.MIMEType = MIMEPackage
	inst := enginetest.Load(t, e, spec, pkg)
	if got := hostPID(t, inst); got != spare.Pid {
		t.Fatalf("the package runs in host %d, want the spare %d", got, spare.Pid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := inst.Process(ctx, enginetest.NewEvent("e1", "t", map[string]any{"x": 1}, ""))
	if err != nil || len(out) != 1 || out[0].Type() != "conformance.echo" {
		t.Fatalf("outputs %v, err %v", out, err)
	}
}

// A check whose Load runs on another node (Spec.LoadsElsewhere) keeps no
// host: the one that loaded the code exits; an ordinary check's is kept
// for the Load.
func TestCheckForALoadElsewhereParksNoHost(t *testing.T) {
	e := newTestEngine(t, Config{})
	t.Cleanup(func() { _ = e.Close() })
	ctx := context.Background()
	elsewhere := hostSpec("a")
	elsewhere.LoadsElsewhere = true
	if err := e.Check(ctx, elsewhere, []byte(whoAmIWorker)); err != nil {
		t.Fatal(err)
	}
	if n := e.parking.Len(); n != 0 {
		t.Fatalf("%d hosts parked after a check for a Load elsewhere, want none", n)
	}
	if err := e.Check(ctx, hostSpec("a"), []byte(whoAmIWorker)); err != nil {
		t.Fatal(err)
	}
	if n := e.parking.Len(); n != 1 {
		t.Fatalf("%d hosts parked after an ordinary check, want 1", n)
	}
}

// helperLibrary is an assembly of a package's own that its worker
// references (helperWorker).
const helperLibrary = `
public static class Helper
{
    public static string Tag(string id) { return "helper:" + id; }
}
`

// helperWorker answers with what helperLibrary's Helper says.
const helperWorker = `
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public class UsesHelper : IWorker
{
    public Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        return Task.FromResult(new CloudEvent { Type = "helped", DataContentType = "application/json",
            Data = new JsonObject { ["tag"] = Helper.Tag(input.Id) } });
    }
}
`

// A package's assemblies resolve the same on a spare host and on a host
// started for its worker: a worker that references an assembly of its own
// package (found in its directory), and one built against the original
// DevKit's name, Virtufin.Worker.DevKit (which the host's Resolve, set up
// before its hello, maps to the node's DevKit; the copy in the package is
// ignored).
func TestPackageReferencesResolveOnSpareAndStartedHosts(t *testing.T) {
	for _, spares := range []int{0, 1} {
		t.Run(fmt.Sprintf("spares-%d", spares), func(t *testing.T) {
			e := newTestEngine(t, Config{Spares: spares, Sandbox: sandboxtest.Strict(t)})
			t.Cleanup(func() { _ = e.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			rt, err := e.runtimeFor(ctx)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			helper := compileLibrary(ctx, t, rt, dir, "Helper", []byte(helperLibrary))
			helped := zipFiles(t, map[string]string{
				"UsesHelper.nuspec":        `<?xml version="1.0"?><package><metadata><id>UsesHelper</id><version>1.0.0</version></metadata></package>`,
				"lib/net48/UsesHelper.dll": string(compileLibrary(ctx, t, rt, dir, "UsesHelper", []byte(helperWorker), filepath.Join(dir, "Helper.dll"))),
				"lib/net48/Helper.dll":     string(helper),
			})
			seed := seedPackage(t, rt, seedReferenceDevKit(t, rt), "seed_commandworker")
			if spares > 0 {
				enginetest.Load(t, e, hostSpec("first"), []byte(whoAmIWorker))
			}
			for _, tc := range []struct {
				name     string
				pkg      []byte
				data     any
				wantType string
				want     string
			}{
				{"own-assembly", helped, nil, "helped", `{"tag":"helper:e1"}`},
				{"original-devkit", seed, map[string]any{"command": "hello", "name": "Ada"}, "greeting", `{"greeting":"hello, Ada"}`},
			} {
				var spare *proc
				if spares > 0 {
					spare = waitSpareHost(t, e)
				}
				spec := hostSpec(tc.name)
				spec.MIMEType = MIMEPackage
				if err := e.Check(ctx, spec, tc.pkg); err != nil {
					t.Fatalf("%s: check: %v", tc.name, err)
				}
				inst := enginetest.Load(t, e, spec, tc.pkg)
				if spare != nil {
					if got := hostPID(t, inst); got != spare.Pid {
						t.Fatalf("%s runs in host %d, want the spare %d", tc.name, got, spare.Pid)
					}
				}
				out, err := inst.Process(ctx, enginetest.NewEvent("e1", "t", tc.data, ""))
				if err != nil || len(out) != 1 {
					t.Fatalf("%s: outputs %v, err %v", tc.name, out, err)
				}
				if out[0].Type() != tc.wantType || normalizeJSON(t, out[0].Data()) != normalizeJSON(t, []byte(tc.want)) {
					t.Fatalf("%s: %s %s, want %s %s", tc.name, out[0].Type(), out[0].Data(), tc.wantType, tc.want)
				}
			}
		})
	}
}
