package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/infraevents"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// loggingWorker is Python code that appends one JSON line per call to
// logPath (worker name, event id, entry and exit times, fencing token),
// fails on inputs whose data has "poison" when poison is set, and answers
// with one event on outTopic. An input's data may hold the call: "until_file"
// (the call appends its id to logPath + ".enter", then waits until that file
// exists; see entered) and "sleep_ms".
func loggingWorker(name, logPath, outTopic string, poison bool) []byte {
	fail := ""
	if poison {
		fail = `    if data.get("poison"):
        raise ValueError("poisoned input " + event["id"])`
	}
	return []byte(fmt.Sprintf(`
import json, os, time

def process(event):
    enter = time.time_ns()
    data = event.get("data") or {}
    if data.get("until_file"):
        with open(%[6]q + ".enter", "a") as f:
            f.write(event["id"] + "\n")
        give_up = time.time() + 120
        while not os.path.exists(data["until_file"]) and time.time() < give_up:
            time.sleep(0.02)
    if data.get("sleep_ms"):
        time.sleep(data["sleep_ms"] / 1000.0)
    line = json.dumps({"w": %[1]q, "id": event["id"], "enter": enter, "exit": time.time_ns(), "tok": event.get("fencingtoken"), "node": os.environ.get("WORKMANAGER_NODE_ID")})
    with open(%[2]q, "a") as f:
        f.write(line + "\n")
%[3]s
    return {"type": %[4]q, "data": {"w": %[5]q}}
`, name, logPath, fail, outTopic, name, logPath))
}

type call struct {
	W     string `json:"w"`
	ID    string `json:"id"`
	Enter int64  `json:"enter"`
	Exit  int64  `json:"exit"`
	Tok   string `json:"tok"`
	Node  string `json:"node"` // WORKMANAGER_NODE_ID when set (node B)
}

// entered lists the ids of the calls of a loggingWorker that started
// waiting for their "until_file" (logPath + ".enter").
func entered(t *testing.T, logPath string) []string {
	t.Helper()
	b, err := os.ReadFile(logPath + ".enter")
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// calls reads a loggingWorker's log.
func calls(t *testing.T, path string) []call {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []call
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var c call
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			continue // a line being written
		}
		out = append(out, c)
	}
	return out
}

func countByID(cs []call) map[string]int {
	m := map[string]int{}
	for _, c := range cs {
		m[c.ID]++
	}
	return m
}

func (e *env) createWith(t *testing.T, req *pb.CreateWorkerRequest) string {
	t.Helper()
	if req.MimeType == "" {
		req.MimeType = "text/x-python"
	}
	resp, err := e.client.CreateWorker(ctxT(t), req)
	if err != nil {
		t.Fatalf("CreateWorker: %v", err)
	}
	return resp.GetWorkerId()
}

func pyCode(code []byte) *pb.CodeSource {
	return &pb.CodeSource{Source: &pb.CodeSource_Content{Content: code}}
}

// collect gathers the events of a subscription by id.
type collect struct {
	mu  sync.Mutex
	evs map[string][]event.Event
	n   int
}

func collectFrom(ch <-chan event.Event) *collect {
	c := &collect{evs: map[string][]event.Event{}}
	go func() {
		for ev := range ch {
			c.mu.Lock()
			c.evs[ev.ID()] = append(c.evs[ev.ID()], ev)
			c.n++
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *collect) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// distinct counts the event ids seen (outputs of one input and worker
// share their id, so duplicates count once).
func (c *collect) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.evs)
}

// all returns every event seen so far.
func (c *collect) all() []event.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []event.Event
	for _, evs := range c.evs {
		out = append(out, evs...)
	}
	return out
}

func (c *collect) get(id string) []event.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]event.Event(nil), c.evs[id]...)
}

