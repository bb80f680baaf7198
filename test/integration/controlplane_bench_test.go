package integration

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	devkit "github.com/virtufin/workmanager/sdk/python"
)

// The operations BenchmarkControlPlane times, in the order a round runs
// them; "→msg" is from the call's start until the output of a message
// published when the call returned arrives, answered by the code the call
// put in place.
var cpOps = []string{"create", "create→msg", "load", "load→msg", "stop", "start", "start→msg", "rollback", "rollback→msg", "delete"}

// BenchmarkControlPlane measures the lifecycle calls through the gRPC API
// on the real stack (issue 48 item 1): p50/p99 of CreateWorker, LoadCode,
// StopWorker, StartWorker, RollbackWorker and DeleteWorker, and for the
// calls that leave the worker running, until its first message is
// processed by the code the call put in place, for Python, native (C,
// in process) and .NET (C#) workers;
//   - back to back on one worker (each call, and the probe message after
//     it, right after the previous one) and spaced (WM_CP_GAP, 500 ms —
//     issue 48's "half a second between calls" — between calls: the gap
//     is the condition measured, not a wait);
//   - idle, and while the node is saturated by a Python worker on another
//     topic fed by publishers that keep 64 messages in flight;
//   - many workers at once: WM_CP_MANY (100) creates, then deletes, from
//     WM_CP_CLIENTS (8) concurrent clients;
//
// next to its baselines in the same run and load: a bare Temporal update
// whose handler runs one local activity (a workflow of its own on its own
// task queue, same dev server), and starting one sandboxed Python runner
// (the Python engine's Load of a trivial worker, sandboxed as the node's).
// A round is create, WM_CP_CYCLES (1) times load/stop/start/rollback,
// delete; WM_CP_ROUNDS (6: the fewest for which the comparison with
// Python below can tell anything at 90 %) rounds per engine, load and
// spacing;
// WM_CP_ENGINES (python,native,dotnet,dotnet-dll: C# source and the same
// worker built ahead as a package) and WM_CP_LOADS (idle,saturated)
// pick. An idle round starts once the machine is quiet (awaitQuiet).
// With few samples p99 is the slowest. Each engine is also compared with
// Python call by call, paired by round (reportPaired: the median
// difference and its 90 % interval, the way to tell "no slower" from
// the machine's noise). Run it with `make bench` (-benchtime 1x; -v
// shows the tables whole).
func BenchmarkControlPlane(b *testing.B) {
	// No shared writable path (which turns spare runners off), as a node
	// installed by default; WM_BENCH_NODE_ENV adds settings to the node,
	// as for BenchmarkEndToEnd (e.g. PYTHON_SPARE_RUNNERS=0, the baseline).
	e := newEnvWith(b, envConfig{nodeEnv: append([]string{"SANDBOX_WRITABLE_PATHS="}, strings.Fields(os.Getenv("WM_BENCH_NODE_ENV"))...)})
	c := &cpBench{e: e, b: b,
		rounds: envInt("WM_CP_ROUNDS", 6), cycles: envInt("WM_CP_CYCLES", 1),
		many: envCount("WM_CP_MANY", 100), clients: envInt("WM_CP_CLIENTS", 8),
		gap: 500 * time.Millisecond, samples: map[string][]time.Duration{}}
	if v := os.Getenv("WM_CP_GAP"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			b.Fatalf("WM_CP_GAP=%q: want a positive duration like 500ms", v)
		}
		c.gap = d
	}
	engineNames := cpList(b, "WM_CP_ENGINES", "python,native,dotnet,dotnet-dll", []string{"python", "native", "dotnet", "dotnet-dll"})
	loads := cpList(b, "WM_CP_LOADS", "idle,saturated", []string{"idle", "saturated"})
	c.nonce = fmt.Sprintf("%x", time.Now().UnixNano())
	c.out = "cp-out-" + c.nonce
	c.routes = map[string]chan string{}
	go c.route(e.subscribe(c.out))
	c.code = map[string]cpCode{}
	for _, name := range engineNames {
		c.code[name] = c.codeOf(name)
	}
	base := c.startBaselines()
	defer base.close()

	for range b.N {
		for _, load := range loads {
			var fl *cpFlood
			if load == "saturated" {
				fl = c.startFlood()
			}
			base.measure(c, load)
			for r := range c.rounds {
				for _, name := range engineNames {
					for _, spaced := range []bool{false, true} {
						start := time.Now()
						c.round(name, load, spaced)
						b.Logf("round %d %-6s %-9s %-12s %s", r, name, load, cpSpacing(spaced), time.Since(start).Round(time.Millisecond))
					}
				}
			}
			if fl != nil {
				n, rate := fl.stop()
				b.Logf("saturating worker: %d messages, %.0f msg/s", n, rate)
				b.ReportMetric(rate, "saturating-msg/s")
			}
			if load == "idle" && c.many > 0 {
				c.manyCreates()
			}
		}
	}
	c.report(engineNames, loads)
}

