package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// scaleConfig sizes TestManyTopicsSurviveStopStartCycles. make test runs the
// defaults; docs/scaling.md records larger runs made with the variables
// WM_SCALE_WORKERS, WM_SCALE_TOPICS, WM_SCALE_CYCLES, WM_SCALE_ENGINE
// (python or native) and WM_SCALE_RECOVERY=1 (also time a node restart);
// DAPRD_UPSTREAM_REDIS_PUBSUB=1 runs it on upstream's leaking component.
type scaleConfig struct {
	workers, topics, cycles int
	engine                  string
}

func scaleFromEnv(t *testing.T) scaleConfig {
	c := scaleConfig{workers: 300, topics: 300, cycles: 200, engine: "python"}
	for name, p := range map[string]*int{"WM_SCALE_WORKERS": &c.workers, "WM_SCALE_TOPICS": &c.topics, "WM_SCALE_CYCLES": &c.cycles} {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive integer", name, v)
			}
			*p = n
		}
	}
	if v := os.Getenv("WM_SCALE_ENGINE"); v != "" {
		c.engine = v
	}
	if c.topics > c.workers {
		c.topics = c.workers
	}
	return c
}

// redisClients counts the connections Redis has open: all of them, and
// those blocked in (or last used for) XREADGROUP, i.e. topic readers.
func (e *env) redisClients(t *testing.T) (total, readers int) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(e.redisCLI(t, "CLIENT", "LIST")), "\n") {
		if strings.Contains(line, "cmd=client|list") {
			continue // this redis-cli
		}
		total++
		// A reader: its last command XREADGROUP and within its BLOCK
		// bound (2 s) of it. A pooled connection whose last use was a read
		// that ended idles on; it is no reader (it counted as one and
		// failed a CI run: 307 for 302 topics), and the total bound
		// still counts it. A leaked reader keeps reading: still counted.
		if strings.Contains(line, "cmd=xreadgroup") && clientIdle(line) <= 3 {
			readers++
		}
	}
	return total, readers
}

// clientIdle is the idle= field (seconds) of a CLIENT LIST line; -1 when
// it has none.
func clientIdle(line string) int {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "idle="); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}

