package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 44 item 1, done when: an in-process native worker that segfaults
// on one event leaves the stack serving every other worker (a node restart
// at most), the event is dead-lettered `crashed` after at most two crashes,
// the worker is quarantined with its reason in GetWorker, and the node
// started again comes up. The node runs under devstack's Supervisor, as
// `make run` runs it (restarted with backoff when it dies).
func TestInProcessNativeCrashIsQuarantined(t *testing.T) {
	inTurn(t) // a stack of its own: its node dies
	e := newEnvWith(t, envConfig{nodeEnv: []string{"NATIVE_ISOLATION=in-process", "WORKMANAGER_NODE_ID=crash-node"}})
	// The harness's node hands over to a supervised one with the same id
	// (as make run restarts its node "local").
	e.node.Stop(30 * time.Second)
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	e.nodeURL = "http://" + addr
	var mu sync.Mutex
	var reports []string
	sup := &devstack.Supervisor{Name: "worker node", JournalDir: e.stack.NodeStateDir(), Base: 200 * time.Millisecond,
		Start: func() (*devstack.Proc, error) {
			return e.stack.StartNode(filepath.Join(e.bins, "worker"), addr,
				e.withSandbox(append([]string{"WORKER_TIMEOUT=2s", "RECONCILE_INTERVAL=5s", "NODE_HEARTBEAT=1s", "LOG_LEVEL=debug", testCodeURLs}, e.nodeEnv...))...)
		},
		Say: func(l string) {
			mu.Lock()
			reports = append(reports, l)
			mu.Unlock()
			t.Log("supervisor: " + l)
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sup.Run(ctx, func(p *devstack.Proc) { p.Stop(30 * time.Second) }) }()
	t.Cleanup(func() { cancel(); <-done })
	ready := func() bool {
		resp, err := http.Get(e.nodeURL + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	waitFor(t, 3*time.Minute, "the supervised node ready", ready)

	inA, inB := topicName(t, "a"), topicName(t, "b")
	outA, outB := topicName(t, "a-out"), topicName(t, "b-out")
	crashing := nativePackageOf(t, "native_worker.c", `-DVERSION="v1"`, fmt.Sprintf(`-DOUT_TYPE="%s"`, outA), `-DCRASH_ON="boom"`)
	fixed := nativePackageOf(t, "native_worker.c", `-DVERSION="v2"`, fmt.Sprintf(`-DOUT_TYPE="%s"`, outA))
	steady := nativePackageOf(t, "native_worker.c", `-DVERSION="v1"`, fmt.Sprintf(`-DOUT_TYPE="%s"`, outB))
	create := func(code []byte, topic string) string {
		t.Helper()
		resp, err := e.client.CreateWorker(ctxT(t), &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: code}},
			MimeType: "application/x-native-dll", Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetWorkerId()
	}
	a, b := create(crashing, inA), create(steady, inB)
	outsA, outsB, deadA := e.subscribe(outA), e.subscribe(outB), e.subscribe(inA+"-dead")
	expectFrom := func(ch <-chan event.Event, id, version string) {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			ev := expectEvent(t, ch, time.Until(deadline))
			var o nativeOut
			if json.Unmarshal(ev.Data(), &o) == nil && o.ID == id && o.Version == version {
				return
			}
		}
		t.Fatalf("no output of %s for %s", version, id)
	}
	e.publishEvent(inA, map[string]any{"id": "fine-1", "type": "t", "datacontenttype": "application/json", "data": map[string]int{"n": 1}})
	e.publishEvent(inB, map[string]any{"id": "b-1", "type": "t", "datacontenttype": "application/json", "data": map[string]int{"n": 1}})
	expectFrom(outsA, "fine-1", "v1")
	expectFrom(outsB, "b-1", "v1")

	// The poison event: the node dies on it, is restarted, dies again on
	// its redelivery, and at the next start the event is dead-lettered as
	// crashed without running a third time, the worker quarantined.
	e.publishEvent(inA, map[string]any{"id": "boom", "type": "t", "datacontenttype": "application/json", "data": map[string]int{"n": 2}})
	dead := expectEvent(t, deadA, 3*time.Minute)
	if x := dead.Extensions(); x["deadletterreason"] != "crashed" || x["deadletterworker"] != a || dead.ID() != "boom" {
		t.Fatalf("dead letter %s with %v; want boom, reason crashed, worker %s", dead.ID(), x, a)
	}
	if n := sup.Restarts(); n < 1 || n > 2 {
		t.Fatalf("the node was restarted %d times; want 1 or 2 (at most two crashes)", n)
	}
	mu.Lock()
	first := reports[0]
	mu.Unlock()
	if !strings.Contains(first, "worker "+a+" event boom (crash journal)") || !strings.Contains(first, "SIGSEGV") {
		t.Fatalf("the supervisor's report does not name the worker and event: %q", first)
	}
	log, _ := os.ReadFile(filepath.Join(e.dir, "node.log"))
	if !strings.Contains(string(log), "the node crashed while an in-process native worker ran an event") || !strings.Contains(string(log), "event_id=boom") {
		t.Fatal("the restarted node's log does not name the crash's worker and event")
	}
	// The node died twice within seconds, once during its own recovery:
	// what the dead process held (its recovery's activity, its sticky
	// workflow tasks) comes back after its timeouts.
	waitFor(t, 90*time.Second, "the node ready after its restart", ready)

	// Quarantined: GetWorker says why, an error lifecycle event too.
	var reason string
	waitFor(t, 30*time.Second, "status_reason quarantined", func() bool {
		w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: a})
		if err != nil {
			t.Fatal(err)
		}
		reason = w.GetStatusReason()
		return strings.Contains(reason, "quarantined: crashed the node")
	})
	if !strings.Contains(reason, "(last event boom)") || !strings.Contains(reason, "reload or start it to try again") {
		t.Fatalf("status_reason %q", reason)
	}
	waitFor(t, 30*time.Second, "the quarantine's error lifecycle event", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, ev := range e.lifecycle {
			if ev.Data.WorkerID == a && ev.Type == lifecycleevents.TypePrefix+string(lifecycleevents.Error) && ev.Data.ErrorType == "quarantined" {
				return true
			}
		}
		return false
	})

	// The other worker on the node serves on, not quarantined.
	e.publishEvent(inB, map[string]any{"id": "b-2", "type": "t", "datacontenttype": "application/json", "data": map[string]int{"n": 3}})
	expectFrom(outsB, "b-2", "v1")
	if wb, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: b}); err != nil || wb.GetStatusReason() != "" {
		t.Fatalf("the other worker: %v, status_reason %q", err, wb.GetStatusReason())
	}

	// A LoadCode lifts the quarantine: the fixed code runs the worker's
	// events again.
	if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: a, Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: fixed}}}); err != nil {
		t.Fatal(err)
	}
	w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: a})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(w.GetStatusReason(), "quarantined") {
		t.Fatalf("still quarantined after LoadCode: %q", w.GetStatusReason())
	}
	e.publishEvent(inA, map[string]any{"id": "fine-2", "type": "t", "datacontenttype": "application/json", "data": map[string]int{"n": 4}})
	expectFrom(outsA, "fine-2", "v2")
	if n := sup.Restarts(); n > 2 {
		t.Fatalf("the node was restarted %d times", n)
	}
}