// cpBench is one BenchmarkControlPlane run.
type cpBench struct {
	e                              *env
	b                              *testing.B
	rounds, cycles, many, clients  int
	gap                            time.Duration
	nonce, out                     string // out: the topic every measured worker answers on
	code                           map[string]cpCode
	seq                            atomic.Int64
	wrongVersion                   atomic.Int64
	mu                             sync.Mutex
	routes                         map[string]chan string     // probe key → versions of its outputs
	samples                        map[string][]time.Duration // "engine/load/spacing/op", "baseline/…", "many/…"
	manyRate, manyDelRate, manyAll float64
}

// cpCode is what an engine's worker is created and reloaded with: its
// MIME type and two versions of it, whose outputs name them ("v1", "v2").
type cpCode struct {
	mime   string
	v1, v2 []byte
}

// envCount is the count in the environment variable name, 0 included
// (WM_CP_MANY=0: no concurrent creates), def when unset or not a count.
func envCount(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

func (c *cpBench) codeOf(name string) cpCode {
	switch name {
	case "native":
		return cpCode{mime: "application/x-native-dll",
			v1: nativePackageOf(c.b, "native_worker.c", `-DVERSION="v1"`, fmt.Sprintf(`-DOUT_TYPE="%s"`, c.out)),
			v2: nativePackageOf(c.b, "native_worker.c", `-DVERSION="v2"`, fmt.Sprintf(`-DOUT_TYPE="%s"`, c.out))}
	case "dotnet":
		return cpCode{mime: "text/x-csharp", v1: csharpWorker(c.out, "v1"), v2: csharpWorker(c.out, "v2")}
	case "dotnet-dll":
		// The same worker built ahead, as a .NET author ships one (a
		// package: no compile on the node).
		return cpCode{mime: "application/x-dotnet-dll",
			v1: dotnetPackage(c.b, "Cp.Echo", string(csharpWorker(c.out, "v1"))),
			v2: dotnetPackage(c.b, "Cp.Echo", string(csharpWorker(c.out, "v2")))}
	}
	return cpCode{mime: "text/x-python", v1: echoWorker(c.out, "v1"), v2: echoWorker(c.out, "v2")}
}

func cpSpacing(spaced bool) string {
	if spaced {
		return "spaced"
	}
	return "back-to-back"
}

// cpList is the comma-separated list in the environment variable name
// (def when unset), each entry one of known.
func cpList(b *testing.B, name, def string, known []string) []string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	out := strings.Split(v, ",")
	for _, x := range out {
		if !slices.Contains(known, x) {
			b.Fatalf("%s: unknown %q (%s)", name, x, strings.Join(known, ", "))
		}
	}
	return out
}

// route hands each output on c.out to the probe waiting for it: the key
// is the probe's data.k, echoed as data.input.k (Python, .NET) or its
// event id, data.id (native).
func (c *cpBench) route(outs <-chan event.Event) {
	for ev := range outs {
		var d struct {
			Version string `json:"version"`
			ID      string `json:"id"`
			Input   struct {
				K string `json:"k"`
			} `json:"input"`
		}
		if json.Unmarshal(ev.Data(), &d) != nil {
			continue
		}
		key := cmp.Or(d.Input.K, d.ID)
		c.mu.Lock()
		ch := c.routes[key]
		c.mu.Unlock()
		if ch != nil {
			select {
			case ch <- d.Version:
			default:
			}
		}
	}
}

// probe publishes one message to in and waits for its output. An output
// of another version than want (old code answering a message published
// after the call that replaced it returned) is counted and logged.
func (c *cpBench) probe(in, want string) {
	c.b.Helper()
	key := fmt.Sprintf("cp-%s-%d", c.nonce, c.seq.Add(1))
	ch := make(chan string, 4)
	c.mu.Lock()
	c.routes[key] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.routes, key)
		c.mu.Unlock()
	}()
	c.e.publishEvent(in, map[string]any{"id": key, "type": "cp.probe", "datacontenttype": "application/json",
		"data": map[string]any{"k": key}})
	sent := time.Now()
	select {
	case got := <-ch:
		if got != want {
			c.wrongVersion.Add(1)
			c.b.Logf("probe %s on %s: answered by %s, want %s", key, in, got, want)
		}
	case <-time.After(time.Minute):
		c.b.Fatalf("probe %s on %s: no output within a minute", key, in)
	}
	if d := time.Since(sent); d > 2*time.Second {
		c.b.Logf("probe %s on %s: output after %s; the node's log about it:\n%s", key, in, d.Round(time.Millisecond), c.nodeLogAbout(key))
	}
}