// Issue 6, done when: several hundred workers on as many topics, at least 200
// stop/start cycles, then a message to every topic gets every answer, and the
// Redis connections stay within the documented bound (docs/scaling.md): one
// reader per subscribed topic (closed subscriptions' readers released), and
// in all no more than the pub/sub pool (topics + 110: about 120 beyond the
// readers for publishes, acks and redelivery scans) plus the state store's.
func TestManyTopicsSurviveStopStartCycles(t *testing.T) {
	inTurn(t) // a stack of its own
	cfg := scaleFromEnv(t)
	// A pool sized like the manifest's rule (topics + 100), not the
	// manifest's 1,100, so that a leak would exhaust it within the test.
	e := newEnvWith(t, envConfig{poolSize: cfg.topics + 100 + 10,
		// NODE_HEARTBEAT=5s (membership 15 s): with the harness's 1 s, the
		// node, busy with 300 workers on a machine kept busy by a soak,
		// missed its heartbeats for 3 s, fenced itself and spent 4 minutes
		// reconciling 300 workers while the test's messages waited
		// (CI-like run under load 1); no node dies here.
		nodeEnv: []string{"RECONCILE_INTERVAL=0", "LOG_LEVEL=info", "NODE_HEARTBEAT=5s"},
		// A lifecycle call may wait its turn behind hundreds of others on
		// a busy machine: this test is about scale, not latency.
		apiEnv:   []string{"WORKMANAGER_OPERATION_TIMEOUT=3m"},
		daprdEnv: []string{"DAPRD_UPSTREAM_REDIS_PUBSUB=" + os.Getenv("DAPRD_UPSTREAM_REDIS_PUBSUB")},
		// Hundreds of lifecycle calls at once: on a server of its own, so
		// that the tests beside it keep their Temporal latency.
		ownTemporal: true})
	run := strings.ToLower(t.Name()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	out := "scale-out-" + run

	var code []byte
	mime := "text/x-python"
	switch cfg.engine {
	case "python":
		code = []byte(fmt.Sprintf("def process(event):\n    return {\"type\": %q, \"data\": {\"topic\": event[\"data\"][\"topic\"]}}\n", out))
	case "native":
		code, mime, out = nativePackage(t, "scale"), "application/x-native-dll", "native-out"
	default:
		t.Fatalf("WM_SCALE_ENGINE=%q: want python or native", cfg.engine)
	}
	outs := e.subscribe(out)

	topics := make([]string, cfg.topics)
	for i := range topics {
		topics[i] = fmt.Sprintf("%s-t%04d", run, i)
	}
	ids := make([]string, cfg.workers)
	t.Logf("before create: node %s", e.nodeMemory(t))
	start := time.Now()
	parallel(t, cfg.workers, 8, func(i int) error {
		// With a request id, as a client should: a create that outlasts
		// the API's operation timeout on a busy machine is asked again
		// and answers with the one worker it made.
		req := &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: code}},
			MimeType: mime, Topic: topics[i%cfg.topics], RequestId: fmt.Sprintf("%s-%d", run, i)}
		var resp *pb.CreateWorkerResponse
		err := untilFinished(func(ctx context.Context) (err error) {
			resp, err = e.client.CreateWorker(ctx, req)
			return err
		})
		if err != nil {
			return fmt.Errorf("CreateWorker %d: %w", i, err)
		}
		ids[i] = resp.GetWorkerId()
		return nil
	})
	t.Logf("created %d %s workers on %d topics in %s", cfg.workers, cfg.engine, cfg.topics, time.Since(start).Round(time.Millisecond))
	total0, readers0 := e.waitReaders(t, cfg.topics+2)
	t.Logf("after create: %d Redis connections, %d topic readers; node %s", total0, readers0, e.nodeMemory(t))

	// Stop/start cycles, each on a worker that is alone on its topic when
	// workers == topics: every stop closes the topic's stream.
	var stopLat, startLat latencies
	start = time.Now()
	parallel(t, cfg.cycles, 8, func(i int) error {
		id := ids[i%cfg.workers]
		for _, op := range []struct {
			name string
			lat  *latencies
			call func(context.Context) error
		}{
			{"StopWorker", &stopLat, func(ctx context.Context) error {
				_, err := e.client.StopWorker(ctx, &pb.StopWorkerRequest{WorkerId: id})
				return err
			}},
			{"StartWorker", &startLat, func(ctx context.Context) error {
				_, err := e.client.StartWorker(ctx, &pb.StartWorkerRequest{WorkerId: id})
				return err
			}},
		} {
			t0 := time.Now()
			if err := untilFinished(op.call); err != nil {
				return fmt.Errorf("cycle %d: %s %s: %w", i, op.name, id, err)
			}
			op.lat.add(time.Since(t0))
		}
		return nil
	})
	t.Logf("%d stop/start cycles in %s; StopWorker %s; StartWorker %s", cfg.cycles, time.Since(start).Round(time.Millisecond), stopLat.summary(), startLat.summary())

	// A cancelled read returns its connection within the 2s block bound.
	total1, readers1 := e.waitReaders(t, cfg.topics+2)
	t.Logf("after cycles: %d Redis connections, %d topic readers (before cycles: %d, %d)", total1, readers1, total0, readers0)
	// The leak this guards against shows in the readers (waitReaders
	// fails when closed subscriptions keep theirs) and in deliveries (an
	// exhausted pool fails every publish: checked below). The total only
	// has to stay within the pool: under a loaded CI machine, bursts of
	// acks, claims and redelivery scans fill the pool (408 of 410 seen
	// twice), and go-redis keeps what it opened, idle.
	pool := cfg.topics + 100 + 10
	if stateConns := 20; total1 > pool+stateConns {
		t.Errorf("%d Redis connections for %d subscribed topics: more than the pub/sub pool (%d) and the state store's %d", total1, cfg.topics+2, pool, stateConns)
	} else if total1 > cfg.topics+2+100 {
		t.Logf("the pub/sub pool filled up during the cycles (%d connections, pool %d): bursts, not a leak (readers back to %d)", total1, pool, readers1)
	}

	// Every topic still delivers, and every worker answers.
	got := map[string]int{}
	var mu sync.Mutex
	done := make(chan struct{})
	want := cfg.workers
	go func() {
		defer close(done)
		for n := 0; n < want; {
			select {
			case ev, ok := <-outs:
				if !ok {
					return
				}
				mu.Lock()
				got[scaleAnswer(ev)]++
				n++
				mu.Unlock()
			case <-time.After(90 * time.Second):
				return
			}
		}
	}()
	for _, topic := range topics {
		e.publish(topic, topic, map[string]any{"topic": topic}, "") // input id = topic
	}
	<-done
	mu.Lock()
	defer mu.Unlock()
	answers := 0
	for _, topic := range topics {
		answers += got[topic]
	}
	perTopic := cfg.workers / cfg.topics
	var missing []string
	for i, topic := range topics {
		n := perTopic
		if i < cfg.workers%cfg.topics {
			n++
		}
		if got[topic] < n {
			missing = append(missing, topic)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d topics unanswered or short (got %d answers of %d); first: %v", len(missing), len(topics), answers, cfg.workers, missing[:min(5, len(missing))])
	}
	total2, readers2 := e.redisClients(t)
	t.Logf("all %d answers; %d Redis connections, %d topic readers; node %s", answers, total2, readers2, e.nodeMemory(t))

	if os.Getenv("WM_SCALE_RECOVERY") == "1" {
		// Time from a node start to /readyz with every worker recovered.
		e.node.Stop(30 * time.Second)
		t0 := time.Now()
		e.startNode()
		t.Logf("node restart: ready with %d workers after %s; node %s", cfg.workers, time.Since(t0).Round(time.Millisecond), e.nodeMemory(t))
	}
}

