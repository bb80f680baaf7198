package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// redisKeys lists the WorkManager keys in the real Redis.
func (e *env) redisKeys(t *testing.T) []string {
	t.Helper()
	return strings.Fields(e.redisCLI(t, "--scan", "--pattern", "workmanager/*"))
}

type recoveryFixture struct {
	running, stopped, deleted string
	inRunning, inStopped      string
	inDeleted                 string
	outs                      map[string]string
}

// setupRecovery creates one RUNNING, one STOPPED and one deleted worker.
func setupRecovery(t *testing.T, e *env) recoveryFixture {
	f := recoveryFixture{inRunning: topicName(t, "run"), inStopped: topicName(t, "stop"), inDeleted: topicName(t, "del"), outs: map[string]string{}}
	for _, in := range []string{f.inRunning, f.inStopped, f.inDeleted} {
		f.outs[in] = in + "-out"
	}
	f.running = e.create(t, f.inRunning, echoWorker(f.outs[f.inRunning], "v1"))
	f.stopped = e.create(t, f.inStopped, echoWorker(f.outs[f.inStopped], "v1"))
	f.deleted = e.create(t, f.inDeleted, echoWorker(f.outs[f.inDeleted], "v1"))
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: f.stopped}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.DeleteWorker(ctxT(t), &pb.DeleteWorkerRequest{WorkerId: f.deleted}); err != nil {
		t.Fatal(err)
	}
	e.waitLifecycle(f.deleted, lifecycleevents.Deleted, 10*time.Second)
	return f
}

// checkRecovered asserts the saved states after a restart (node ready).
func checkRecovered(t *testing.T, e *env, f recoveryFixture) {
	t.Helper()
	list, err := e.client.ListWorkers(ctxT(t), &pb.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]pb.WorkerStatus{}
	for _, w := range list.GetWorkers() {
		got[w.GetWorkerId()] = w.GetStatus()
	}
	if len(got) != 2 || got[f.running] != pb.WorkerStatus_WORKER_STATUS_RUNNING || got[f.stopped] != pb.WorkerStatus_WORKER_STATUS_STOPPED {
		t.Fatalf("workers after restart: %v", got)
	}
	if _, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: f.deleted}); status.Code(err) != codes.NotFound {
		t.Fatalf("deleted worker: %v", err)
	}
	runOut := e.subscribe(f.outs[f.inRunning])
	e.publish(f.inRunning, "after-restart-1", map[string]any{"n": 1}, "c")
	e.publish(f.inStopped, "after-restart-2", map[string]any{"n": 2}, "c")
	e.publish(f.inDeleted, "after-restart-3", map[string]any{"n": 3}, "c")
	if d := decodeOut(t, expectEvent(t, runOut, 20*time.Second).Data()); d.Input["n"] != float64(1) {
		t.Fatalf("running worker output %+v", d)
	}
	// The stopped and the deleted worker came back unsubscribed: nothing
	// receives their topics (their inputs wait in the broker).
	e.waitUnsubscribed(t, e.stack.DaprHTTPAddr, f.inStopped)
	e.waitUnsubscribed(t, e.stack.DaprHTTPAddr, f.inDeleted)
}

// Done when 4 and 5 (node kill): workers come back in their saved state
// before /readyz passes; deleted ones stay gone.
func TestRecoveryAfterNodeKill(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnv(t, "")
	f := setupRecovery(t, e)
	e.killNode()
	e.startNode() // returns once /readyz passes
	checkRecovered(t, e, f)
	r, err := e.client.RecoverWorkers(ctxT(t), &pb.RecoverWorkersRequest{})
	if err != nil || r.GetRecovered() != 2 || r.GetFailed() != 0 {
		t.Fatalf("RecoverWorkers: %v %v", r, err)
	}
}