// nodeLogAbout is the node log's lines that mention s (at most 12).
func (c *cpBench) nodeLogAbout(s string) string {
	raw, err := os.ReadFile(filepath.Join(c.e.dir, "node.log"))
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.Contains(l, s) && len(out) < 12 {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func (c *cpBench) add(key string, d time.Duration) {
	c.mu.Lock()
	c.samples[key] = append(c.samples[key], d)
	c.mu.Unlock()
}

// call runs one lifecycle call with its own deadline and fails the
// benchmark when it fails.
func (c *cpBench) call(what string, f func(ctx context.Context) error) {
	c.b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := f(ctx); err != nil {
		c.b.Fatalf("%s: %v", what, err)
	}
}

// round creates a worker of engine on a fresh topic, reloads, stops,
// starts and rolls it back c.cycles times and deletes it, timing each call
// (and, where the worker runs afterwards, its first message), back to back
// or c.gap apart.
func (c *cpBench) round(engine, load string, spaced bool) {
	c.b.Helper()
	code, prefix := c.code[engine], engine+"/"+load+"/"+cpSpacing(spaced)+"/"
	in := fmt.Sprintf("cp-%s-in-%s-%d", engine, c.nonce, c.seq.Add(1))
	if code.mime == "text/x-csharp" {
		// Sources of this round's own, as a user's new code is: the node
		// compiles each once and keeps the assembly, so the same source
		// again would time no compile.
		code.v1 = append(append([]byte(nil), code.v1...), "\n// "+in+"\n"...)
		code.v2 = append(append([]byte(nil), code.v2...), "\n// "+in+"\n"...)
	}
	pause := func() {
		if spaced {
			<-time.After(c.gap) // the spacing measured, not a wait for something
		}
	}
	var id string
	// A round starts on a node that has finished the work the round
	// before left behind (idle load): a round follows one of the other
	// spacing, and a spaced create 500 ms after a back-to-back .NET round
	// ran beside that round's aftermath (a spare compiler's and four
	// spare hosts' starts, about 1 s of CPU), so it timed the round
	// before, not spaced calls. Within a round, each call runs beside
	// what the calls before it in that round left.
	if load == "idle" {
		c.awaitQuiet()
	}
	// Spaced calls are spaced from the call before them, the last one of
	// the round before included.
	pause()
	t0 := time.Now()
	c.call("CreateWorker", func(ctx context.Context) error {
		r, err := c.e.client.CreateWorker(ctx, &pb.CreateWorkerRequest{Code: pyCode(code.v1), MimeType: code.mime, Topic: in})
		id = r.GetWorkerId()
		return err
	})
	c.add(prefix+"create", time.Since(t0))
	c.probe(in, "v1")
	c.add(prefix+"create→msg", time.Since(t0))
	pause()
	for range c.cycles {
		t0 = time.Now()
		c.call("LoadCode", func(ctx context.Context) error {
			_, err := c.e.client.LoadCode(ctx, &pb.LoadCodeRequest{WorkerId: id, Code: pyCode(code.v2)})
			return err
		})
		c.add(prefix+"load", time.Since(t0))
		c.probe(in, "v2")
		c.add(prefix+"load→msg", time.Since(t0))
		pause()

		t0 = time.Now()
		c.call("StopWorker", func(ctx context.Context) error {
			_, err := c.e.client.StopWorker(ctx, &pb.StopWorkerRequest{WorkerId: id})
			return err
		})
		c.add(prefix+"stop", time.Since(t0))
		pause()

		t0 = time.Now()
		c.call("StartWorker", func(ctx context.Context) error {
			_, err := c.e.client.StartWorker(ctx, &pb.StartWorkerRequest{WorkerId: id})
			return err
		})
		c.add(prefix+"start", time.Since(t0))
		c.probe(in, "v2")
		c.add(prefix+"start→msg", time.Since(t0))
		pause()

		t0 = time.Now()
		c.call("RollbackWorker", func(ctx context.Context) error {
			_, err := c.e.client.RollbackWorker(ctx, &pb.RollbackWorkerRequest{WorkerId: id, Version: 1})
			return err
		})
		c.add(prefix+"rollback", time.Since(t0))
		c.probe(in, "v1")
		c.add(prefix+"rollback→msg", time.Since(t0))
		pause()
	}
	t0 = time.Now()
	c.call("DeleteWorker", func(ctx context.Context) error {
		_, err := c.e.client.DeleteWorker(ctx, &pb.DeleteWorkerRequest{WorkerId: id})
		return err
	})
	c.add(prefix+"delete", time.Since(t0))
	pause()
}

// manyCreates creates c.many Python workers (each on its topic) from
// c.clients concurrent clients, then deletes them the same way.
func (c *cpBench) manyCreates() {
	c.b.Helper()
	code := echoWorker(c.out, "v1")
	ids := make([]string, c.many)
	run := func(op string, f func(ctx context.Context, i int) error) float64 {
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, c.clients)
		start := time.Now()
		for range c.clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1)) - 1; i < c.many; i = int(next.Add(1)) - 1 {
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
					t0 := time.Now()
					err := f(ctx, i)
					cancel()
					if err != nil {
						errs <- fmt.Errorf("%s %d: %w", op, i, err)
						return
					}
					c.add("many/"+op, time.Since(t0))
				}
			}()
		}
		wg.Wait()
		all := time.Since(start)
		close(errs)
		for err := range errs {
			c.b.Fatal(err)
		}
		if op == "create" {
			c.manyAll = all.Seconds()
		}
		return float64(c.many) / all.Seconds()
	}
	before, mBefore, cmdsBefore, statBefore := cpuSnapshot(), machineCPU(), c.e.redisCLI(c.b, "info", "commandstats"), procStatCPU()
	forksBefore := forksSinceBoot()
	took, began := make([]time.Duration, c.many), make([]time.Time, c.many)
	c.manyRate = run("create", func(ctx context.Context, i int) error {
		t0 := time.Now()
		r, err := c.e.client.CreateWorker(ctx, &pb.CreateWorkerRequest{Code: pyCode(code), MimeType: "text/x-python",
			Topic: fmt.Sprintf("cp-many-%s-%d", c.nonce, i)})
		ids[i], took[i], began[i] = r.GetWorkerId(), time.Since(t0), t0
		return err
	})
	if os.Getenv("WM_CP_DEBUG") != "" {
		slowest := make([]int, c.many)
		for i := range slowest {
			slowest[i] = i
		}
		sort.Slice(slowest, func(a, b int) bool { return took[slowest[a]] > took[slowest[b]] })
		tc := c.e.temporalClient(c.b)
		for _, i := range slowest[:min(3, len(slowest))] {
			var h strings.Builder
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			it := tc.GetWorkflowHistory(ctx, "workmanager-worker-"+ids[i], "", false, 0)
			for n := 0; it.HasNext() && n < 20; n++ {
				ev, err := it.Next()
				if err != nil {
					break
				}
				fmt.Fprintf(&h, "  %3d %s %s\n", ev.GetEventId(), ev.GetEventTime().AsTime().Format("15:04:05.000"), ev.GetEventType())
			}
			cancel()
			c.b.Logf("slow create %s: %s (began %s); node log:\n%s\nhistory:\n%s", ids[i], took[i], began[i].Format("15:04:05.000"), c.nodeLogAbout(ids[i]), h.String())
		}
	}
	c.logCPUByProcess(before, cpuSnapshot(), mBefore, machineCPU())
	c.logRedisCommands(cmdsBefore, c.e.redisCLI(c.b, "info", "commandstats"))
	statAfter := procStatCPU()
	var kinds strings.Builder
	for i, name := range []string{"user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"} {
		if i < len(statBefore) && i < len(statAfter) {
			fmt.Fprintf(&kinds, " %s %.1fms;", name, float64(statAfter[i]-statBefore[i])*10/float64(c.many))
		}
	}
	c.b.Logf("many: the machine's CPU per create by kind:%s forks %.1f", kinds.String(), float64(forksSinceBoot()-forksBefore)/float64(c.many))
	if os.Getenv("WM_CP_DEBUG") != "" {
		c.b.Logf("node log warnings:\n%s", c.nodeLogAbout("level=WARN"))
		c.b.Logf("node log errors:\n%s", c.nodeLogAbout("level=ERROR"))
	}
	c.manyDelRate = run("delete", func(ctx context.Context, i int) error {
		_, err := c.e.client.DeleteWorker(ctx, &pb.DeleteWorkerRequest{WorkerId: ids[i]})
		return err
	})
	c.b.Logf("many: %d creates from %d clients in %.1fs: %.1f creates/s, p50 %s p99 %s; deletes %.1f/s, p50 %s p99 %s",
		c.many, c.clients, c.manyAll, c.manyRate, cpPct(c.samples["many/create"], 50), cpPct(c.samples["many/create"], 99),
		c.manyDelRate, cpPct(c.samples["many/delete"], 50), cpPct(c.samples["many/delete"], 99))
}

