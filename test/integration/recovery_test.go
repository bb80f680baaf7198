package integration

import (
	"context"
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
	ev := e.waitLifecycle(id, lifecycleevents.Error, 20*time.Second)
	if ev.Data.ErrorType != "timeout" || ev.Data.Topic != in || ev.Data.Group != "g1" {
		t.Fatalf("error event %+v", ev.Data)
	}
	e.publish(in, "after-hang", map[string]any{"n": 7}, "")
	if d := decodeOut(t, expectEvent(t, outs, 20*time.Second).Data()); d.Input["n"] != float64(7) {
		t.Fatalf("output after hang %+v", d)
	}
	// A raising worker also reports worker.error with its exception.
	e.mu.Lock()
	e.lifecycle = nil
	e.mu.Unlock()
	e.publish(in, "fail", map[string]any{"fail": true}, "")
	ev = e.waitLifecycle(id, lifecycleevents.Error, 20*time.Second)
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