// Done when 5 (whole stack): stop and restart Redis, Temporal, daprd, node
// and API on the same data directory.
func TestRecoveryAfterWholeStackRestart(t *testing.T) {
	inTurn(t) // a stack of its own
	dir := t.TempDir()
	e := newEnvWith(t, envConfig{dir: dir, keepTemporalData: true})
	f := setupRecovery(t, e)
	ports := e.stack.Options
	e.stopAll()

	e2 := newEnvWith(t, envConfig{dir: dir, redisPort: ports.RedisPort, temporalPort: ports.TemporalPort, keepTemporalData: true})
	checkRecovered(t, e2, f)
}

// One broken worker does not stop the recovery of the others: its code is
// removed from the store behind WorkManager's back.
func TestRecoveryCountsBrokenWorker(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnv(t, "")
	good := e.create(t, topicName(t, "good"), echoWorker("x-out", "v1"))
	broken := e.create(t, topicName(t, "broken"), []byte("def process(event):\n    return None\n"))
	w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: broken})
	if err != nil {
		t.Fatal(err)
	}
	e.redisCLI(t, "DEL", "workmanager/code/"+w.GetCodeSha256())
	e.killNode()
	e.startNode()
	r, err := e.client.RecoverWorkers(ctxT(t), &pb.RecoverWorkersRequest{})
	if err != nil || r.GetRecovered() != 1 || r.GetFailed() != 1 {
		t.Fatalf("RecoverWorkers: %v %v", r, err)
	}
	if _, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: good}); err != nil {
		t.Fatal(err)
	}
	body := e.httpGet(t, "/health")
	if !strings.Contains(body, "could not be recovered") {
		t.Fatalf("/health does not report the broken worker: %s", body)
	}
}