// logCPUByProcess logs the CPU each kind of process (by command name)
// spent per create between two snapshots, and the machine's: where a
// burst of creates goes. A process that exited meanwhile is not counted.
func (c *cpBench) logCPUByProcess(a, b map[int]procStat, ma, mb machineTimes) {
	by := map[string]time.Duration{}
	var all time.Duration
	for pid, p := range b {
		name := p.comm
		if p.ppid == 2 || pid == 2 {
			name = "kernel threads" // kworkers and the like, one name each
		}
		all += p.cpu - a[pid].cpu + max(p.reaped-a[pid].reaped, 0)
		by[name] += p.cpu - a[pid].cpu
		if r := p.reaped - a[pid].reaped; r > 0 {
			by[p.comm+"'s exited children"] += r
		}
	}
	names := make([]string, 0, len(by))
	for n, d := range by {
		if d > 0 {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool { return by[names[i]] > by[names[j]] })
	per := func(d time.Duration) string {
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)/float64(c.many))
	}
	var sb strings.Builder
	for i, n := range names {
		if i == 12 {
			break
		}
		fmt.Fprintf(&sb, " %s %s;", n, per(by[n]))
	}
	c.b.Logf("many: CPU per create: machine %s (%.0f%% busy), processes that ran to the end %s;%s", per(mb.busy-ma.busy),
		100*float64(mb.busy-ma.busy)/float64(mb.wall-ma.wall)/float64(runtime.NumCPU()), per(all), sb.String())
}