// A worker that always throws on some messages attempts each of them
// exactly WORKER_MAX_ATTEMPTS times, then they are on <topic>-dead with the
// error; a second worker on the topic processes every message exactly once;
// after the poison worker is fixed, ReplayDeadLetters brings its dead
// letters back and each is processed once, by that worker only.
func TestPoisonMessagesDeadLetterAndReplay(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{nodeEnv: []string{"WORKER_MAX_ATTEMPTS=3", "WORKER_RETRY_BACKOFF=200ms"}})
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	dead := collectFrom(e.subscribe(in + dispatch.DeadLetterSuffix))
	outs := collectFrom(e.subscribe(out))
	poisonLog, goodLog := filepath.Join(dir, "poison.log"), filepath.Join(dir, "good.log")
	poison := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("poison", poisonLog, out, true)), Topic: in})
	good := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("good", goodLog, out, false)), Topic: in})

	var ids, poisoned []string
	for i := range 10 {
		id := "m" + strconv.Itoa(i)
		data := map[string]any{"n": i}
		if i%4 == 0 {
			data["poison"] = true
			poisoned = append(poisoned, id)
		}
		e.publish(in, id, data, "corr-"+id)
		ids = append(ids, id)
	}
	waitFor(t, 90*time.Second, "dead letters of the poisoned inputs", func() bool { return dead.count() >= len(poisoned) })
	waitFor(t, 30*time.Second, "outputs of every input", func() bool { return outs.count() >= 2*len(ids)-len(poisoned) })

	pc, gc := countByID(calls(t, poisonLog)), countByID(calls(t, goodLog))
	for _, id := range ids {
		if gc[id] != 1 {
			t.Errorf("good worker processed %s %d times, want once", id, gc[id])
		}
	}
	for _, id := range poisoned {
		if pc[id] != 3 {
			t.Errorf("poison worker attempted %s %d times, want WORKER_MAX_ATTEMPTS=3", id, pc[id])
		}
		evs := dead.get(id)
		if len(evs) != 1 {
			t.Fatalf("%d dead letters for %s", len(evs), id)
		}
		x := evs[0].Extensions()
		if x["deadletterreason"] != "worker_failed" || x["deadletterworker"] != poison || fmt.Sprint(x["deadletterattempts"]) != "3" ||
			!strings.Contains(fmt.Sprint(x["deadlettererror"]), "poisoned input") || x["correlationid"] != "corr-"+id ||
			evs[0].Source() != "integration-test" || evs[0].Type() != "test.input" {
			t.Errorf("dead letter of %s: %v", id, evs[0])
		}
	}
	for _, id := range ids {
		if pc[id] == 0 {
			t.Errorf("poison worker never saw %s", id)
		}
	}
	list, err := e.client.ListDeadLetters(ctxT(t), &pb.ListDeadLettersRequest{WorkerId: poison})
	if err != nil || len(list.GetDeadLetters()) != len(poisoned) {
		t.Fatalf("ListDeadLetters: %v %v", list, err)
	}

	// Bad requests are refused and change nothing.
	if _, err := e.client.ReplayDeadLetters(ctxT(t), &pb.ReplayDeadLettersRequest{}); err == nil {
		t.Fatal("replay without worker_id or topic accepted")
	}
	if _, err := e.client.ReplayDeadLetters(ctxT(t), &pb.ReplayDeadLettersRequest{WorkerId: "no-such-worker"}); err == nil {
		t.Fatal("replay for an unknown worker accepted")
	}

	// Fix the worker, then replay.
	if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: poison, Code: pyCode(loggingWorker("poison", poisonLog, out, false))}); err != nil {
		t.Fatal(err)
	}
	before := outs.count()
	rep, err := e.client.ReplayDeadLetters(ctxT(t), &pb.ReplayDeadLettersRequest{WorkerId: poison})
	if err != nil || int(rep.GetReplayed()) != len(poisoned) {
		t.Fatalf("ReplayDeadLetters: %v %v", rep, err)
	}
	waitFor(t, 30*time.Second, "outputs of the replayed inputs", func() bool { return outs.count() >= before+len(poisoned) })
	pc, gc = countByID(calls(t, poisonLog)), countByID(calls(t, goodLog))
	for _, id := range poisoned {
		if pc[id] != 4 || gc[id] != 1 {
			t.Errorf("%s after replay: poison worker ran it %d times (want 3+1), good worker %d (want 1)", id, pc[id], gc[id])
		}
	}
	if rest, err := e.client.ListDeadLetters(ctxT(t), &pb.ListDeadLettersRequest{WorkerId: poison}); err != nil || len(rest.GetDeadLetters()) != 0 {
		t.Fatalf("dead letters left after replay: %v %v", rest, err)
	}
	_ = good
}

// Undecodable and oversized events go to <topic>-dead at once; the
// well-formed messages around them are processed.
func TestUndecodableAndOversizedEventsDeadLetter(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{nodeEnv: []string{"MAX_EVENT_BYTES=4096"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	dead := collectFrom(e.subscribe(in + dispatch.DeadLetterSuffix))
	o := &outputs{t: t, ch: e.subscribe(out), seen: map[string]bool{}}
	e.create(t, in, echoWorker(out, "v1"))
	e.publish(in, "before", map[string]any{"n": 1}, "")
	e.publishEvent(in, map[string]any{"id": "undecodable", "source": "%zz", "type": "test.input", "data": map[string]any{"n": 2}})
	e.publish(in, "oversized", map[string]any{"blob": strings.Repeat("x", 8192)}, "")
	e.publish(in, "after", map[string]any{"n": 3}, "")
	o.expect("before", "after")
	waitFor(t, 30*time.Second, "two dead letters", func() bool { return dead.count() >= 2 })
	if evs := dead.get("undecodable"); len(evs) != 1 || evs[0].Extensions()["deadletterreason"] != "undecodable" {
		t.Fatalf("undecodable dead letter: %v", evs)
	}
	evs := dead.get("oversized")
	if len(evs) != 1 || evs[0].Extensions()["deadletterreason"] != "too_large" || !bytes.Contains(evs[0].Data(), []byte("xxxx")) {
		t.Fatalf("oversized dead letter: %v", evs)
	}
}

// With the group's lock held elsewhere (by a holder that wrote, so it
// cannot be stolen), a message is retried with the configured backoff and
// ends in <topic>-dead with lock_contention after its attempts.
func TestLockContentionDeadLetters(t *testing.T) {
	inTurn(t) // a stack of its own
	// WORKER_TIMEOUT below the max age, or the node refuses to start.
	e := newEnvWith(t, envConfig{nodeEnv: []string{"GROUP_LOCK_RETRY_BASE_DELAY_MS=50", "GROUP_LOCK_MAX_RETRIES=2",
		"WORKER_MAX_ATTEMPTS=2", "WORKER_RETRY_BACKOFF=100ms", "GROUP_LOCK_MAX_AGE_MS=5000", "WORKER_TIMEOUT=2s", "WORKMANAGER_NODE_ID=node-a"}})
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	dead := collectFrom(e.subscribe(in + dispatch.DeadLetterSuffix))
	infra := collectFrom(e.subscribe(infraevents.GroupLockTopic))
	group := "busy-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	// Held past the max age (5 s) by a holder that wrote under its token
	// and whose node is alive (a lock of a node gone from the membership
	// would be taken at once): every theft is aborted (until 10 × the max
	// age, 50 s).
	e.putState(t, "workmanager/grouplock/"+group, map[string]any{"token": 41, "holder": "node-a/another-worker", "held": true,
		"acquired_ms": time.Now().Add(-6 * time.Second).UnixMilli(), "wrote": true})
	log := filepath.Join(dir, "w.log")
	id := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("w", log, out, false)), Topic: in, Group: group})
	e.publish(in, "m1", map[string]any{"n": 1}, "")
	waitFor(t, 60*time.Second, "a lock_contention dead letter", func() bool { return dead.count() >= 1 })
	evs := dead.get("m1")
	if len(evs) != 1 || evs[0].Extensions()["deadletterreason"] != "lock_contention" || fmt.Sprint(evs[0].Extensions()["deadletterattempts"]) != "2" ||
		evs[0].Extensions()["deadletterworker"] != id {
		t.Fatalf("dead letter %v", evs)
	}
	if n := len(calls(t, log)); n != 0 {
		t.Fatalf("worker ran %d times without the lock", n)
	}
	waitFor(t, 10*time.Second, "theft_aborted and contended group-lock events", func() bool {
		return infra.countType("com.virtufin.workmanager.infra.grouplock.theft_aborted") > 0 &&
			infra.countType("com.virtufin.workmanager.infra.grouplock.contended") >= 2
	})
}