// scaleAnswer is the topic an answer came from: the Python worker names it;
// the native test worker names its input, whose id is the topic.
func scaleAnswer(ev event.Event) string {
	var d struct {
		Topic string `json:"topic"`
		ID    string `json:"id"`
	}
	_ = ev.DataAs(&d)
	if d.Topic == "" {
		return d.ID
	}
	return d.Topic
}

// waitReaders waits (up to 30s) until Redis has at most want topic readers,
// then returns the connection counts.
//
// A few readers more than want are tolerated (readerSlack): a reader that
// is being replaced at the moment of the count (a subscription closing
// while another opens) was once seen to stay counted for the whole wait,
// one reader over. The leak this guards against is one reader per
// stop/start cycle, hundreds here.
func (e *env) waitReaders(t *testing.T, want int) (total, readers int) {
	t.Helper()
	const readerSlack = 4
	deadline := time.Now().Add(30 * time.Second)
	for {
		total, readers = e.redisClients(t)
		if readers <= want {
			return total, readers
		}
		if time.Now().After(deadline) && readers <= want+readerSlack {
			t.Logf("%d XREADGROUP connections for %d subscribed topics after 30s: within the slack of %d", readers, want, readerSlack)
			return total, readers
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d XREADGROUP connections in Redis for %d subscribed topics: readers of closed subscriptions were not released", readers, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// nodeMemory describes the node's resident memory and its worker
// processes': each child of the node (a sandbox) with all its descendants
// (the sandbox's init and the runner).
func (e *env) nodeMemory(t *testing.T) string {
	pid := e.node.Cmd.Process.Pid
	rss := procKiB(pid, "status", "VmRSS:")
	kids := childrenOf(pid)
	kidsPSS := 0
	for _, c := range kids {
		for _, p := range append([]int{c}, descendants(c)...) {
			kidsPSS += procKiB(p, "smaps_rollup", "Pss:")
		}
	}
	s := fmt.Sprintf("RSS %d MiB", rss/1024)
	if len(kids) > 0 {
		s += fmt.Sprintf("; %d worker processes, PSS %d MiB (%.1f MiB each, with their sandboxes)", len(kids), kidsPSS/1024, float64(kidsPSS)/1024/float64(len(kids)))
	}
	return s
}

// childrenOf lists pid's children (per thread: Go starts them from any).
func childrenOf(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, task := range tasks {
		b, _ := os.ReadFile(task)
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func descendants(pid int) []int {
	var out []int
	for _, c := range childrenOf(pid) {
		out = append(append(out, c), descendants(c)...)
	}
	return out
}

func procKiB(pid int, file, key string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, key) {
			f := strings.Fields(line)
			if len(f) >= 2 {
				n, _ := strconv.Atoi(f[1])
				return n
			}
		}
	}
	return 0
}

// parallel runs f(0..n-1) on width goroutines and fails t on the first error.
// untilFinished calls an idempotent lifecycle operation again while the
// API answers DEADLINE_EXCEEDED (the operation did not finish within its
// timeout on a busy machine, and may still complete), up to 3 times, each
// call with 4 minutes.
func untilFinished(call func(context.Context) error) error {
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		err := call(ctx)
		cancel()
		if status.Code(err) != codes.DeadlineExceeded || try == 3 {
			return err
		}
	}
}

func parallel(t *testing.T, n, width int, f func(i int) error) {
	t.Helper()
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for range width {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for firstErr.Load() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	wg.Wait()
	if err := firstErr.Load(); err != nil {
		t.Fatal(*err)
	}
}

// latencies collects call durations.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

// summary gives p50 and p99, and p50 of the first and last tenth (a slowdown
// over the cycles shows there).
func (l *latencies) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return "no calls"
	}
	p := func(d []time.Duration, q float64) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[int(q*float64(len(s)-1))].Round(time.Millisecond)
	}
	tenth := max(1, len(l.d)/10)
	return fmt.Sprintf("p50 %s p99 %s (first tenth p50 %s, last tenth p50 %s)", p(l.d, .5), p(l.d, .99), p(l.d[:tenth], .5), p(l.d[len(l.d)-tenth:], .5))
}