// quietBusy is the share of the machine's CPU under which awaitQuiet
// takes it to be quiet: an idle stack (Temporal's dev server, daprd,
// Redis, the node) uses a few percent.
const quietBusy = 0.15

// awaitQuiet waits until the machine has been quiet (under quietBusy
// busy) for 200 ms, at most 5 s (then it logs how busy it was and goes
// on).
func (c *cpBench) awaitQuiet() {
	deadline := time.Now().Add(5 * time.Second)
	quietSince := time.Time{}
	last := time.Now()
	a := procStatCPU()
	busy := -1.0
	for time.Now().Before(deadline) {
		<-time.After(50 * time.Millisecond) // a sampling interval, not a wait for something
		b := procStatCPU()
		busy = cpuBusyShare(a, b)
		a = b
		now := time.Now()
		if busy >= quietBusy || busy < 0 {
			quietSince = time.Time{}
		} else if quietSince.IsZero() {
			quietSince = last
		}
		last = now
		if !quietSince.IsZero() && now.Sub(quietSince) >= 200*time.Millisecond {
			return
		}
	}
	c.b.Logf("the machine was not quiet within 5 s (%.0f%% busy in the last 50 ms): the round starts anyway", 100*busy)
}

// cpuBusyShare is the share of CPU time that was not idle (idle and
// iowait) between two procStatCPU readings, -1 when they cannot tell.
func cpuBusyShare(a, b []int64) float64 {
	if len(a) < 5 || len(b) < 5 {
		return -1
	}
	var total, idle int64
	for i := range min(len(a), len(b), 8) { // guest time is counted in user already
		d := b[i] - a[i]
		total += d
		if i == 3 || i == 4 {
			idle += d
		}
	}
	if total <= 0 {
		return -1
	}
	return float64(total-idle) / float64(total)
}

// procStatCPU is /proc/stat's first line: the machine's CPU time by kind,
// in ticks (user, nice, system, idle, iowait, irq, softirq, steal, …).
func procStatCPU() []int64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	var out []int64
	for _, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(f, 10, 64)
		out = append(out, n)
	}
	return out
}

// forksSinceBoot is /proc/stat's count of processes (and threads)
// created since boot.
func forksSinceBoot() int64 {
	raw, _ := os.ReadFile("/proc/stat")
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "processes "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// logRedisCommands logs the Redis commands per create between two
// `INFO commandstats` answers, most frequent first.
func (c *cpBench) logRedisCommands(a, b string) {
	calls := func(s string) map[string]int {
		out := map[string]int{}
		for _, line := range strings.Split(s, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok {
				continue
			}
			n, _, _ := strings.Cut(rest, ",")
			out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.Atoi(n)
		}
		return out
	}
	ca, cb := calls(a), calls(b)
	type cmd struct {
		name string
		n    int
	}
	var cmds []cmd
	total := 0
	for name, n := range cb {
		if d := n - ca[name]; d > 0 {
			cmds = append(cmds, cmd{name, d})
			total += d
		}
	}
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].n > cmds[j].n })
	var sb strings.Builder
	for _, x := range cmds {
		fmt.Fprintf(&sb, " %s %.1f;", x.name, float64(x.n)/float64(c.many))
	}
	c.b.Logf("many: Redis commands per create: %.1f;%s", float64(total)/float64(c.many), sb.String())
}

// cpFlood is the saturating traffic: a Python echo worker on a topic of
// its own, fed by publishers that keep a window of messages in flight.
type cpFlood struct {
	done  chan struct{}
	wg    sync.WaitGroup
	n     atomic.Int64
	start time.Time
	stop  func() (int64, float64)
}