// Done when 8: a hung worker is killed after the timeout, worker.error is
// published, and the worker keeps serving.
func testHungWorkerTimesOut(t *testing.T) {
	e := sharedEnv(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v1"))
	e.publish(in, "hang", map[string]any{"hang": true}, "")
	ev := e.waitLifecycleFor(id, lifecycleevents.Error, "hang", 20*time.Second)
	if ev.Data.ErrorType != "timeout" || ev.Data.Topic != in || ev.Data.Group != "g1" {
		t.Fatalf("error event %+v", ev.Data)
	}
	e.publish(in, "after-hang", map[string]any{"n": 7}, "")
	if d := decodeOut(t, expectEvent(t, outs, 20*time.Second).Data()); d.Input["n"] != float64(7) {
		t.Fatalf("output after hang %+v", d)
	}
	// A raising worker also reports worker.error with its exception. The
	// hung input's later attempts time out meanwhile and report theirs.
	e.publish(in, "fail", map[string]any{"fail": true}, "")
	ev = e.waitLifecycleFor(id, lifecycleevents.Error, "fail", 20*time.Second)
	if ev.Data.ErrorType != "worker_failed" || !strings.Contains(ev.Data.ErrorMessage, "asked to fail") {
		t.Fatalf("error event %+v", ev.Data)
	}
}

// The hot path survives a daprd restart: streams reconnect by themselves,
// /health says the broker is unreachable while daprd is gone, and no message
// is lost: those published before the kill (some in flight) and after the
// restart are all answered.
func TestStreamReconnectsAfterDaprdRestart(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnv(t, "")
	in, out := topicName(t, "in"), topicName(t, "out")
	e.create(t, in, echoWorker(out, "v1"))
	e.closeSubs()
	before := e.publishIDs(in, "before-0", "before-1", "before-2", "before-3", "before-4")
	e.stack.KillDaprd()
	t.Logf("broker check without daprd: %s", e.waitBroker(t, 15*time.Second, health.Degraded, ""))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.stack.StartDaprd(ctx); err != nil {
		t.Fatal(err)
	}
	e.waitBroker(t, 30*time.Second, health.Healthy, "")
	e.connectDapr()
	// A new consumer group reads the output stream from its start, so outputs
	// published before the kill are received too.
	o := &outputs{t: t, ch: e.subscribe(out), seen: map[string]bool{}}
	after := e.publishIDs(in, "after-0", "after-1", "after-2")
	o.expect(append(before, after...)...)
}

// Issue 43 item 2, on the real stack: a start-up recovery with one worker
// that cannot load on the restarted node (its import raises there), one
// that loads slowly (its import sleeps 8 s there) and several healthy ones
// finishes: the node turns ready, the healthy and the slow workers serve,
// the one that cannot load gets a not_recovered error event, and GetWorker
// says why it is not served ("not recovered: …", Worker.status_reason),
// until it loads again (here: a LoadCode of code that loads).
func TestRecoveryFinishesPastAWorkerThatCannotLoad(t *testing.T) {
	inTurn(t) // a stack of its own: it restarts the node
	e := newEnv(t, "")
	out := topicName(t, "out")
	outs := e.subscribe(out)
	topics := map[string]string{}
	create := func(name string, code []byte) string {
		in := topicName(t, name)
		id := e.create(t, in, code)
		topics[id] = in
		return id
	}
	var healthy []string
	for i := range 3 {
		healthy = append(healthy, create(fmt.Sprintf("ok%d", i), echoWorker(out, "v1")))
	}
	slow := create("slow", append([]byte("import os, time\nif os.environ.get('WM_TEST_REFUSE_LOAD'):\n    time.sleep(8)\n"), echoWorker(out, "v1")...))
	bad := create("bad", refusing(echoWorker(out, "v1")))

	// The node restarts where the bad worker's import raises.
	e.node.Stop(10 * time.Second)
	e.nodeEnv = append(e.nodeEnv, "WM_TEST_REFUSE_LOAD=1")
	began := time.Now()
	e.startNode() // returns once /readyz passes: recovery, then reconcile, finished
	t.Logf("the node was ready %s after its start (recovery included)", time.Since(began).Round(time.Second))

	for _, id := range append(healthy, slow) {
		e.publish(topics[id], "after-restart-"+id, map[string]any{"n": 1}, "")
		if d := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data()); d.Version != "v1" {
			t.Fatalf("output of %s: %+v", id, d)
		}
	}
	// The recovery announces it (not_recovered); the node's own reconcile
	// announces its load failure too (load_failed, once per record).
	for _, errorType := range []string{"not_recovered", "load_failed"} {
		var ev lifecycleEvent
		waitFor(t, 30*time.Second, "the "+errorType+" event of the worker that cannot load", func() bool {
			var ok bool
			ev, ok = e.errorEventOf(bad, errorType)
			return ok
		})
		if !strings.Contains(ev.Data.ErrorMessage, "this node cannot load me") {
			t.Fatalf("%s event %+v; want the import's error in it", errorType, ev.Data)
		}
	}
	w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: bad})
	if err != nil {
		t.Fatal(err)
	}
	if r := w.GetStatusReason(); !strings.HasPrefix(r, "not recovered: ") || !strings.Contains(r, "this node cannot load me") {
		t.Fatalf("status_reason of the worker that cannot load: %q; want \"not recovered: <why>\"", r)
	}
	t.Logf("GetWorker: status %s, status_reason %q", w.GetStatus(), w.GetStatusReason())
	for _, id := range append(healthy, slow) {
		if w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id}); err != nil || w.GetStatusReason() != "" {
			t.Fatalf("GetWorker of recovered worker %s: status_reason %q, %v; want none", id, w.GetStatusReason(), err)
		}
	}
	// A recovery run again finishes with the same count.
	r, err := e.client.RecoverWorkers(ctxT(t), &pb.RecoverWorkersRequest{})
	if err != nil || r.GetRecovered() != 4 || r.GetFailed() != 1 {
		t.Fatalf("RecoverWorkers: %v %v; want 4 recovered, 1 failed", r, err)
	}

	// Code that loads: the worker serves, and the reason is gone.
	if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: bad, Code: pyCode(echoWorker(out, "v2"))}); err != nil {
		t.Fatalf("LoadCode of code that loads: %v", err)
	}
	e.publish(topics[bad], "after-load", map[string]any{"n": 2}, "")
	if d := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data()); d.Version != "v2" {
		t.Fatalf("output after the load: %+v", d)
	}
	if w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: bad}); err != nil || w.GetStatusReason() != "" {
		t.Fatalf("GetWorker once the worker loaded: status_reason %q, %v; want none", w.GetStatusReason(), err)
	}
}
