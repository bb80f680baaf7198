package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
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
