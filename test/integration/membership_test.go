package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/infraevents"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/services/reconcile"
)

// Issue 33 item 5, on the real stack: "stopped" is not announced while a
// live member (node B, SIGSTOPped: it cannot pick its Activate up) may still
// serve the worker; StopWorker answers UNAVAILABLE and a not_applied error
// event names B. Once B runs again, the repeated stop is announced. A node
// paused for longer than the membership TTL no longer holds the event back,
// and when it runs again it serves none of the stopped worker's messages
// (it is not a member, then fences and reconciles first). Reconcile is off
// (RECONCILE_INTERVAL=0): nothing but the membership gate brings B back to
// the catalog.
//
// Timing. B is paused right after one of its heartbeats (NODE_HEARTBEAT=20s,
// TTL 1 min) and the stop is sent at once. Temporal may still hand tasks to
// the polls B had open when it was paused (the stack's server ends a long
// poll after 10 s, matching.longPollExpirationInterval; 1 min by default).
// The stop's Activate for B then either finds no poll of B and ends at its
// 5 s pick-up, or is picked up by such a poll and never run: that attempt
// fails when its heartbeats stop (workflows.ActivateHeartbeat, 20 s)
// instead of at ActivateTimeout (5 min: the API answered DEADLINE_EXCEEDED
// then), and its retry ends at the pick-up. The stop's Apply (any node may
// pick it up) can land on such a poll too: it heartbeats the same way
// (workflows.ApplyHeartbeat, 20 s; with its one-minute StartToClose the
// stop answered after 67 s on a busy CI machine, when B was no longer a
// member). Either way the stop answers while B is still a member (15 to
// 25 s in the runs so far, 45 s when both land on B's polls).
func TestStopWaitsForPausedMemberAndLapsedNodeServesNothing(t *testing.T) {
	inTurn(t) // a stack of its own
	const heartbeat, ttl = 20 * time.Second, 3 * 20 * time.Second
	const longPoll = 10 * time.Second // the stack's matching.longPollExpirationInterval
	nodeEnv := []string{"RECONCILE_INTERVAL=0", "NODE_HEARTBEAT=" + heartbeat.String()}
	e := newEnvWith(t, envConfig{nodeEnv: nodeEnv,
		// Bounds the stop below; without the heartbeat it would take 5 min.
		apiEnv:                []string{"WORKMANAGER_OPERATION_TIMEOUT=2m"},
		temporalDynamicConfig: []string{fmt.Sprintf("matching.longPollExpirationInterval=%q", longPoll.String())}})
	beatsOfB := beatsOf(e.subscribe(infraevents.HeartbeatTopic), "node-b")
	nodeB, _, bURL := e.startNodeBFull(t) // its nodeEnv sets NODE_HEARTBEAT and RECONCILE_INTERVAL
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	code := []byte(fmt.Sprintf(`
import os
def process(event):
    return {"type": %q, "data": {"in": event["id"], "node": os.environ.get("WORKMANAGER_NODE_ID", "node-a")}}
`, out))
	id := e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode(code), Topic: in})
	pid := nodeB.Cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	servedByB := func(round string) {
		t.Helper()
		i := 0
		waitFor(t, 60*time.Second, "an output of node B ("+round+")", func() bool {
			e.publish(in, fmt.Sprintf("%s-%d", round, i), map[string]any{"n": i}, "")
			i++
			time.Sleep(200 * time.Millisecond) // pace the probes
			return outputsFrom(outs, "node-b", round+"-") > 0
		})
	}

	// 1. B paused for less than the TTL: a live member that did not apply
	// the stop.
	servedByB("before")
	since := time.Now()
	waitFor(t, 2*heartbeat, "a heartbeat of node B", func() bool { return beatsOfB.after(since) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	_, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id})
	t.Logf("the stop answered %s after B's pause (TTL %s): %v", time.Since(paused).Round(time.Second), ttl, err)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "node-b") {
		t.Fatalf("StopWorker with node B paused: %v; want UNAVAILABLE naming node-b", err)
	}
	// Published before the API answers; the subscription may lag.
	waitFor(t, 30*time.Second, "the not_applied error event", func() bool {
		_, ok := e.lifecycleEventOf(id, lifecycleevents.Error)
		return ok
	})
	if ev, _ := e.lifecycleEventOf(id, lifecycleevents.Error); ev.Data.ErrorType != "not_applied" || !strings.Contains(ev.Data.ErrorMessage, "node-b") {
		t.Fatalf("error event %+v; want not_applied naming node-b", ev.Data)
	}
	if _, ok := e.lifecycleEventOf(id, lifecycleevents.Stopped); ok {
		t.Fatal("stopped announced while node B, a live member, did not apply the stop")
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the repeated stop to succeed", func() bool {
		_, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id})
		return err == nil
	})
	waitFor(t, 30*time.Second, "the stopped event", func() bool { _, ok := e.lifecycleEventOf(id, lifecycleevents.Stopped); return ok })

	// 2. B paused for longer than the TTL: gone from the membership, it no
	// longer holds the stop back, and it serves nothing when it runs again.
	if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	servedByB("again")
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ttl+2*heartbeat, "node A to count node B as gone", func() bool {
		c := e.healthReport(t).Checks[health.Cluster]
		return c.Status == health.Healthy && !strings.Contains(c.Detail, "node-b")
	})
	stopsBefore := e.countLifecycle(id, lifecycleevents.Stopped)
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatalf("StopWorker with node B gone from the membership: %v", err)
	}
	waitFor(t, 30*time.Second, "the second stopped event", func() bool { return e.countLifecycle(id, lifecycleevents.Stopped) > stopsBefore })
	// Published while B is paused (its daprd hands them to B, the only
	// node still subscribed) and right after it runs again.
	for i := range 3 {
		e.publish(in, fmt.Sprintf("paused-%d", i), map[string]any{"n": i}, "")
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		e.publish(in, fmt.Sprintf("resumed-%d", i), map[string]any{"n": i}, "")
	}
	waitFor(t, 60*time.Second, "node B a member again and reconciled", func() bool {
		c, ok := healthAt(t, bURL).Checks[reconcile.Membership]
		return ok && c.Status == health.Healthy && strings.Contains(c.Detail, "reconciled")
	})
	// Then B serves again, and its subscription of the stopped worker is
	// gone: a bounded wait (over two of Redis' 6 s redeliveries) for
	// outputs the stopped worker must not make.
	reconciled := time.Now()
	for {
		if n := outputsFrom(outs, "", "paused-") + outputsFrom(outs, "", "resumed-"); n > 0 {
			t.Fatalf("%d output(s) of the stopped worker after it was announced stopped", n)
		}
		if time.Since(reconciled) > 15*time.Second {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// beats records when node's heartbeats (infraevents.HeartbeatTopic) arrive.
type beats struct {
	mu   sync.Mutex
	last time.Time
}

func beatsOf(ch <-chan event.Event, node string) *beats {
	b := &beats{}
	go func() {
		for ev := range ch {
			var d struct {
				Node string `json:"node"`
			}
			if ev.DataAs(&d) == nil && d.Node == node {
				b.mu.Lock()
				b.last = time.Now()
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// after reports whether a heartbeat arrived after t.
func (b *beats) after(t time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.last.After(t)
}

// outputsFrom counts the outputs of node ("": any) for inputs whose id
// starts with prefix.
func outputsFrom(c *collect, node, prefix string) int {
	n := 0
	for _, ev := range c.all() {
		var d struct{ In, Node string }
		if (ev.DataAs(&d) == nil) && strings.HasPrefix(d.In, prefix) && (node == "" || d.Node == node) {
			n++
		}
	}
	return n
}

// lifecycleEventOf returns worker id's first lifecycle event of kind.
func (e *env) lifecycleEventOf(id string, kind lifecycleevents.Kind) (lifecycleEvent, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.lifecycle {
		if l.Data.WorkerID == id && l.Type == lifecycleevents.TypePrefix+string(kind) {
			return l, true
		}
	}
	return lifecycleEvent{}, false
}

// errorEventOf is the first worker.error event of worker id with error_type
// errorType.
func (e *env) errorEventOf(id, errorType string) (lifecycleEvent, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.lifecycle {
		if l.Data.WorkerID == id && l.Type == lifecycleevents.TypePrefix+string(lifecycleevents.Error) && l.Data.ErrorType == errorType {
			return l, true
		}
	}
	return lifecycleEvent{}, false
}

func (e *env) countLifecycle(id string, kind lifecycleevents.Kind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, l := range e.lifecycle {
		if l.Data.WorkerID == id && l.Type == lifecycleevents.TypePrefix+string(kind) {
			n++
		}
	}
	return n
}

// healthAt reads /health of the node at url.
func healthAt(t *testing.T, url string) health.Report {
	t.Helper()
	var r health.Report
	resp, err := http.Get(url + "/health")
	if err != nil {
		return r
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &r)
	return r
}

// Issue 43 item 8, on the real stack: a group lock is not trusted twice
// after its holder's lapse. Two nodes run one grouped worker. One of them
// (X) is paused (SIGSTOP, its worker process left running) while a call of
// the group runs there, so X holds the group's lock; X stays paused past
// its membership TTL, the other node (Y) takes the lock and runs the
// group's messages; then X runs again, while messages keep coming to both
// nodes (through X's settle window, two heartbeat intervals). Across the
// whole run no two executions of the group overlap in time, no fencing
// token is handed out twice, and every message is answered.
func TestGroupLockHeldAcrossAPauseIsNotTrustedTwice(t *testing.T) {
	inTurn(t) // a stack of its own: it pauses a node

	const heartbeat = 2 * time.Second // membership TTL 6 s
	lockEnv := []string{"GROUP_LOCK_RETRY_BASE_DELAY_MS=5", "GROUP_LOCK_MAX_RETRIES=10", "WORKER_QUEUE_DEPTH=64", "NODE_HEARTBEAT=" + heartbeat.String()}
	e := newEnvWith(t, envConfig{nodeEnv: lockEnv})
	nodeB, _, bURL := e.startNodeBFull(t)
	dir := workerDir(t)
	logPath, enterPath, release := filepath.Join(dir, "calls.log"), filepath.Join(dir, "hold.enter"), filepath.Join(dir, "release")
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	group := "g-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	code := fmt.Sprintf(`
import json, os, time

def process(event):
    enter = time.time_ns()
    node = os.environ.get("WORKMANAGER_NODE_ID", "node-a")
    data = event.get("data") or {}
    if data.get("hold"):
        with open(%[1]q, "a") as f:
            f.write(node + " " + event["id"] + "\n")
        give_up = time.time() + 60
        while not os.path.exists(%[2]q) and time.time() < give_up:
            time.sleep(0.01)
    if data.get("sleep_ms"):
        time.sleep(data["sleep_ms"] / 1000.0)
    line = json.dumps({"w": "g", "id": event["id"], "enter": enter, "exit": time.time_ns(), "tok": event.get("fencingtoken"), "node": node})
    with open(%[3]q, "a") as f:
        f.write(line + "\n")
    return {"type": %[4]q, "data": {"in": event["id"], "node": node}}
`, enterPath, release, logPath, out)
	e.createWith(t, &pb.CreateWorkerRequest{Code: pyCode([]byte(code)), Topic: in, Group: group})
	var ids []string
	publish := func(prefix string, n int, every time.Duration) {
		for i := range n {
			id := fmt.Sprintf("%s-%d", prefix, i)
			ids = append(ids, id)
			e.publish(in, id, map[string]any{"sleep_ms": 50}, "")
			time.Sleep(every) // pacing, so that both nodes take messages
		}
	}
	answered := func() map[string]bool {
		m := map[string]bool{}
		for _, ev := range outs.all() {
			var d struct{ In string }
			if ev.DataAs(&d) == nil {
				m[d.In] = true
			}
		}
		return m
	}
	waitAnswered := func(what string) {
		t.Helper()
		waitFor(t, 3*time.Minute, what, func() bool {
			a := answered()
			for _, id := range ids {
				if !a[id] {
					return false
				}
			}
			return true
		})
	}
	publish("pre", 20, 100*time.Millisecond)
	waitAnswered("the answers to the first messages")

	// A call of the group runs on X: X holds the lock when it is paused.
	ids = append(ids, "hold")
	e.publish(in, "hold", map[string]any{"hold": true}, "")
	var x string
	waitFor(t, 60*time.Second, "the held call to start", func() bool {
		b, err := os.ReadFile(enterPath)
		x, _, _ = strings.Cut(string(b), " ")
		return err == nil && x != ""
	})
	pid, y, xID, yURL := e.node.Cmd.Process.Pid, "node-b", clusterSelf(t, e.nodeURL), bURL
	if x == "node-b" {
		pid, y, xID, yURL = nodeB.Cmd.Process.Pid, "node-a", "node-b", e.nodeURL
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
	paused := time.Now()
	// The call itself ends now (its process runs on), before the lock can
	// lapse: what X does with the lock afterwards is under test.
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	publish("lapse", 10, 200*time.Millisecond)
	waitFor(t, 30*time.Second, y+" to count "+x+" ("+xID+") gone", func() bool {
		c := healthAt(t, yURL).Checks[health.Cluster]
		return c.Status == health.Healthy && !strings.Contains(c.Detail, xID)
	})
	waitFor(t, 2*time.Minute, y+" to take the lock after "+x+"'s lapse", func() bool {
		n := 0
		for _, c := range calls(t, logPath) {
			if c.Node == y && c.Enter > paused.UnixNano() {
				n++
			}
		}
		return n >= 3
	})
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	t.Logf("%s paused %s holding group %s's lock; %s took it meanwhile", x, resumed.Sub(paused).Round(time.Second), group, y)
	publish("after", 60, 100*time.Millisecond) // 6 s: over X's settle window
	waitAnswered("every message answered")

	cs := calls(t, logPath)
	if o := overlaps(cs); o != 0 {
		t.Fatalf("%d overlapping executions inside group %s across the pause", o, group)
	}
	tokens, byID := map[string]bool{}, countByID(cs)
	for _, c := range cs {
		if c.Tok == "" || tokens[c.Tok] {
			t.Errorf("call of %s on %s: fencing token %q missing or handed out twice", c.ID, c.Node, c.Tok)
		}
		tokens[c.Tok] = true
	}
	xAfter := 0
	for _, c := range cs {
		if c.Node == x && c.Enter > resumed.UnixNano() {
			xAfter++
		}
	}
	for _, id := range ids {
		if byID[id] == 0 {
			t.Errorf("%s was answered but never run", id)
		}
	}
	var errs []string
	e.mu.Lock()
	for _, l := range e.lifecycle {
		if l.Type == lifecycleevents.TypePrefix+string(lifecycleevents.Error) {
			errs = append(errs, l.Data.ErrorType)
		}
	}
	e.mu.Unlock()
	t.Logf("%d messages, %d executions of the group without overlap; %s ran %d after it resumed; the held call ran %d time(s); error events %v",
		len(ids), len(cs), x, xAfter, byID["hold"], errs)
}

// clusterSelf is the cluster id of the node at url, from its /health
// ("node <id>; live nodes: …").
func clusterSelf(t *testing.T, url string) string {
	t.Helper()
	d := healthAt(t, url).Checks[health.Cluster].Detail
	id, _, ok := strings.Cut(strings.TrimPrefix(d, "node "), ";")
	if !strings.HasPrefix(d, "node ") || !ok || id == "" {
		t.Fatalf("no node id in the cluster check of %s: %q", url, d)
	}
	return id
}