// startFlood creates the saturating worker and starts its traffic; stop
// ends the traffic, deletes the worker and returns the outputs counted
// and their rate.
func (c *cpBench) startFlood() *cpFlood {
	c.b.Helper()
	in, out := "cp-flood-in-"+c.nonce, "cp-flood-out-"+c.nonce
	outs := c.e.subscribe(out)
	var id string
	c.call("CreateWorker (saturating)", func(ctx context.Context) error {
		r, err := c.e.client.CreateWorker(ctx, &pb.CreateWorkerRequest{Code: pyCode(echoWorker(out, "flood")), MimeType: "text/x-python", Topic: in})
		id = r.GetWorkerId()
		return err
	})
	const window, publishers = 64, 4
	f := &cpFlood{done: make(chan struct{}), start: time.Now()}
	tokens := make(chan struct{}, window)
	for range window {
		tokens <- struct{}{}
	}
	go func() {
		for range outs {
			f.n.Add(1)
			select {
			case tokens <- struct{}{}:
			default:
			}
		}
	}()
	var failed atomic.Int64
	url := fmt.Sprintf("http://%s/v1.0/publish/%s/%s", c.e.stack.DaprHTTPAddr, devstack.PubSubName, in)
	for p := range publishers {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for i := p; ; i += publishers {
				select {
				case <-f.done:
					return
				case <-tokens:
				}
				if err := c.publishRaw(url, i); err != nil {
					failed.Add(1)
					tokens <- struct{}{}
				}
			}
		}()
	}
	f.stop = func() (int64, float64) {
		close(f.done)
		f.wg.Wait()
		n, d := f.n.Load(), time.Since(f.start)
		if k := failed.Load(); k > 0 {
			c.b.Logf("saturating traffic: %d publishes failed", k)
		}
		c.call("DeleteWorker (saturating)", func(ctx context.Context) error {
			_, err := c.e.client.DeleteWorker(ctx, &pb.DeleteWorkerRequest{WorkerId: id})
			return err
		})
		return n, float64(n) / d.Seconds()
	}
	// Saturated from the first measurement on: wait for the traffic to flow.
	waitFor(c.b, time.Minute, "the saturating worker's first outputs", func() bool { return f.n.Load() >= 2*window })
	return f
}

// publishRaw publishes the saturating traffic's message i to url (a
// goroutine's own call: it returns its error instead of failing the
// benchmark).
func (c *cpBench) publishRaw(url string, i int) error {
	body, _ := json.Marshal(map[string]any{"specversion": "1.0", "source": "integration-test", "id": fmt.Sprintf("f%d", i),
		"type": "cp.flood", "datacontenttype": "application/json", "data": map[string]any{"n": i}})
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/cloudevents+json")
	if tok := c.e.stack.DaprAPIToken; tok != "" {
		req.Header.Set(daprconn.TokenHeader, tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("publish flood message %d: %w", i, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("publish flood message %d: HTTP %d", i, resp.StatusCode)
	}
	return nil
}

// cpBaselines are the same run's baselines: a Temporal worker serving a
// workflow whose update runs one local activity, and the Python engine
// (sandboxed as the node's) whose Load starts one runner.
type cpBaselines struct {
	tc     client.Client
	w      worker.Worker
	wfID   string
	py     *python.Engine
	closed bool
}

// cpBaselineUpdate is the baseline workflow's update: one local activity.
const cpBaselineUpdate = "ping"

// cpBaselineWorkflow answers cpBaselineUpdate with one local activity
// until it is signalled "done".
func cpBaselineWorkflow(ctx workflow.Context) error {
	if err := workflow.SetUpdateHandler(ctx, cpBaselineUpdate, func(ctx workflow.Context, n int) (int, error) {
		ctx = workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second})
		var out int
		err := workflow.ExecuteLocalActivity(ctx, cpBaselineActivity, n).Get(ctx, &out)
		return out, err
	}); err != nil {
		return fmt.Errorf("set the update handler: %w", err)
	}
	workflow.GetSignalChannel(ctx, "done").Receive(ctx, nil)
	return workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
}

func cpBaselineActivity(_ context.Context, n int) (int, error) { return n + 1, nil }

