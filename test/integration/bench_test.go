package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// BenchmarkEndToEnd measures, through the real daprd and Redis in one run,
// messages/s (saturated) and publish→output latency (paced) of
//   - bare:      a Go subscriber on the same daprd that republishes each
//     event (8 in flight), a process of its own like the node: the
//     transport's ceiling, the baseline;
//   - bare-inproc: the same subscriber inside the benchmark process (off by
//     default: it shares the load generator's busy runtime, which hides the
//     cost of waking an idle process);
//   - ungrouped: a Python echo worker with the delivery guarantees;
//   - native:    a native (C, in process) echo worker, no group;
//   - grouped:   the same worker in a group (uncontended lock);
//   - grouped-pair: two such workers of one group on the event's topic,
//     both answering every event, never at once (the group's lock): its
//     msg/s counts their calls (outputs), two per event;
//
// in alternating rounds, each mode's round between two bare rounds (its
// "%-of-adjacent-bare": against their mean; WM_BENCH_PAIRED=0: one bare
// round a round), and the state-store round trips per message on the
// success path (Redis commands of the state component, counted by Redis).
// Run it with `make bench` (-benchtime 1x: each b.N iteration is a full
// comparison).
func BenchmarkEndToEnd(b *testing.B) {
	// WM_BENCH_NODE_ENV adds settings to the node (space-separated
	// KEY=VALUE), e.g. to compare PYTHON_SPIN_WAIT values.
	e := newEnvWith(b, envConfig{nodeEnv: strings.Fields(os.Getenv("WM_BENCH_NODE_ENV"))})
	n := envInt("WM_BENCH_MESSAGES", 6000)
	rounds := envInt("WM_BENCH_ROUNDS", 3)
	payload := strings.Repeat("x", 1000)
	type result struct {
		rate     []float64
		p50, p99 []time.Duration
		stateOps []float64
		cpu      []map[string]float64 // µs of CPU per message, by process
	}
	// grouped-2nodes (one group served by two nodes) runs last: a second
	// node joins the cluster for it, and stays.
	modes := []string{"bare", "ungrouped", "native", "wasm", "grouped", "grouped-pair", "grouped-native", "keyed", "keyed-native", "slow", "dotnet", "grouped-2nodes"}
	if m := os.Getenv("WM_BENCH_MODES"); m != "" { // e.g. "bare,native"
		modes = strings.Split(m, ",")
		known := []string{"bare", "bare-inproc", "ungrouped", "native", "wasm", "grouped", "grouped-pair", "grouped-native", "keyed", "keyed-native", "slow", "dotnet", "grouped-2nodes"}
		for _, mode := range modes {
			if !slices.Contains(known, mode) {
				b.Fatalf("WM_BENCH_MODES: unknown mode %q (%s)", mode, strings.Join(known, ", "))
			}
		}
	}
	res := map[string]*result{}
	for _, m := range modes {
		res[m] = &result{}
	}
	two := slices.Contains(modes, "grouped-2nodes")
	if two {
		modes = append(slices.DeleteFunc(modes, func(m string) bool { return m == "grouped-2nodes" }), "grouped-2nodes")
	}
	var nodeB *extraNode
	measure := func(r int, mode string) float64 {
		in, out := fmt.Sprintf("bench-%s-%d-in-%d", mode, r, time.Now().UnixNano()), fmt.Sprintf("bench-%s-%d-out-%d", mode, r, time.Now().UnixNano())
		consumer, stop := e.benchTarget(b, mode, in, out)
		outs, closeOuts := e.subscribeClosable(out)
		nodes := []string{e.nodeURL}
		if nodeB != nil {
			nodes = append(nodes, nodeB.url())
		}
		back0, full0 := givenBack(b, nodes)
		rewrites0 := e.redisInfo(b, "persistence", "aof_rewrites")
		ops0, cpu0 := e.redisStateOps(b), e.cpuByProcess(b, consumer)
		k := 1 // outputs per event
		if mode == "grouped-pair" {
			k = 2
		}
		rate := e.saturate(b, in, outs, n, k, payload, benchAttrs(mode))
		ops, cpu := float64(e.redisStateOps(b)-ops0)/float64(n), e.cpuByProcess(b, consumer)
		back, full := givenBack(b, nodes)
		rewrites := e.redisInfo(b, "persistence", "aof_rewrites") - rewrites0
		perMsg := map[string]float64{}
		for k, v := range cpu {
			perMsg[k] = float64((v - cpu0[k]).Microseconds()) / float64(n)
		}
		p50, p99 := e.paced(b, in, outs, 300, 100, k, benchAttrs(mode))
		stop()
		// The round's streams go: what they hold is read, and a Redis
		// that kept every round's (hundreds of MiB by the end of a run)
		// rewrote its append-only file at fork-and-copy cost in the
		// middle of later rounds (docs/performance.md).
		closeOuts()
		if removed := strings.TrimSpace(e.redisCLI(b, "DEL", in, out)); removed != "2" {
			b.Logf("round %d %s: DEL of its two streams removed %s", r, mode, removed)
		}
		x := res[mode]
		x.rate, x.p50, x.p99, x.stateOps = append(x.rate, rate), append(x.p50, p50), append(x.p99, p99), append(x.stateOps, ops)
		x.cpu = append(x.cpu, perMsg)
		b.Logf("round %d %-14s %7.0f msg/s  p50 %-10s p99 %-10s state ops/msg %.2f  CPU µs/msg: daprd %.0f, consumer %.0f, redis %.0f, test %.0f  given back while saturated %.0f (queue full %.0f)  Redis: %d AOF rewrites, %d MiB",
			r, mode, rate, p50, p99, ops, perMsg["daprd"], perMsg["consumer"], perMsg["redis"], perMsg["test"], back-back0, full-full0,
			rewrites, e.redisInfo(b, "memory", "used_memory")>>20)
		return rate
	}
	// Paired (WM_BENCH_PAIRED, on unless "0"; needs "bare" among the
	// modes): a bare round before every other mode's round and after it,
	// each mode's rate set against the mean of the two. This VM's speed
	// moves by half within a minute (the same bare round at 911 and 1,667
	// msg/s, daprd's CPU a message with it), so a mode measured late in a
	// round was compared with a bare measured a minute earlier; a pair
	// compares what ran seconds apart (docs/performance.md).
	paired := os.Getenv("WM_BENCH_PAIRED") != "0" && slices.Contains(modes, "bare")
	adjacent := map[string][]float64{} // per mode, each round's rate / its neighbours' mean
	runRound := func(r int, ms []string) {
		if !paired {
			for _, mode := range ms {
				measure(r, mode)
			}
			return
		}
		before := measure(r, "bare")
		for _, mode := range ms {
			if mode == "bare" {
				continue
			}
			rate := measure(r, mode)
			after := measure(r, "bare")
			adjacent[mode] = append(adjacent[mode], rate/((before+after)/2))
			before = after
		}
	}
	// A round of the bare subscriber first, not counted: the first
	// saturation of a fresh stack (daprd's and Redis's first streams, the
	// publishers' connections) ran at 62-95 % of the rounds after it
	// (docs/performance.md), which made every ratio to bare look better
	// than it was.
	if slices.Contains(modes, "bare") {
		in, out := fmt.Sprintf("bench-warmup-in-%d", time.Now().UnixNano()), fmt.Sprintf("bench-warmup-out-%d", time.Now().UnixNano())
		_, stop := e.benchTarget(b, "bare", in, out)
		rate := e.saturate(b, in, e.subscribe(out), n, 1, payload, benchAttrs("bare"))
		stop()
		b.Logf("warm-up (not counted): bare %7.0f msg/s", rate)
	}
	// grouped-2nodes runs below, once every other mode is measured.
	oneNode := slices.DeleteFunc(slices.Clone(modes), func(m string) bool { return m == "grouped-2nodes" })
	for range b.N {
		for r := range rounds {
			runRound(r, oneNode)
		}
		if two {
			// A second node (its own daprd, the same Redis and Temporal)
			// serves the group's topic too: both take the group's lock.
			// CPU figures are the first node's.
			if nodeB == nil {
				nodeB = e.startExtraNode(b, "bench-b")
			}
			for r := range rounds {
				runRound(r, []string{"grouped-2nodes"})
			}
		}
	}
	mean := func(v []float64) float64 {
		s := 0.0
		for _, x := range v {
			s += x
		}
		return s / float64(len(v))
	}
	med := func(v []time.Duration) time.Duration {
		s := append([]time.Duration(nil), v...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[len(s)/2]
	}
	bare := 0.0
	if x := res["bare"]; x != nil {
		bare = mean(x.rate)
	}
	for _, mode := range modes {

		x := res[mode]
		b.ReportMetric(mean(x.rate), mode+"-msg/s")
		b.ReportMetric(float64(med(x.p50).Microseconds())/1000, mode+"-p50-ms")
		b.ReportMetric(float64(med(x.p99).Microseconds())/1000, mode+"-p99-ms")
		b.ReportMetric(mean(x.stateOps), mode+"-stateops/msg")
		for _, p := range []string{"daprd", "consumer"} {
			var v []float64
			for _, c := range x.cpu {
				v = append(v, c[p])
			}
			b.ReportMetric(mean(v), mode+"-"+p+"-cpu-µs/msg")
		}
		if mode != "bare" && bare > 0 {
			b.ReportMetric(100*mean(x.rate)/bare, mode+"-%-of-bare")
		}
		if v := adjacent[mode]; len(v) > 0 {
			b.ReportMetric(100*mean(v), mode+"-%-of-adjacent-bare")
		}
	}
}

// benchTarget sets up what consumes in and answers on out: it returns the
// pid of the consuming process (0: this one) and how to tear it down.
func (e *env) benchTarget(b *testing.B, mode, in, out string) (int, func()) {
	b.Helper()
	switch mode {
	case "bare":
		return e.bareProcess(b, in, out)
	case "bare-inproc":
		wait, err := republish(context.Background(), e.dapr, in, out)
		if err != nil {
			b.Fatal(err)
		}
		return 0, wait
	}
	req := &pb.CreateWorkerRequest{Topic: in}
	switch mode {
	case "grouped", "grouped-pair", "grouped-native", "keyed", "keyed-native", "grouped-2nodes":
		// One group; "keyed", "keyed-native": 64 keys of it (benchAttrs),
		// run in parallel.
		req.Group = "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		if strings.HasPrefix(mode, "keyed") {
			req.GroupKey = "subject"
		}
	}
	switch mode {
	case "native", "grouped-native", "keyed-native":
		req.MimeType = "application/x-native-dll"
		req.Code = &pb.CodeSource{Source: &pb.CodeSource_Content{Content: nativePackageOf(b, "bench_echo.c", fmt.Sprintf(`-DOUT_TYPE="%s"`, out))}}
	case "wasm":
		req.MimeType = "application/wasm"
		req.Code = &pb.CodeSource{Source: &pb.CodeSource_Content{Content: wasmC(b, out, "ECHO")}}
	case "dotnet":
		req.MimeType = "text/x-csharp"
		req.Code = pyCode(csharpWorker(out, "bench"))
	case "slow":
		// A worker that waits 30 ms per event (a gateway call, I/O): what
		// overlapping its events (async def, max_concurrency) buys.
		req.MimeType = "text/x-python"
		req.Code = pyCode([]byte(fmt.Sprintf("import asyncio\n\nasync def process(event):\n    await asyncio.sleep(0.03)\n    return {\"type\": %q, \"data\": event.get(\"data\")}\n", out)))
	default:
		req.MimeType = "text/x-python"
		req.Code = pyCode([]byte(fmt.Sprintf("def process(event):\n    return {\"type\": %q, \"data\": event.get(\"data\")}\n", out)))
	}
	workers := 1
	if mode == "grouped-pair" {
		workers = 2
	}
	var ids []string
	for range workers {
		resp, err := e.client.CreateWorker(ctxT(b), req)
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, resp.GetWorkerId())
	}
	return e.node.Cmd.Process.Pid, func() {
		for _, id := range ids {
			if _, err := e.client.DeleteWorker(ctxT(b), &pb.DeleteWorkerRequest{WorkerId: id}); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// benchAttrs adds the attributes a mode's events carry: "keyed" and
// "keyed-native" spread them over 64 subjects (its group's keys); nil for
// the others.
func benchAttrs(mode string) func(i int, ce map[string]any) {
	if !strings.HasPrefix(mode, "keyed") {
		return nil
	}
	return func(i int, ce map[string]any) { ce["subject"] = "k" + strconv.Itoa(i%64) }
}

// saturate publishes n events from 16 publishers as fast as daprd takes
// them and returns outputs/s until all k×n outputs arrived (k per event);
// attrs, when set, adds attributes to event i.
func (e *env) saturate(b *testing.B, in string, outs <-chan event.Event, n, k int, payload string, attrs func(int, map[string]any)) float64 {
	b.Helper()
	start := time.Now()
	var wg sync.WaitGroup
	for p := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < n; i += 16 {
				ce := map[string]any{"id": "s" + strconv.Itoa(i), "type": "bench.input", "datacontenttype": "application/json",
					"data": map[string]any{"p": payload}}
				if attrs != nil {
					attrs(i, ce)
				}
				e.publishEvent(in, ce)
			}
		}()
	}
	for got := 0; got < k*n; got++ {
		select {
		case <-outs:
		case <-time.After(time.Minute):
			b.Fatalf("%d of %d outputs", got, k*n)
		}
	}
	d := time.Since(start)
	wg.Wait()
	return float64(k*n) / d.Seconds()
}

