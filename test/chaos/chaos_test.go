// Package chaos is WorkManager's fault-injection soak (issue 25, `make
// chaos`): the real stack on loopback (Temporal dev server, Redis with its
// append-only file, N nodes each with its own daprd, the API), a workload
// that publishes and churns lifecycles the whole time, a nemesis that
// kills, pauses and restarts processes and joins and drains nodes on a
// schedule drawn from a seed, and a checker that reads only what a user
// sees — the topics' Redis streams (inputs, outputs, dead letters), the
// API's answers, the nodes' /health, the placement record and each
// daprd's subscriptions — and proves the promises of docs/reliability.md.
//
// It runs only with WM_CHAOS=1; knobs: CHAOS_DURATION (10m), CHAOS_NODES
// (3), CHAOS_SEED (time-based, printed), CHAOS_RATE (events/s per topic,
// 2), CHAOS_TOPICS (2), CHAOS_REPORT (a file to write the report to).
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/placement"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// runConfig is one soak's settings.
type runConfig struct {
	duration  time.Duration
	nodes     int
	seed      int64
	rate      float64 // events per second per topic
	topics    int
	native    bool     // a native worker per topic
	kinds     []string // fault kinds the nemesis deals
	noFencing bool     // WM_TEST_UNSAFE_NO_FENCING on the nodes (the checker's demo)
	// For the demo: pause the node process only (CHAOS_PAUSE=node-only)
	// and make grouped calls last groupSleep ms (CHAOS_GROUP_SLEEP_MS, 15).
	pauseNodeOnly bool
	groupSleep    int
}

func TestChaos(t *testing.T) {
	if os.Getenv("WM_CHAOS") != "1" {
		t.Skip("the fault-injection soak runs with WM_CHAOS=1 (make chaos)")
	}
	cfg := runConfig{
		duration: envDuration("CHAOS_DURATION", 10*time.Minute),
		nodes:    envInt("CHAOS_NODES", 3),
		seed:     time.Now().UnixNano() % 1_000_000,
		rate:     float64(envInt("CHAOS_RATE", 2)),
		topics:   envInt("CHAOS_TOPICS", 2),
		native:   os.Getenv("CHAOS_NATIVE") != "0",
		kinds:    faultKinds,
		// A test-only switch: the nodes skip the fencing-token check on
		// outputs, so that the checker must fail (docs/reliability.md).
		noFencing:     os.Getenv("CHAOS_UNSAFE_NO_FENCING") == "1",
		pauseNodeOnly: os.Getenv("CHAOS_PAUSE") == "node-only",
		groupSleep:    envInt("CHAOS_GROUP_SLEEP_MS", 15),
	}
	if s, err := strconv.ParseInt(os.Getenv("CHAOS_SEED"), 10, 64); err == nil {
		cfg.seed = s
	}
	if f := os.Getenv("CHAOS_FAULTS"); f != "" {
		cfg.kinds = nil
		for _, k := range strings.Split(f, ",") {
			if !slices.Contains(faultKinds, k) {
				t.Fatalf("CHAOS_FAULTS: unknown fault kind %q (kinds: %s)", k, strings.Join(faultKinds, ","))
			}
			cfg.kinds = append(cfg.kinds, k)
		}
	}
	runChaos(t, cfg)
}

// TestChaosShort is the soak's short, fixed version for make test: 2
// minutes, 2 nodes, seed 7, each of the seven kinds of issue 25 once
// (shortKinds; WM_CHAOS_SHORT=1).
func TestChaosShort(t *testing.T) {
	if os.Getenv("WM_CHAOS_SHORT") != "1" {
		t.Skip("the short fault-injection soak runs with WM_CHAOS_SHORT=1")
	}
	runChaos(t, runConfig{duration: 2 * time.Minute, nodes: 2, seed: 7, rate: 2, topics: 2, native: true, kinds: shortKinds, groupSleep: 15})
}