// startBaselines starts the baseline workflow on a task queue of its own
// on the stack's Temporal server and namespace, and the Python engine.
func (c *cpBench) startBaselines() *cpBaselines {
	c.b.Helper()
	x := &cpBaselines{tc: c.e.temporalClient(c.b), wfID: "cp-baseline-" + c.nonce}
	queue := "cp-baseline-" + c.nonce
	x.w = worker.New(x.tc, queue, worker.Options{})
	x.w.RegisterWorkflowWithOptions(cpBaselineWorkflow, workflow.RegisterOptions{Name: "cp-baseline"})
	if err := x.w.Start(); err != nil {
		c.b.Fatalf("start the baseline Temporal worker: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := x.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: x.wfID, TaskQueue: queue}, "cp-baseline"); err != nil {
		c.b.Fatalf("start the baseline workflow: %v", err)
	}

	mode := sandbox.Strict
	if os.Geteuid() != 0 {
		mode = sandbox.Standard // as the node's (withSandbox)
	}
	sb, err := sandbox.New(ctx, sandbox.Config{Mode: mode, Exec: filepath.Join(c.e.bins, "sandbox-exec"), Limits: sandbox.DefaultLimits,
		Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		c.b.Fatalf("the baseline runner's sandbox: %v", err)
	}
	dk, err := devkit.Install(filepath.Join(os.TempDir(), "workmanager-devkit")) // the node's default PYTHON_DEVKIT_DIR
	if err != nil {
		c.b.Fatalf("the baseline runner's DevKit: %v", err)
	}
	x.py = python.New(python.Config{Sandbox: sb, DevKitDir: dk, AllowedPackages: []string{"os"}, Logger: slog.New(slog.DiscardHandler)})
	c.b.Cleanup(x.close)
	return x
}

// measure takes the baselines under load: 20 updates back to back, 10
// spaced, and 5 runner starts.
func (x *cpBaselines) measure(c *cpBench, load string) {
	c.b.Helper()
	update := func(i int) {
		t0 := time.Now()
		c.call("baseline update", func(ctx context.Context) error {
			h, err := x.tc.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: x.wfID, UpdateName: cpBaselineUpdate,
				Args: []any{i}, WaitForStage: client.WorkflowUpdateStageCompleted})
			if err != nil {
				return err
			}
			var out int
			if err := h.Get(ctx, &out); err != nil {
				return err
			}
			if out != i+1 {
				return fmt.Errorf("the update answered %d, want %d", out, i+1)
			}
			return nil
		})
		spacing := "back-to-back"
		if i >= 100 {
			spacing = "spaced"
		}
		c.add("baseline/"+load+"/"+spacing+"/update", time.Since(t0))
	}
	for i := range 20 {
		update(i)
	}
	for i := range 10 {
		update(100 + i)
		<-time.After(c.gap) // the spacing measured
	}
	code := []byte("def process(event):\n    return None\n")
	for i := range 5 {
		t0 := time.Now()
		var inst engines.Instance
		c.call("baseline runner", func(ctx context.Context) (err error) {
			inst, err = x.py.Load(ctx, engines.Spec{WorkerID: fmt.Sprintf("cp-baseline-%d", i), MIMEType: python.MIMEType}, code)
			return err
		})
		c.add("baseline/"+load+"/runner", time.Since(t0))
		c.call("close the baseline runner", func(ctx context.Context) error { return inst.Close(ctx) })
	}
	b := c.samples
	c.b.Logf("baseline %-9s Temporal update + local activity: back to back p50 %s p99 %s, spaced p50 %s p99 %s; sandboxed Python runner start (Load): p50 %s p99 %s",
		load, cpPct(b["baseline/"+load+"/back-to-back/update"], 50), cpPct(b["baseline/"+load+"/back-to-back/update"], 99),
		cpPct(b["baseline/"+load+"/spaced/update"], 50), cpPct(b["baseline/"+load+"/spaced/update"], 99),
		cpPct(b["baseline/"+load+"/runner"], 50), cpPct(b["baseline/"+load+"/runner"], 99))
}

func (x *cpBaselines) close() {
	if x.closed {
		return
	}
	x.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = x.tc.SignalWorkflow(ctx, x.wfID, "", "done", nil)
	x.w.Stop()
	if x.py != nil {
		_ = x.py.Close()
	}
}

// cpPct is the p-th percentile (nearest rank) of ds; 0 when empty.
func cpPct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(i, 0)].Round(100 * time.Microsecond)
}

func cpMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// cpTableHead is the head of the markdown tables report and reportPaired
// log: a row per engine, load and spacing, a column per call.
func cpTableHead() string {
	return "\n| engine | load | calls | " + strings.Join(cpOps, " | ") + " |\n|---|---|---|" + strings.Repeat("---|", len(cpOps)) + "\n"
}