func (c *collect) countType(typ string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, evs := range c.evs {
		for _, ev := range evs {
			if ev.Type() == typ {
				n++
			}
		}
	}
	return n
}

// Fencing: a holder paused past the lock's max age (its node SIGSTOPped
// mid-call: it cannot renew its lease) loses the lock to the other node,
// which processes the next messages; when the stale holder resumes, its
// output is refused (an error event with error_type stale_lock), and the
// message is processed later under a fresh token. The theft shows on
// workmanager.infra.grouplock. (A call that merely runs long keeps its lock:
// its node renews the lease.)
func TestStaleLockHolderOutputIsRefused(t *testing.T) {
	inTurn(t) // a stack of its own
	// NODE_HEARTBEAT=10s: the 6 s pause outlasts the lock's max age but not
	// the node's membership (a node counts itself out after two silent
	// heartbeats: 20 s; with 5 s, 10 s, a node slow to resume under a CPU
	// hog lapsed first), so what refuses the resumed holder's output is
	// the lock's fencing (stale_lock); past its membership, the node would
	// drop the call's output before that (issue 33 item 5).
	lockEnv := []string{"GROUP_LOCK_MAX_AGE_MS=3000", "GROUP_LOCK_RETRY_BASE_DELAY_MS=200", "GROUP_LOCK_MAX_RETRIES=4",
		"WORKER_TIMEOUT=2s", "WORKER_RETRY_BACKOFF=100ms", "NODE_HEARTBEAT=10s"}
	e := newEnvWith(t, envConfig{nodeEnv: lockEnv})
	nodeB := e.startNodeB(t)
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	infra := collectFrom(e.subscribe(infraevents.GroupLockTopic))
	marker, log := filepath.Join(dir, "paused-once"), filepath.Join(dir, "w.log")
	code := []byte(fmt.Sprintf(`
import os, time, json
def process(event):
    if (event.get("data") or {}).get("pause") and not os.path.exists(%q):
        open(%q, "w").close()
        time.sleep(1.5)
    with open(%q, "a") as f:
        f.write(json.dumps({"w": "w", "id": event["id"], "enter": 0, "exit": 0, "tok": event.get("fencingtoken")}) + "\n")
    return {"type": %q, "data": {"tok": event.get("fencingtoken")}}
`, marker, marker, log, out))
	group := "fenced-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	id := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(code), Topic: in, Group: group})
	e.publish(in, "slow", map[string]any{"pause": true}, "")
	waitFor(t, 20*time.Second, "the paused call", func() bool { _, err := os.Stat(marker); return err == nil })
	// Pause the node running the call (its process only: the worker's
	// process answers meanwhile, so the reply is there when it resumes)
	// for twice the max age.
	holder, held := e.lockRecord(t, group)
	paused := e.node
	if strings.HasPrefix(holder, "node-b/") {
		paused = nodeB
	}
	if !held || !strings.HasSuffix(holder, "/"+id) {
		t.Fatalf("lock holder %q (held %v) during the call", holder, held)
	}
	pid := paused.Cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	for i := range 12 { // some land on the other node, which steals the lock
		e.publish(in, "next"+strconv.Itoa(i), map[string]any{"n": i}, "")
		time.Sleep(150 * time.Millisecond)
	}
	time.Sleep(time.Until(stopped.Add(6 * time.Second)))
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	var ev lifecycleEvent
	waitFor(t, 30*time.Second, "an error event for the paused message", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, l := range e.lifecycle {
			if l.Data.WorkerID == id && l.Type == lifecycleevents.TypePrefix+string(lifecycleevents.Error) && l.Data.EventID == "slow" {
				ev = l
				return true
			}
		}
		return false
	})
	if ev.Data.ErrorType != "stale_lock" {
		t.Fatalf("error event %+v, want stale_lock for the paused message", ev.Data)
	}
	// Each of the 13 inputs answered, by id (a duplicate output must not
	// stand in for the paused message's, which comes last).
	waitFor(t, 60*time.Second, "the paused message processed under a fresh token", func() bool {
		return len(outs.get(firstOutputID("slow", id))) > 0
	})
	waitFor(t, 60*time.Second, "an output for each of the 12 other inputs", func() bool {
		for i := range 12 {
			if len(outs.get(firstOutputID("next"+strconv.Itoa(i), id))) == 0 {
				return false
			}
		}
		return true
	})
	if infra.countType("com.virtufin.workmanager.infra.grouplock.acquired") == 0 {
		t.Fatal("no group-lock events")
	}
	stolen := false
	infra.mu.Lock()
	for _, evs := range infra.evs {
		for _, ev := range evs {
			var d struct {
				Stolen bool `json:"stolen"`
			}
			if ev.DataAs(&d) == nil && d.Stolen {
				stolen = true
			}
		}
	}
	infra.mu.Unlock()
	if !stolen {
		t.Fatal("no acquisition reported as stolen")
	}
}