func runChaos(t *testing.T, cfg runConfig) {
	seed, duration, nodes, rate, ntopics := cfg.seed, cfg.duration, cfg.nodes, cfg.rate, cfg.topics
	t.Logf("chaos: duration %s, %d nodes, seed %d (CHAOS_SEED=%d reproduces the fault schedule), %.0f events/s per topic, %d topics, faults %s",
		duration, nodes, seed, seed, rate, ntopics, strings.Join(cfg.kinds, ","))
	var extraEnv []string
	if cfg.noFencing {
		t.Log("chaos: WM_TEST_UNSAFE_NO_FENCING=1 on every node: outputs skip the fencing-token check (the checker must fail)")
		extraEnv = append(extraEnv, "WM_TEST_UNSAFE_NO_FENCING=1")
	}

	c := startCluster(t, nodes, extraEnv...)
	c.pauseNodeOnly = cfg.pauseNodeOnly
	j := newJournal(t.Logf)
	var topics []string
	for i := 1; i <= ntopics; i++ {
		topics = append(topics, fmt.Sprintf("chaos-%d-t%d", seed, i))
	}
	wl := &workload{t: t, c: c, j: j, topics: topics, native: map[string][]byte{}, rate: rate, poison: 0.05, slow: 0.003,
		groupSleep: cfg.groupSleep, rng: rand.New(rand.NewSource(seed + 1))}
	if cfg.native {
		for _, topic := range topics {
			wl.native[topic] = nativePackage(t, topic+"-out", "v1")
		}
	}
	setupCtx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	if err := wl.setup(setupCtx); err != nil {
		cancel()
		t.Fatal(err)
	}
	cancel()
	before := c.nodeFigures("before")

	plan := schedule(seed, duration, nodes, cfg.kinds)
	for _, p := range plan {
		t.Logf("planned: +%s %s node %d for %s", p.at, p.kind, p.target, p.down)
	}
	j.mu.Lock()
	j.t0 = time.Now()
	j.mu.Unlock()
	runCtx, stopRun := context.WithTimeout(context.Background(), duration)
	defer stopRun()
	var wg sync.WaitGroup
	for i, topic := range topics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wl.publishLoop(runCtx, topic, fmt.Sprintf("t%d", i+1), rand.New(rand.NewSource(seed+10+int64(i))))
		}()
	}
	wg.Add(2)
	go func() { defer wg.Done(); wl.churnLoop(runCtx, rand.New(rand.NewSource(seed+2))) }()
	// The nemesis injects its whole plan, also when repairs ran late and
	// the run is over meanwhile: every kind comes up as often as planned.
	go func() { defer wg.Done(); runNemesis(context.Background(), c, j, wl, plan) }()
	<-runCtx.Done()
	end := time.Now()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(8 * time.Minute):
		t.Fatal("the workload or the nemesis did not stop within 8 minutes of the run's end")
	}
	t.Logf("%s run over; nemesis and churn stopped at %s", j.rel(end), j.rel(time.Now()))

	// Convergence: every node healthy and subscribed, the API's states
	// those the journal recorded.
	conv := &invariant{name: "convergence after the nemesis (health, ListWorkers, placement and subscriptions) within 3 min"}
	convStart := time.Now()
	var last string
	for {
		last = c.divergence(j, topics)
		if last == "" {
			break
		}
		if time.Since(convStart) > 3*time.Minute {
			conv.fail("not converged after %s: %s", time.Since(convStart).Round(time.Second), last)
			break
		}
		time.Sleep(2 * time.Second)
	}
	conv.checked = 1
	convTook := time.Since(convStart)
	placed, placedAt := c.placementServed(j, topics)
	// What the API lists as running at convergence: after it, only those
	// workers may produce outputs (servedAfterConvergence).
	convergedAt := time.Now()
	listedRunning, listErr := c.listedRunning()
	// A few inputs after convergence and the bound, on every topic:
	// every worker still attached somewhere answers them, so a worker a
	// node serves though it is not listed running shows (the publishers
	// stopped at the run's end).
	time.Sleep(stopBound + time.Second)
	for i, topic := range topics {
		for range 5 {
			id := fmt.Sprintf("t%d-%06d", i+1, wl.seq.Add(1))
			wl.publish(context.Background(), topic, id, map[string]any{"n": id})
		}
	}
	agree := c.temporalAgreement(j)

	// Drain: wait until every required answer is there (or 4 minutes).
	var v *verdict
	drainStart := time.Now()
	lastPending, progress := int(^uint(0)>>1), time.Now()
	for {
		o, err := observe(c.stack.RedisAddr, topics)
		if err != nil {
			t.Fatalf("reading the streams: %v", err)
		}
		v = check(j, o, topics)
		if v.pending < lastPending {
			lastPending, progress = v.pending, time.Now()
		}
		// Done, or no progress for longer than a redelivery could take.
		if v.pending == 0 || time.Since(drainStart) > 4*time.Minute || time.Since(progress) > 2*settle {
			break
		}
		t.Logf("drain: %d required answers missing", v.pending)
		time.Sleep(5 * time.Second)
	}
	after := c.nodeFigures("after")
	v.invariants = append(v.invariants, conv, placed, agree, leaks(before, after))
	v.addf("%s", placedAt)
	if listErr != nil {
		iv := &invariant{name: "after convergence, outputs only by workers ListWorkers lists as RUNNING"}
		iv.fail("ListWorkers at convergence: %v", listErr)
		v.invariants = append(v.invariants, iv)
	} else if o, err := observe(c.stack.RedisAddr, topics); err != nil {
		t.Fatalf("reading the streams: %v", err)
	} else {
		v.invariants = append(v.invariants, servedAfterConvergence(j, o, topics, listedRunning, convergedAt))
	}
	if evs, err := readStream(c.stack.RedisAddr, lifecycleevents.Topic); err != nil {
		iv := &invariant{name: "every lifecycle call answered OK has its event on " + lifecycleevents.Topic}
		iv.fail("reading %s: %v", lifecycleevents.Topic, err)
		v.invariants = append(v.invariants, iv)
	} else {
		iv, line := lifecycleAnnounced(j, evs)
		v.invariants = append(v.invariants, iv)
		v.addf("%s", line)
	}

	// The report.
	var r strings.Builder
	fmt.Fprintf(&r, "CHAOS REPORT seed=%d duration=%s nodes=%d topics=%d rate=%.0f/s/topic\n", seed, duration, nodes, ntopics, rate)
	j.mu.Lock()
	kinds := map[string]int{}
	failedFaults := 0
	for _, f := range j.faults {
		kinds[f.Kind]++
		if f.Err != "" {
			failedFaults++
		}
	}
	nw := len(j.workers)
	apiErr := fmt.Sprint(j.apiErrors)
	injected := len(j.faults)
	j.mu.Unlock()
	fmt.Fprintf(&r, "faults injected: %d of %d planned (", injected, len(plan))
	for _, k := range cfg.kinds {
		fmt.Fprintf(&r, " %s=%d", k, kinds[k])
	}
	fmt.Fprintf(&r, " ); repairs that failed: %d\n", failedFaults)
	if cfg.noFencing {
		fmt.Fprintf(&r, "WM_TEST_UNSAFE_NO_FENCING=1: the nodes skipped the fencing-token check on outputs\n")
	}
	fmt.Fprintf(&r, "workers: %d (incl. short-lived); API call errors (retried): %s\n", nw, apiErr)
	for _, l := range v.lines {
		fmt.Fprintf(&r, "%s\n", l)
	}
	fmt.Fprintf(&r, "converged %s after the nemesis stopped; drain took %s\n", convTook.Round(time.Second), time.Since(drainStart).Round(time.Second))
	fmt.Fprintf(&r, "nodes before: %s\nnodes after:  %s\n", before, after)
	if l := c.keepSlowHistories(j); l != "" {
		fmt.Fprintf(&r, "%s\n", l)
	}
	for _, iv := range v.invariants {
		res := "PASS"
		switch {
		case len(iv.failures) > 0 && iv.warn:
			res = fmt.Sprintf("WARN (%d cases; first: %s)", len(iv.failures), iv.failures[0])
		case len(iv.failures) > 0:
			res = fmt.Sprintf("FAIL (%d counter-examples; first: %s)", len(iv.failures), iv.failures[0])
		}
		fmt.Fprintf(&r, "[%s] %s (%d checked)\n", res, iv.name, iv.checked)
	}
	t.Log("\n" + r.String())
	if path := os.Getenv("CHAOS_REPORT"); path != "" {
		_ = os.WriteFile(path, []byte(r.String()), 0o644)
	}
	// Every counter-example, in a file kept with the stack's logs.
	var all strings.Builder
	all.WriteString(r.String())
	for _, iv := range v.invariants {
		for _, f := range iv.failures {
			fmt.Fprintf(&all, "counter-example [%s]: %s\n", iv.name, f)
		}
	}
	_ = os.WriteFile(filepath.Join(c.dir, "chaos-report.log"), []byte(all.String()), 0o644)
	for _, iv := range v.invariants {
		for i, f := range iv.failures {
			if i >= 20 {
				t.Logf("... %d more for %q", len(iv.failures)-20, iv.name)
				break
			}
			t.Logf("counter-example [%s]: %s", iv.name, f)
		}
	}
	j.mu.Lock()
	for _, f := range j.faults {
		t.Logf("fault %s %s %s–%s %s %s", f.Kind, f.Target, j.rel(f.Start), j.rel(f.End), f.Note, f.Err)
	}
	j.mu.Unlock()
	if !v.ok() {
		t.Fatal("chaos: invariants violated (see the report)")
	}
}