// report logs the results as lines and as a markdown table (p50 / p99 in
// ms, with the p50's ratio to the Temporal update baseline of the same
// load and spacing), and reports them as metrics.
func (c *cpBench) report(engineNames, loads []string) {
	b, s := c.b, c.samples
	for _, load := range loads {
		for _, spacing := range []string{"back-to-back", "spaced"} {
			u := s["baseline/"+load+"/"+spacing+"/update"]
			b.ReportMetric(cpMs(cpPct(u, 50)), "baseline-"+load+"-"+spacing+"-update-p50-ms")
			b.ReportMetric(cpMs(cpPct(u, 99)), "baseline-"+load+"-"+spacing+"-update-p99-ms")
		}
		r := s["baseline/"+load+"/runner"]
		b.ReportMetric(cpMs(cpPct(r, 50)), "baseline-"+load+"-runner-p50-ms")
		b.ReportMetric(cpMs(cpPct(r, 99)), "baseline-"+load+"-runner-p99-ms")
	}
	var md strings.Builder
	md.WriteString(cpTableHead())
	for _, load := range loads {
		for _, spacing := range []string{"back-to-back", "spaced"} {
			upd := cpPct(s["baseline/"+load+"/"+spacing+"/update"], 50)
			for _, name := range engineNames {
				prefix := name + "/" + load + "/" + spacing + "/"
				var line []string
				cells := []string{name, load, spacing}
				for _, op := range cpOps {
					ds := s[prefix+op]
					p50, p99 := cpPct(ds, 50), cpPct(ds, 99)
					metric := strings.ReplaceAll(name+"-"+load+"-"+spacing+"-"+op, "→", "-to-")
					b.ReportMetric(cpMs(p50), metric+"-p50-ms")
					b.ReportMetric(cpMs(p99), metric+"-p99-ms")
					ratio := ""
					if upd > 0 {
						ratio = fmt.Sprintf(" (%.0f×)", float64(p50)/float64(upd))
					}
					line = append(line, fmt.Sprintf("%s %s/%s", op, p50, p99))
					cells = append(cells, fmt.Sprintf("%.0f / %.0f%s", cpMs(p50), cpMs(p99), ratio))
				}
				b.Logf("%-6s %-9s %-12s n=%d/%d  %s", name, load, spacing, len(s[prefix+"create"]), len(s[prefix+"stop"]), strings.Join(line, "  "))
				md.WriteString("| " + strings.Join(cells, " | ") + " |\n")
			}
		}
	}
	b.Logf("p50 / p99 in ms (× the Temporal update baseline's p50, same load and spacing):%s", md.String())
	c.reportPaired(engineNames, loads)
	if c.many > 0 {
		b.ReportMetric(c.manyRate, "many-creates/s")
		b.ReportMetric(cpMs(cpPct(s["many/create"], 50)), "many-create-p50-ms")
		b.ReportMetric(cpMs(cpPct(s["many/create"], 99)), "many-create-p99-ms")
		b.ReportMetric(c.manyDelRate, "many-deletes/s")
	}
	b.ReportMetric(float64(c.wrongVersion.Load()), "wrong-version-outputs")
}

// reportPaired compares each engine with Python (issue 48: "native and
// .NET no slower than Python") call by call: a round runs every engine's
// calls one engine after the other, so the i-th sample of an engine's
// call and the i-th of Python's were taken seconds apart, on the machine
// as it was then. It logs, and reports as metrics, the median of those
// paired differences (engine − Python, ms) with a distribution-free 90 %
// confidence interval (cpMedianCI) and a verdict: "slower" when the whole
// interval is above zero, "faster" when it is below, else "level" (the
// machine's noise, ±10 ms on a p50 here, swamps a difference of two
// medians taken apart).
func (c *cpBench) reportPaired(engineNames, loads []string) {
	if !slices.Contains(engineNames, "python") {
		return
	}
	var md strings.Builder
	md.WriteString(cpTableHead())
	for _, load := range loads {
		for _, spacing := range []string{"back-to-back", "spaced"} {
			for _, name := range engineNames {
				if name == "python" {
					continue
				}
				cells := []string{name, load, spacing}
				for _, op := range cpOps {
					py := c.samples["python/"+load+"/"+spacing+"/"+op]
					en := c.samples[name+"/"+load+"/"+spacing+"/"+op]
					n := min(len(py), len(en))
					if n == 0 {
						cells = append(cells, "")
						continue
					}
					diffs := make([]float64, n)
					for i := range n {
						diffs[i] = cpMs(en[i] - py[i])
					}
					lo, med, hi, ok := cpMedianCI(diffs, 0.90)
					verdict := "level"
					switch {
					case !ok:
						verdict = "too few rounds"
					case lo > 0:
						verdict = "slower"
					case hi < 0:
						verdict = "faster"
					}
					metric := strings.ReplaceAll(name+"-minus-python-"+load+"-"+spacing+"-"+op, "→", "-to-")
					c.b.ReportMetric(med, metric+"-ms")
					cells = append(cells, fmt.Sprintf("%+.1f [%+.0f, %+.0f] %s", med, lo, hi, verdict))
				}
				md.WriteString("| " + strings.Join(cells, " | ") + " |\n")
			}
		}
	}
	c.b.Logf("engine − Python, paired by round: median difference [90%% interval] in ms:%s", md.String())
}

// cpMedianCI is the median of xs and a distribution-free confidence
// interval for it at level (the order statistics whose ranks a binomial
// distribution of p = ½ over len(xs) bounds); the whole range, and ok
// false, when xs are too few for level (fewer than 5 at 90 %).
func cpMedianCI(xs []float64, level float64) (lo, med, hi float64, ok bool) {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		med = s[n/2]
	} else {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	// k: the largest rank with P(X < k) ≤ (1−level)/2, X ~ B(n, ½).
	tail, k := (1-level)/2, 0
	cdf, pmf := 0.0, math.Pow(0.5, float64(n)) // P(X ≤ j), P(X = j)
	for j := 0; j < n/2; j++ {
		cdf += pmf
		if cdf > tail {
			break
		}
		k = j + 1
		pmf = pmf * float64(n-j) / float64(j+1)
	}
	if k == 0 {
		return s[0], med, s[n-1], false
	}
	return s[k-1], med, s[n-k], true
}