// paced publishes n events at rate/s and returns the p50 and p99 from
// publish to output, over the k outputs of every event (k and attrs as for
// saturate).
func (e *env) paced(b *testing.B, in string, outs <-chan event.Event, n, rate, k int, attrs func(int, map[string]any)) (time.Duration, time.Duration) {
	b.Helper()
	sent := make([]time.Time, n)
	var mu sync.Mutex
	done := make(chan []time.Duration)
	go func() {
		var ds []time.Duration
		for len(ds) < k*n {
			select {
			case ev := <-outs:
				if i, ok := pacedIndex(ev); ok && i < n {
					mu.Lock()
					ds = append(ds, time.Since(sent[i]))
					mu.Unlock()
				}
			case <-time.After(time.Minute):
				done <- nil
				return
			}
		}
		done <- ds
	}()
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
			time.Sleep(d)
		}
		mu.Lock()
		sent[i] = time.Now()
		mu.Unlock()
		ce := map[string]any{"id": "p" + strconv.Itoa(i), "type": "bench.input", "datacontenttype": "application/json",
			"data": map[string]any{"n": i}}
		if attrs != nil {
			attrs(i, ce)
		}
		e.publishEvent(in, ce)
	}
	ds := <-done
	if len(ds) < k*n {
		b.Fatalf("%d of %d paced outputs", len(ds), k*n)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], ds[len(ds)*99/100]
}