// divergence is "" when the cluster agrees with the journal: every node is
// Healthy, placement has converged (placementDivergence: each topic with
// running workers placed on its replicas, exactly their daprds subscribed
// to it; with replicas at least the nodes, every node's daprd subscribes
// to every such topic), and ListWorkers shows each worker in the state
// last answered.
func (c *cluster) divergence(j *journal, topics []string) string {
	for _, n := range c.nodes {
		if h := n.health(); h != "Healthy" {
			return fmt.Sprintf("node %s /health: %s", n.id, h)
		}
	}
	if d := c.placementDivergence(j, topics); d != "" {
		return d
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := c.client.ListWorkers(ctx, &pb.ListWorkersRequest{})
	if err != nil {
		return "ListWorkers: " + err.Error()
	}
	listed := map[string]pb.WorkerStatus{}
	for _, w := range l.GetWorkers() {
		listed[w.GetWorkerId()] = w.GetStatus()
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for id, w := range j.workers {
		got, ok := listed[id]
		switch w.current() {
		case running:
			if got != pb.WorkerStatus_WORKER_STATUS_RUNNING {
				return fmt.Sprintf("%s answered running, listed %v (present %v)", idOf(w), got, ok)
			}
		case stopped:
			if got != pb.WorkerStatus_WORKER_STATUS_STOPPED {
				return fmt.Sprintf("%s answered stopped, listed %v (present %v)", idOf(w), got, ok)
			}
		case deleted:
			if ok {
				return fmt.Sprintf("%s answered deleted, still listed %v", idOf(w), got)
			}
		}
	}
	return ""
}

// listedRunning is the set of worker ids ListWorkers lists as RUNNING.
func (c *cluster) listedRunning() (map[string]bool, error) {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		out := map[string]bool{}
		tok := ""
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var l *pb.ListWorkersResponse
			l, err = c.client.ListWorkers(ctx, &pb.ListWorkersRequest{PageToken: tok})
			cancel()
			if err != nil {
				break
			}
			for _, w := range l.GetWorkers() {
				if w.GetStatus() == pb.WorkerStatus_WORKER_STATUS_RUNNING {
					out[w.GetWorkerId()] = true
				}
			}
			if tok = l.GetNextPageToken(); tok == "" {
				return out, nil
			}
		}
		time.Sleep(2 * time.Second)
	}
	return nil, err
}