// putState writes a JSON value through daprd's state API.
func (e *env) putState(t *testing.T, key string, value any) {
	t.Helper()
	body, _ := json.Marshal([]map[string]any{{"key": key, "value": value}})
	resp, err := http.Post("http://"+e.stack.DaprHTTPAddr+"/v1.0/state/"+devstack.StateName, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("save state %s: HTTP %d", key, resp.StatusCode)
	}
}

// overlaps counts pairs of consecutive calls (by entry time) that overlap.
func overlaps(cs []call) int {
	sort.Slice(cs, func(i, j int) bool { return cs[i].Enter < cs[j].Enter })
	n := 0
	for i := 1; i < len(cs); i++ {
		if cs[i].Enter < cs[i-1].Exit {
			n++
		}
	}
	return n
}

// startNodeB starts a second node with its own daprd on the same Redis and
// Temporal, and returns it once it is ready.
func (e *env) startNodeB(t *testing.T, env ...string) *devstack.Proc {
	t.Helper()
	p, _ := e.startNodeBWithSidecar(t, env...)
	return p
}

// startNodeBWithSidecar is startNodeB that also returns node B's daprd.
func (e *env) startNodeBWithSidecar(t *testing.T, env ...string) (*devstack.Proc, devstack.Sidecar) {
	t.Helper()
	p, sc, _ := e.startNodeBFull(t, env...)
	return p, sc
}

// startNodeBFull is startNodeB that also returns node B's daprd and base URL.
func (e *env) startNodeBFull(t *testing.T, env ...string) (*devstack.Proc, devstack.Sidecar, string) {
	t.Helper()
	ctx := ctxT(t)
	sc, err := e.stack.StartSidecar(ctx, "daprd-b")
	if err != nil {
		t.Fatal(err)
	}
	p, addr := e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := devstack.StartProc(e.dir, "node-b", e.withSandbox(append(append(e.stack.Env(), "DAPR_GRPC_ADDRESS="+sc.GRPCAddr,
			"WORKMANAGER_HTTP_ADDR="+addr, "WORKER_TIMEOUT=2s", "LOG_LEVEL=debug", "WORKMANAGER_NODE_ID=node-b", "NODE_HEARTBEAT=1s",
			"RECONCILE_INTERVAL=5s"), append(e.nodeEnv, env...)...)),
			filepath.Join(e.bins, "worker"))
		if err != nil {
			return nil, err
		}
		return p, devstack.WaitHTTP(ctx, p, "http://"+addr+"/readyz", 90*time.Second)
	})
	t.Cleanup(p.Kill)
	return p, sc, "http://" + addr
}