// pacedIndex is the index of the paced input an output answers: from its
// id ("p<i>/…", the node's default output id), or, for a worker that
// names its outputs itself (the .NET DevKit), from its data ({"n": i} or
// {"input": {"n": i}}: the echo workers' and csharpWorker's).
func pacedIndex(ev event.Event) (int, bool) {
	if id := strings.SplitN(ev.ID(), "/", 2)[0]; strings.HasPrefix(id, "p") {
		if i, err := strconv.Atoi(strings.TrimPrefix(id, "p")); err == nil {
			return i, true
		}
	}
	var d struct {
		N     *int `json:"n"`
		Input struct {
			N *int `json:"n"`
		} `json:"input"`
	}
	if json.Unmarshal(ev.Data(), &d) != nil {
		return 0, false
	}
	switch {
	case d.N != nil:
		return *d.N, true
	case d.Input.N != nil:
		return *d.Input.N, true
	}
	return 0, false
}

// cpuByProcess is the CPU time used so far by daprd, the consumer (the
// node with its worker processes, or the bare subscriber's process), Redis
// and this test process (publishers, the output subscriber, and the
// bare-inproc subscriber).
func (e *env) cpuByProcess(b *testing.B, consumer int) map[string]time.Duration {
	b.Helper()
	var c time.Duration
	if consumer != 0 {
		c = devstack.ProcessCPU(consumer)
	}
	return map[string]time.Duration{
		"daprd":    devstack.ProcessCPU(e.stack.DaprdPID()),
		"consumer": c,
		"redis":    devstack.ProcessCPU(e.stack.RedisPID()),
		"test":     devstack.SelfCPU(),
	}
}