func subscriptions(httpAddr string) (map[string]bool, error) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + httpAddr + "/v1.0/metadata")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var md struct {
		Subscriptions []struct {
			Topic string `json:"topic"`
		} `json:"subscriptions"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&md); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, s := range md.Subscriptions {
		out[s.Topic] = true
	}
	return out, nil
}

// nodeFig is one node's anonymous resident memory (kB, RssAnon: the
// node's binary and libraries paged in are not counted), live Go heap (kB, soon
// after two collections) and goroutines (from its /metrics), the workers
// it had attached (its placement advertisement) and its child processes
// (a worker's runner or host, a spare: each has goroutinesPerChild of the
// node's waiting on it while it lives); -1 when unknown.
type nodeFig struct {
	id                  string
	pid                 int
	rssKB, heapKB, gors int64
	// keptKB is the heap memory the Go runtime holds and keeps for reuse
	// rather than for live objects (HeapSys − HeapReleased − HeapAlloc,
	// right after a collection): resident, anonymous, not a leak; -1 when
	// unknown.
	keptKB   int64
	workers  int
	children int64
	// childGors counts the goroutines whose stacks wait on a child
	// process (childWaiters, from the node's goroutine dump); -1 when
	// unknown, then children × goroutinesPerChild stand for them.
	childGors int64
}

// goroutinesPerChild is what a child process (engines/internal/childproc)
// holds of the node's goroutines: its wait and a reader for each of its
// stdout and stderr. The goroutine bound counts the node's own: a node
// after a backlog still runs the extra processes its workers grew
// (retired when idle), and their goroutines are theirs, not a leak.
const goroutinesPerChild = 3

// ownGoroutines is f's goroutines less those its child processes hold:
// counted in its goroutine dump when known, else goroutinesPerChild for
// each of its direct children — which misses the workers a Python fork
// server forked (children of that server, each with the node's goroutines
// waiting on it: seed 644196, a node restarted with 14 of them).
func (f nodeFig) ownGoroutines() int64 {
	if f.childGors >= 0 {
		return f.gors - f.childGors
	}
	return f.gors - goroutinesPerChild*max(f.children, 0)
}

// childWaiters counts, in a goroutine dump (debug=1: "N @ …" then the
// frames of N goroutines with that stack), the goroutines whose stacks
// wait on a child process: engines/internal/childproc's, os/exec's.
func childWaiters(dump []byte) int64 {
	var total, n int64
	waits := false
	flush := func() {
		if waits {
			total += n
		}
		n, waits = 0, false
	}
	for _, l := range strings.Split(string(dump), "\n") {
		if c, _, ok := strings.Cut(l, " @ "); ok && !strings.HasPrefix(l, "#") {
			flush()
			n, _ = strconv.ParseInt(c, 10, 64)
			continue
		}
		if strings.Contains(l, "/engines/internal/childproc.") || strings.Contains(l, "os/exec.(*Cmd)") {
			waits = true
		}
	}
	flush()
	return total
}

// childrenOf counts the processes whose parent is pid (-1 when /proc
// cannot be read).
func childrenOf(pid int) int64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	var n int64
	want := "PPid:\t" + strconv.Itoa(pid) + "\n"
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/status"); err == nil && strings.Contains(string(b), want) {
			n++
		}
	}
	return n
}

type figures []nodeFig

func (fs figures) String() string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, fmt.Sprintf("%s(pid %d) anonymous rss %dkB (free heap kept %dkB) live heap %dkB goroutines %d workers %d child processes %d", f.id, f.pid, f.rssKB, f.keptKB, f.heapKB, f.gors, f.workers, f.children))
	}
	return strings.Join(parts, "; ")
}

// nodeFigures is each node's resident memory, live heap and goroutines,
// for the leak bound. Each node's heap profile (taken after the second of
// two collections, DEBUG_PPROF) is written to heap-<node>-<label>.pb.gz in
// the stack's directory, kept with the logs (go tool pprof -diff_base
// compares two), and its goroutines by stack to
// goroutines-<node>-<label>.txt.
func (c *cluster) nodeFigures(label string) figures {
	var out figures
	cl := http.Client{Timeout: 30 * time.Second}
	childGors := map[string]int64{}
	for _, n := range c.nodes {
		// Two collections: what sync.Pools hold (gRPC's buffers after a
		// backlog: most of what grew in the 60-minute run) survives the
		// first as their victim cache and is freed by the second.
		var profile []byte
		for range 2 {
			if resp, err := cl.Get("http://" + n.httpAddr + "/debug/pprof/heap?gc=1"); err == nil {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					profile = b
				}
			}
		}
		if profile != nil {
			_ = os.WriteFile(filepath.Join(c.dir, fmt.Sprintf("heap-%s-%s.pb.gz", n.id, label)), profile, 0o644)
		}
		// And its goroutines, by stack (what a goroutine bound that
		// fails counts).
		if resp, err := cl.Get("http://" + n.httpAddr + "/debug/pprof/goroutine?debug=1"); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				_ = os.WriteFile(filepath.Join(c.dir, fmt.Sprintf("goroutines-%s-%s.txt", n.id, label)), b, 0o644)
				childGors[n.id] = childWaiters(b)
			}
		}
	}
	// After the collections, a few seconds for the runtime's scavenger to
	// give freed memory back before RSS is read.
	time.Sleep(10 * time.Second)
	for _, n := range c.nodes {
		c.mu.Lock()
		pid := n.proc.Cmd.Process.Pid
		c.mu.Unlock()
		f := nodeFig{id: n.id, pid: pid, rssKB: -1, heapKB: -1, gors: -1, keptKB: -1, workers: -1, children: childrenOf(pid), childGors: -1}
		if cg, ok := childGors[n.id]; ok {
			f.childGors = cg
		}
		var info placement.NodeInfo
		if ok, err := readStateKey(c.stack.RedisAddr, placement.NodeInfoPrefix+n.id, &info); err == nil && ok {
			f.workers = info.Workers
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				// RssAnon, not VmRSS: half of an idle node's VmRSS is its
				// 40 MB binary's pages (RssFile 31 of 57 MB on make run),
				// and a run that reaches more of its code pages more of
				// them in (a soak failed at 2.03× VmRSS with its live heap
				// 1.09×). A leak of the node's or of a native worker's
				// memory is anonymous. The free heap the Go runtime keeps
				// (keptKB) is taken off it in leaks: a node that worked
				// through a backlog keeps more (the next soak failed at
				// 2.3× RssAnon, 45 MB against 19, live heap 1.01×).
				if fs := strings.Fields(l); len(fs) >= 2 && fs[0] == "RssAnon:" {
					f.rssKB, _ = strconv.ParseInt(fs[1], 10, 64)
				}
			}
		}
		// Read soon after the profiles' collections on an idle node:
		// heap_alloc is then the live heap (and what little was allocated
		// since).
		if resp, err := cl.Get("http://" + n.httpAddr + "/metrics"); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
			resp.Body.Close()
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "go_goroutines "); ok {
					f.gors, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				}
				if v, ok := strings.CutPrefix(l, "go_memstats_heap_alloc_bytes "); ok {
					if x, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
						f.heapKB = int64(x / 1024)
					}
				}
			}
		}
		// Better: the heap right after a collection the read itself asks
		// for. The node is not idle any more (placement rounds, its view
		// of the record, its advertisement every heartbeat allocate), so
		// heap_alloc read a few seconds after the profiles' collection
		// counted 4–5 MB of garbage as live (make test, issue 45).
		if resp, err := cl.Get("http://" + n.httpAddr + "/debug/pprof/heap?gc=1&debug=1"); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
			resp.Body.Close()
			ms := map[string]int64{}
			for _, l := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(strings.TrimPrefix(l, "# "), " = "); ok && strings.HasPrefix(l, "# Heap") {
					if x, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
						ms[k] = x
					}
				}
			}
			if x, ok := ms["HeapAlloc"]; ok {
				f.heapKB = x / 1024
				sys, ok1 := ms["HeapSys"]
				rel, ok2 := ms["HeapReleased"]
				if ok1 && ok2 && sys-rel >= x {
					f.keptKB = (sys - rel - x) / 1024
				}
			}
		}
		out = append(out, f)
	}
	return out
}

// leaks is the no-leak invariant: after the run and its drain, each node
// holds at most leakGoroutines more goroutines, leakHeap times the live
// heap and leakRSS times the anonymous resident memory it had before the run. A node
// restarted during the run is a new process compared with its
// predecessor's figures: its leaks count from its restart on. Under
// placement a node's share moves (a node serving two topics runs twice
// the workers, and their goroutines, of one serving one): a node whose
// attached workers differ from its own before the run is compared with the
// figures before the run of a node that had as many workers attached then
// (the same binary and settings serving the same share), or with its own
// when none had.
func leaks(before, after figures) *invariant {
	iv := &invariant{name: fmt.Sprintf("no leak (each node's goroutines at most +%d, live Go heap at most %.1f× and anonymous RSS, less the free heap Go keeps, at most %.1f× their level before the run, "+
		"against a node with as many workers attached then when its share moved)", leakGoroutines, leakHeap, leakRSS)}
	for i, a := range after {
		if i >= len(before) {
			break
		}
		b := before[i]
		if a.workers >= 0 && b.workers >= 0 && a.workers != b.workers {
			for _, o := range before {
				if o.workers == a.workers {
					b = o
					break
				}
			}
		}
		of := ""
		if b.id != a.id {
			of = fmt.Sprintf(" (compared with %s's figures before the run: %d workers attached, as %s has now)", b.id, b.workers, a.id)
		} else if a.workers != b.workers {
			of = fmt.Sprintf(" (%d workers attached after, %d before; no node had %d before)", a.workers, b.workers, a.workers)
		}
		iv.checked++
		switch {
		case a.gors < 0 || a.rssKB < 0 || a.heapKB < 0 || b.gors < 0 || b.rssKB < 0 || b.heapKB < 0:
			iv.fail("%s: figures unknown (before %+v, after %+v)", a.id, b, a)
		case a.ownGoroutines() > b.ownGoroutines()+leakGoroutines:
			iv.fail("%s: %d goroutines after the run, %d before%s (%d and %d of them waiting on child processes)", a.id, a.gors, b.gors, of,
				a.gors-a.ownGoroutines(), b.gors-b.ownGoroutines())
		case float64(a.heapKB) > leakHeap*float64(b.heapKB):
			iv.fail("%s: live Go heap %d kB after the run, %d kB before%s (heap profiles heap-%s-before/after.pb.gz with the logs)", a.id, a.heapKB, b.heapKB, of, a.id)
		case float64(a.rssKB-max(a.keptKB, 0)) > leakRSS*float64(b.rssKB-max(b.keptKB, 0)):
			iv.fail("%s: anonymous RSS %d kB after the run, %d kB before%s, less the free heap Go keeps (%d and %d kB) (live Go heap %d kB after, %d kB before)",
				a.id, a.rssKB, b.rssKB, of, max(a.keptKB, 0), max(b.keptKB, 0), a.heapKB, b.heapKB)
		}
	}
	return iv
}