// envInt reads a test size from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// Two nodes, two workers in one group and a third without a group on one
// topic: no two executions inside the group overlap, each message is
// processed exactly once per worker and none is lost, while the ungrouped
// worker runs alongside. The fencing tokens of the group's executions are
// all distinct.
func TestGroupMutualExclusionAcrossNodes(t *testing.T) {
	inTurn(t) // a stack of its own
	// NODE_HEARTBEAT=5s (membership 15 s): with the harness's 1 s, a node
	// starved of CPU next to the rest of make test could lapse for 3 s
	// mid-call, and a call whose node lost its membership publishes nothing
	// and runs again (m542 twice in one local make test); no node dies here.
	lockEnv := []string{"GROUP_LOCK_RETRY_BASE_DELAY_MS=5", "GROUP_LOCK_MAX_RETRIES=10", "WORKER_QUEUE_DEPTH=64", "NODE_HEARTBEAT=5s"}
	// "Exactly once per worker" needs every message answered within the
	// broker's processing timeout, or Redis hands it to the other node while
	// it still runs (a duplicate the record cannot prevent: neither run has
	// finished). A busy CI machine can hold a message past the tests' usual
	// 6 s — make test runs this next to the 300-worker scale test, and 30 s
	// was seen to pass (m735..m741 twice) — so this test leaves 60 s (the
	// manifest's advice: above WORKER_TIMEOUT).
	e := newEnvWith(t, envConfig{nodeEnv: lockEnv, processingTimeout: time.Minute})
	_, _, nodeB := e.startNodeBFull(t)
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	infra := collectFrom(e.subscribe(infraevents.GroupLockTopic))
	group := "g-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	logs := map[string]string{}
	for _, name := range []string{"a", "b", "free"} {
		logs[name] = filepath.Join(dir, name+".log")
		g := group
		if name == "free" {
			g = ""
		}
		e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker(name, logs[name], out, false)), Topic: in, Group: g})
	}
	n := envInt("WM_EXCLUSION_MESSAGES", 2000)
	// 100/s (30 before group commit: the group then did about 200/s on
	// two nodes, now about 600; this test went from 171-184 s to 25-30 s).
	// Paced below what one group can do (its executions are serialized
	// cluster-wide), so the test measures exclusion, not backlog: at most
	// WM_EXCLUSION_RATE per second, and never more than window inputs
	// ahead of the answers (a busy machine slows the group down; a backlog
	// would hold inputs past the broker's processing timeout, and Redis
	// would hand them to the other node while they still run).
	window := envInt("WM_EXCLUSION_WINDOW", 60)
	e.publishPaced(in, "m", n, envInt("WM_EXCLUSION_RATE", 100), map[string]any{"sleep_ms": 1}, func(i int) {
		waitFor(t, 5*time.Minute, fmt.Sprintf("the answers to the first %d inputs", i-window), func() bool { return outs.distinct() >= 3*(i-window) })
	})
	waitFor(t, 10*time.Minute, fmt.Sprintf("%d distinct outputs", 3*n), func() bool { return outs.distinct() >= 3*n })
	// Then a tail at 20 a second: while a node's own messages queue for
	// the group it takes the lock itself (waiter markers, as before), so
	// on a loaded machine the burst above may pass the group between the
	// nodes only so; between spaced messages a node that gave the group
	// up sends its turns to the holder (asserted below).
	forwardedTotal := func() float64 {
		sum := 0.0
		for _, base := range []string{e.nodeURL, nodeB} {
			if v := sampleValue(scrapeURL(t, base), "workmanager_grouplock_forwarded_total", map[string]string{"group": group}); v > 0 {
				sum += v
			}
		}
		return sum
	}
	inBurst := forwardedTotal()
	const tail = 40
	e.publishPaced(in, "t", tail, 20, map[string]any{"sleep_ms": 1}, nil)
	waitFor(t, 2*time.Minute, fmt.Sprintf("%d distinct outputs", 3*(n+tail)), func() bool { return outs.distinct() >= 3*(n+tail) })

	var grouped []call
	tokens := map[string]bool{}
	for name, path := range logs {
		cs := calls(t, path)
		byID := countByID(cs)
		for i := range n {
			if c := byID["m"+strconv.Itoa(i)]; c != 1 {
				t.Errorf("worker %s processed m%d %d times, want exactly once", name, i, c)
			}
		}
		if name != "free" {
			grouped = append(grouped, cs...)
			for _, c := range cs {
				if c.Tok == "" || tokens[c.Tok] {
					t.Errorf("worker %s: fencing token %q missing or reused", name, c.Tok)
				}
				tokens[c.Tok] = true
			}
		}
	}
	if o := overlaps(grouped); o != 0 {
		t.Fatalf("%d overlapping executions inside group %s", o, group)
	}
	// The group's turns that reached the node not holding it ran on the
	// node holding it (internal/dispatch/forward.go: forwarded there, and
	// run under its lock), and the exclusion above held; the group came to
	// that node by a question to its holder (a hand-over, or a release for
	// the asker), not by waiting out a linger.
	handed := 0
	infra.mu.Lock()
	for _, evs := range infra.evs {
		for _, ev := range evs {
			var d struct {
				Group  string `json:"group"`
				Handed bool   `json:"handed"`
			}
			if ev.Type() == "com.virtufin.workmanager.infra.grouplock.acquired" && ev.DataAs(&d) == nil && d.Group == group && d.Handed {
				handed++
			}
		}
	}
	infra.mu.Unlock()
	forwarded := forwardedTotal()
	if forwarded == 0 {
		t.Fatalf("no turn of the group was forwarded to the node holding it (%d hand-overs)", handed)
	}
	t.Logf("%d+%d messages, %d grouped executions without overlap, %d hand-overs, %.0f turns forwarded (%.0f in the burst)", n, tail, len(grouped), handed, forwarded, inBurst)
}

// publishPaced publishes n inputs "<prefix><i>" at about rate per second
// from 4 publishers, calling at(i) before input i when set.
func (e *env) publishPaced(topic, prefix string, n, rate int, data map[string]any, at func(i int)) []string {
	ids := make([]string, n)
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		if at != nil {
			at(i)
		}
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		ids[i] = prefix + strconv.Itoa(i)
		payload := map[string]any{"n": i}
		for k, v := range data {
			payload[k] = v
		}
		e.publish(topic, ids[i], payload, "")
	}
	return ids
}