// redisInfo is one integer field of a section of Redis's INFO (0 when
// absent).
func (e *env) redisInfo(b *testing.B, section, field string) int64 {
	b.Helper()
	for _, line := range strings.Split(e.redisCLI(b, "INFO", section), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			v, _ := strconv.ParseInt(rest, 10, 64)
			return v
		}
	}
	return 0
}

// redisStateOps counts the Redis commands the state component issues so
// far (HGETALL for a get; EVAL/EVALSHA, the ETag-checked set; DEL).
func (e *env) redisStateOps(b *testing.B) int64 {
	b.Helper()
	var total int64
	for _, line := range strings.Split(e.redisCLI(b, "INFO", "commandstats"), "\n") {
		for _, cmd := range []string{"cmdstat_hgetall:", "cmdstat_eval:", "cmdstat_evalsha:", "cmdstat_del:"} {
			if rest, ok := strings.CutPrefix(line, cmd+"calls="); ok {
				v, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
				total += v
			}
		}
	}
	return total
}

// givenBack sums, over the nodes at urls, the messages answered RETRY
// (given back to the broker, which redelivers them after its processing
// timeout) and, of those, the ones given back because a worker's queue
// stayed full for WORKER_QUEUE_WAIT: a saturated round that waited out a
// redelivery shows here.
func givenBack(b *testing.B, urls []string) (retried, queueFull float64) {
	b.Helper()
	for _, u := range urls {
		fams := scrapeURL(b, u)
		retried += max(0, sampleValue(fams, "workmanager_message_handling_seconds", map[string]string{"status": "retry"}))
		queueFull += max(0, sampleValue(fams, "workmanager_worker_queue_rejections_total", nil))
	}
	return retried, queueFull
}