// SIGTERM to a node under load: its in-flight calls finish and are acked
// (no call is cut off: every message is processed exactly once), the
// messages it gives back are processed by the other node, nothing is lost.
func TestSIGTERMDrainsInFlightMessages(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{nodeEnv: []string{"SHUTDOWN_GRACE=20s"}})
	e.startNodeB(t)
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	log := filepath.Join(dir, "w.log")
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("w", log, out, false)), Topic: in})
	const n = 300
	stopped := make(chan struct{})
	ids := e.publishPaced(in, "m", n, 40, map[string]any{"sleep_ms": 20}, func(i int) {
		if i == n/2 {
			go func() { e.node.Terminate(30 * time.Second); close(stopped) }()
		}
	})
	<-stopped
	waitFor(t, 2*time.Minute, fmt.Sprintf("%d outputs", n), func() bool { return outs.count() >= n })
	byID := countByID(calls(t, log))
	for _, id := range ids {
		if byID[id] != 1 {
			t.Errorf("message %s processed %d times, want exactly once", id, byID[id])
		}
	}
	logs := e.node.Output()
	if !strings.Contains(logs, "draining in-flight messages") || !strings.Contains(logs, "drained=true") {
		t.Fatalf("node A did not drain cleanly:\n%s", tail(logs, 3000))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// refusing is worker code that cannot be loaded on a node whose
// environment has WM_TEST_REFUSE_LOAD set.
func refusing(code []byte) []byte {
	return append([]byte("import os\nif os.environ.get('WM_TEST_REFUSE_LOAD'):\n    raise RuntimeError('this node cannot load me')\n"), code...)
}

// A worker that one node cannot run (its load fails there) loses no
// message: the node that cannot run it gives the messages back until the
// node that can has processed them; the other worker on the topic runs
// each message exactly once.
func TestWorkerUnrunnableOnOneNodeLosesNothing(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{})
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	picky, everywhere := filepath.Join(dir, "picky.log"), filepath.Join(dir, "everywhere.log")
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(refusing(loggingWorker("picky", picky, out, false))), Topic: in})
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("everywhere", everywhere, out, false)), Topic: in})
	b := e.startNodeB(t, "WM_TEST_REFUSE_LOAD=1")
	waitFor(t, 30*time.Second, "node B to fail loading the picky worker", func() bool {
		return strings.Contains(b.Output(), "this node cannot load me")
	})
	const n = 40
	ids := e.publishPaced(in, "m", n, 20, nil, nil)
	waitFor(t, 3*time.Minute, fmt.Sprintf("%d outputs", 2*n), func() bool { return outs.count() >= 2*n })
	pc, ec := countByID(calls(t, picky)), countByID(calls(t, everywhere))
	for _, id := range ids {
		if pc[id] != 1 || ec[id] != 1 {
			t.Errorf("%s processed %d times by picky, %d by everywhere; want once each", id, pc[id], ec[id])
		}
	}
	onB := 0
	for _, c := range calls(t, everywhere) {
		if c.Node == "node-b" {
			onB++
		}
	}
	if onB == 0 { // then node B never gave a message back: not the case under test
		t.Fatal("node B received no message")
	}
	t.Logf("node B took %d of %d messages and gave each back for the worker it cannot run", onB, n)
}

// kill -9 of one node in the middle of a stream: afterwards each worker has
// processed every message; duplicates are only messages that were in flight
// on the killed node, and the test reports their count.
func TestKillNodeLosesNothing(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{})
	e.startNodeB(t)
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	logs := []string{filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")}
	for i, l := range logs {
		e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("w"+strconv.Itoa(i), l, out, false)), Topic: in})
	}
	n := envInt("WM_KILL_MESSAGES", 5000)
	ids := e.publishPaced(in, "m", n, 500, nil, func(i int) {
		if i == n/2 {
			e.killNode()
		}
	})
	waitFor(t, 5*time.Minute, "every message processed by both workers", func() bool {
		if outs.count() < 2*n {
			return false
		}
		for _, l := range logs {
			if len(countByID(calls(t, l))) < n {
				return false
			}
		}
		return true
	})
	dups := 0
	for _, l := range logs {
		byID := countByID(calls(t, l))
		for _, id := range ids {
			switch c := byID[id]; {
			case c == 0:
				t.Errorf("%s lost for %s", id, l)
			case c > 1:
				dups += c - 1
			}
		}
	}
	t.Logf("kill -9 mid-stream: %d messages × 2 workers, %d duplicate executions (in flight on the killed node)", n, dups)
	if dups > 2*(64+8) { // at most what one node can have in flight per worker
		t.Fatalf("%d duplicates: more than the killed node can have had in flight", dups)
	}
}

// publishVia publishes a structured CloudEvent through the daprd at
// httpAddr, retrying for up to a minute while the broker is away (a
// publisher's own job; the test checks what happens after the publish).
func (e *env) publishVia(t *testing.T, httpAddr, topic, id string, data any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": id, "source": "integration-test", "type": "test.input",
		"datacontenttype": "application/json", "data": data})
	url := fmt.Sprintf("http://%s/v1.0/publish/%s/%s", httpAddr, devstack.PubSubName, topic)
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Post(url, "application/cloudevents+json", bytes.NewReader(body))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish %s: %v (HTTP %v)", id, err, resp)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A daprd restart and a Redis restart (append-only file on) in the middle
// of a stream lose nothing: the node's streams reconnect by themselves and
// every message is processed, once unless it was in flight at the fault.
func TestDaprdAndRedisRestartsLoseNothing(t *testing.T) {
	inTurn(t) // a stack of its own
	// NODE_HEARTBEAT=10s: the node's heartbeats go through daprd's state
	// API, so with the harness's 1 s (a 3 s TTL) a daprd restart on a
	// loaded machine made the node lapse, fence itself and run every call
	// of those seconds again (m60-m87 twice, under a CPU hog), and with
	// 5 s daprd was still down after 15 s in CI-like run 24 (m215 twice);
	// the daprd restart is what this test is about, not a membership
	// lapse (a rerun a lapse explains is accepted below all the same).
	e := newEnvWith(t, envConfig{nodeEnv: []string{"NODE_HEARTBEAT=10s"}})
	ctx := ctxT(t)
	pubSide, err := e.stack.StartSidecar(ctx, "daprd-publisher") // publishes while the node's daprd is away
	if err != nil {
		t.Fatal(err)
	}
	dir := workerDir(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	log := filepath.Join(dir, "w.log")
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(loggingWorker("w", log, out, false)), Topic: in})
	const n, daprdAt, redisAt = 240, 60, 150
	var ids []string
	for i := range n {
		switch i {
		case daprdAt:
			e.stack.KillDaprd()
			if err := e.stack.StartDaprd(ctx); err != nil {
				t.Fatal(err)
			}
		case redisAt:
			e.stack.StopRedis()
			if err := e.stack.StartRedis(ctx); err != nil {
				t.Fatal(err)
			}
		}
		id := "m" + strconv.Itoa(i)
		e.publishVia(t, pubSide.HTTPAddr, in, id, map[string]any{"n": i})
		ids = append(ids, id)
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, 3*time.Minute, "every message processed", func() bool { return len(countByID(calls(t, log))) >= n })
	// Once each, but for a message in flight when daprd or Redis went
	// away: its outputs' publish failed, and it ran again (a documented
	// run-twice case, docs/architecture.md; it happened to m59 in a CI-like
	// run). Those are the few published just before a fault.
	near := func(i, fault int) bool { return i >= fault-10 && i < fault+2 }
	inFlightAtAFault := func(i int) bool { return near(i, daprdAt) || near(i, redisAt) }
	cs := calls(t, log)
	byID := countByID(cs)
	explained := documentedReruns(t, filepath.Join(e.dir, "node.log"), cs)
	for i, id := range ids {
		switch n := byID[id]; {
		case n == 1:
		case n > 1 && inFlightAtAFault(i):
			t.Logf("%s processed %d times: in flight at a fault", id, n)
		case n > 1 && explained[id] != "":
			t.Logf("%s processed %d times: %s", id, n, explained[id])
		default:
			var ran []string
			for _, c := range cs {
				if c.ID == id {
					ran = append(ran, time.Unix(0, c.Enter).UTC().Format("15:04:05.000")+"–"+time.Unix(0, c.Exit).UTC().Format("15:04:05.000"))
				}
			}
			t.Errorf("%s processed %d times (%s), want once; the node's log about it:\n%s", id, n, strings.Join(ran, ", "), nodeLogAbout(t, filepath.Join(e.dir, "node.log"), id))
		}
	}
}

// documentedReruns names, by event id, the calls of cs that the node's log
// shows were made again for one of the documented reasons
// (docs/architecture.md, "At least once"): the delivery record not saved
// after the call, a failed attempt (its effects, here the log line, stay),
// or the node fencing itself (membership lapsed or
// Temporal's lease lost) while the call ran or before its record was
// written. On a starved machine these happen a while after a restart, not
// only to the messages in flight at it.
func documentedReruns(t *testing.T, nodeLog string, cs []call) map[string]string {
	t.Helper()
	b, err := os.ReadFile(nodeLog)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	type span struct{ from, to time.Time }
	var fences []span
	for line := range strings.Lines(string(b)) {
		switch {
		case strings.Contains(line, `msg="delivery record not saved`):
			if id := logField(line, "event_id"); id != "" {
				out[id] = "its delivery record was not saved (" + strings.TrimSpace(logField(line, "err")) + ")"
			}
		case strings.Contains(line, `msg="worker attempt failed"`):
			// A call that wrote its log line and then failed (on a starved
			// machine, mostly WORKER_TIMEOUT: 2 s here) is tried again.
			if id := logField(line, "event_id"); id != "" && out[id] == "" {
				out[id] = "an attempt failed (" + logField(line, "error_type") + ": " + logField(line, "err") + ") and was made again"
			}
		case strings.Contains(line, "fencing this node"), strings.Contains(line, "no longer a cluster member"):
			if at, err := time.Parse(time.RFC3339Nano, logField(line, "time")); err == nil {
				fences = append(fences, span{at, at})
			}
		case strings.Contains(line, "a cluster member again after a lapse"):
			// A lapse the node saw only once it was over (daprd was down
			// for longer than the TTL): it fenced and unfenced itself,
			// then reconciled (seconds on a busy machine), then logged.
			if at, err := time.Parse(time.RFC3339Nano, logField(line, "time")); err == nil {
				fences = append(fences, span{at.Add(-10 * time.Second), at})
			}
		}
	}
	first := map[string]call{}
	for _, c := range cs {
		if f, ok := first[c.ID]; !ok || c.Enter < f.Enter {
			first[c.ID] = c
		}
	}
	for id, c := range first {
		for _, f := range fences {
			// Fenced while it ran, or before its record was written
			// (tried for 5 s).
			if !f.to.Before(time.Unix(0, c.Enter).Add(-time.Second)) && !f.from.After(time.Unix(0, c.Exit).Add(6*time.Second)) && out[id] == "" {
				out[id] = "the node fenced itself at " + f.to.Format("15:04:05.000") + ", while it ran or before its record was written"
			}
		}
	}
	return out
}

// logField reads key=value (value bare or quoted) from a slog text line.
func logField(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 && strings.HasPrefix(line, key+"=") {
		i = -1
	} else if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if strings.HasPrefix(v, `"`) {
		if s, err := strconv.QuotedPrefix(v); err == nil {
			u, _ := strconv.Unquote(s)
			return u
		}
	}
	if j := strings.IndexAny(v, " \n"); j >= 0 {
		v = v[:j]
	}
	return v
}

// nodeLogAbout lists the lines of the node's log that name event id, and
// those about fencing, membership and the delivery record (at most 40).
func nodeLogAbout(t *testing.T, nodeLog, id string) string {
	b, _ := os.ReadFile(nodeLog)
	var keep []string
	for line := range strings.Lines(string(b)) {
		if logField(line, "event_id") == id || strings.Contains(line, "fenc") || strings.Contains(line, "cluster member") ||
			strings.Contains(line, "lease") || strings.Contains(line, "heartbeat") {
			keep = append(keep, strings.TrimRight(line, "\n"))
		}
	}
	if len(keep) > 40 {
		keep = append(keep[:20], append([]string{"…"}, keep[len(keep)-20:]...)...)
	}
	return strings.Join(keep, "\n")
}

// A hung worker on a shared topic delays only its own messages. Were the
// other worker's messages held behind the hung one's, each would wait for
// at least one hung attempt to time out (WORKER_TIMEOUT, 2 s on the test
// stacks), and with 400 of them most would; so the fast worker's p99 from
// publish to output must stay below that timeout. (A 1 s bound failed on a
// machine at load 21 with p99 1.24 s: the load, not the hung worker.)
func TestHungWorkerDoesNotDelayOthers(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{})
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	hung := []byte(fmt.Sprintf("import time\ndef process(event):\n    time.sleep(3600)\n    return {\"type\": %q, \"data\": {}}\n", out))
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(hung), Topic: in})
	fast := []byte(fmt.Sprintf("def process(event):\n    return {\"type\": %q, \"data\": event.get(\"data\")}\n", out))
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(fast), Topic: in})
	const n = 400
	lat := make(chan time.Duration, n)
	go func() {
		for ev := range outs {
			var d struct {
				Sent int64 `json:"sent"`
			}
			if ev.DataAs(&d) == nil && d.Sent > 0 {
				lat <- time.Since(time.Unix(0, d.Sent))
			}
		}
	}()
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * 25 * time.Millisecond)); d > 0 {
			time.Sleep(d)
		}
		e.publish(in, "m"+strconv.Itoa(i), map[string]any{"sent": time.Now().UnixNano()}, "")
	}
	var ds []time.Duration
	timeout := time.After(time.Minute)
	for len(ds) < n {
		select {
		case d := <-lat:
			ds = append(ds, d)
		case <-timeout:
			t.Fatalf("%d of %d outputs of the fast worker", len(ds), n)
		}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	p50, p99 := ds[len(ds)/2], ds[len(ds)*99/100]
	t.Logf("fast worker next to a hung one: p50 %s, p99 %s over %d messages", p50, p99, n)
	if hungAttempt := 2 * time.Second; p99 >= hungAttempt {
		t.Fatalf("p99 %s, not below one hung attempt (%s): the hung worker delays the other one", p99, hungAttempt)
	}
}

// With daprd requiring an API token, the node sends it on every call —
// including the raw streaming subscriptions — so processing works; a call
// without it is refused.
func TestDaprAPITokenIsSent(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{daprAPIToken: "dev-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)})
	in, out := topicName(t, "in"), topicName(t, "out")
	o := &outputs{t: t, ch: e.subscribe(out), seen: map[string]bool{}}
	e.create(t, in, echoWorker(out, "v1"))
	o.expect(e.publishIDs(in, "a", "b")...)
	resp, err := http.Post("http://"+e.stack.DaprHTTPAddr+"/v1.0/publish/"+devstack.PubSubName+"/"+in, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("daprd took a call without its token: HTTP %d", resp.StatusCode)
	}
}

// A Go panic on the hot path (injected by the node's test hook for inputs
// carrying the extension wmtestpanic) is a failed attempt of the worker:
// after its attempts the input is on <topic>-dead with reason panic, and the
// node keeps serving the other inputs.
func TestHotPathPanicIsAFailedAttempt(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{nodeEnv: []string{"WM_TEST_PANIC_EXTENSION=wmtestpanic", "WORKER_MAX_ATTEMPTS=2", "WORKER_RETRY_BACKOFF=100ms"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	dead := collectFrom(e.subscribe(in + dispatch.DeadLetterSuffix))
	o := &outputs{t: t, ch: e.subscribe(out), seen: map[string]bool{}}
	id := e.create(t, in, echoWorker(out, "v1"))
	e.publish(in, "before", map[string]any{"n": 1}, "")
	e.publishEvent(in, map[string]any{"id": "boom", "type": "test.input", "wmtestpanic": "1", "data": map[string]any{"n": 2}})
	e.publish(in, "after", map[string]any{"n": 3}, "")
	o.expect("before", "after")
	waitFor(t, 60*time.Second, "the panicking input on the dead-letter topic", func() bool { return dead.count() >= 1 })
	evs := dead.get("boom")
	if len(evs) != 1 || evs[0].Extensions()["deadletterreason"] != "panic" || fmt.Sprint(evs[0].Extensions()["deadletterattempts"]) != "2" ||
		evs[0].Extensions()["deadletterworker"] != id {
		t.Fatalf("dead letter %v", evs)
	}
	o.expect(e.publishIDs(in, "later")...) // still serving
	if !strings.Contains(e.node.Output(), "panic while processing a message") {
		t.Fatal("the panic was not logged with its stack")
	}
}
