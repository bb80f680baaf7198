package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/services/api"
	"github.com/virtufin/workmanager/services/reconcile"
)

// Issue 33 item 1, as a new user would try it: two concurrent CreateWorker
// calls with one name and different code (with different request ids, and
// with none) give one OK and one ALREADY_EXISTS, the loser promptly (not
// after the operation timeout), and the events are answered by the OK'd
// caller's code.
func TestConcurrentNamedCreatesRunTheAnsweredCode(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnv(t, "")
	const rounds = 3
	for _, withRequestIDs := range []bool{true, false} {
		for round := range rounds {
			in, out := topicName(t, fmt.Sprintf("in%d", round)), topicName(t, fmt.Sprintf("out%d", round))
			outs := e.subscribe(out)
			name := "race-" + uuid.NewString()[:8]
			type answer struct {
				version string
				id      string
				err     error
				took    time.Duration
			}
			answers := make([]answer, 2)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i, version := range []string{"a", "b"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := &pb.CreateWorkerRequest{Name: name, MimeType: "text/x-python", Topic: in, Group: "g1",
						Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: echoWorker(out, version)}}}
					if withRequestIDs {
						req.RequestId = fmt.Sprintf("%s-%s", name, version)
					}
					<-start
					began := time.Now()
					resp, err := e.client.CreateWorker(ctxT(t), req)
					answers[i] = answer{version: version, id: resp.GetWorkerId(), err: err, took: time.Since(began)}
				}()
			}
			close(start)
			wg.Wait()

			var ok *answer
			for i := range answers {
				a := &answers[i]
				switch status.Code(a.err) {
				case codes.OK:
					if ok != nil {
						t.Fatalf("request ids %v, round %d: both creates were answered OK: %+v", withRequestIDs, round, answers)
					}
					ok = a
				case codes.AlreadyExists:
					if a.took > 20*time.Second {
						t.Fatalf("request ids %v, round %d: the losing create waited %s for ALREADY_EXISTS", withRequestIDs, round, a.took)
					}
				default:
					t.Fatalf("request ids %v, round %d: create %s answered %v after %s", withRequestIDs, round, a.version, a.err, a.took)
				}
			}
			if ok == nil {
				t.Fatalf("request ids %v, round %d: no create was answered OK: %+v", withRequestIDs, round, answers)
			}
			for _, a := range answers {
				t.Logf("request ids %v, round %d: create %s answered %v after %s", withRequestIDs, round, a.version, status.Code(a.err), a.took.Round(time.Millisecond))
			}

			w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: ok.id})
			if err != nil || w.GetCodeVersion() != 1 || w.GetName() != name {
				t.Fatalf("worker %v, %v: want version 1 named %s", w, err, name)
			}
			e.publish(in, "m-"+uuid.NewString(), map[string]any{"round": round}, "")
			got := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data())
			if got.Version != ok.version {
				t.Fatalf("request ids %v, round %d: caller %s was told OK but code %s answered the event", withRequestIDs, round, ok.version, got.Version)
			}
		}
	}
}

// Issue 43 item 1, on the real stack: a stale Apply does not resurrect a
// deleted worker. Two nodes; the create's Apply runs on one of them (X)
// and is held just before it writes the record (WM_TEST_STATE_HOLD_FILE,
// a test-only hook on the node's catalog store: the Put of the listed key
// waits), and X is then really paused (SIGSTOP). Its attempt times out —
// Apply runs as a local activity in the workflow task (epoch 5), so the
// task times out (10 s) and the other node (Y) runs the task and its Apply
// again; an Apply activity (older runs, or the local attempt failed)
// times out on its heartbeat (20 s) and is retried on Y — the create
// completes and the worker serves; the worker is deleted. Then X resumes
// and its write goes ahead (the hook lets it through even if the attempt's
// context was cancelled meanwhile, as a write already on its way would):
// the store refuses it (the tombstone), no record comes back, no node
// serves the worker, and Stop and Delete answer NOT_FOUND as for any
// deleted worker.
func TestStaleApplyDoesNotResurrectADeletedWorker(t *testing.T) {
	inTurn(t) // a stack of its own: it pauses a node
	hold := filepath.Join(t.TempDir(), "hold")
	// The paused node's open long polls may still be handed the Apply's
	// retries (each then fails on its heartbeat, 20 s): with the server's
	// default of a minute the create took 83 s once; 10 s bounds it (as in
	// TestStopWaitsForPausedMemberAndLapsedNodeServesNothing).
	e := newEnvWith(t, envConfig{nodeEnv: []string{"WM_TEST_STATE_HOLD_FILE=" + hold}, apiEnv: []string{"WORKMANAGER_OPERATION_TIMEOUT=3m"},
		temporalDynamicConfig: []string{`matching.longPollExpirationInterval="10s"`}})
	nodeB, scB, bURL := e.startNodeBFull(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	rid := "stale-apply-" + uuid.NewString()[:8]
	id := api.RequestWorkerID(tenant.Default, rid)
	key := "workmanager/workers/" + id
	if err := os.WriteFile(hold, []byte(key+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	created := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		_, err := e.client.CreateWorker(ctx, &pb.CreateWorkerRequest{RequestId: rid, MimeType: "text/x-python", Topic: in,
			Code: pyCode(echoWorker(out, "v1"))})
		created <- err
	}()
	var pidHeld int
	waitFor(t, 90*time.Second, "the create's Apply held before its record write", func() bool {
		b, err := os.ReadFile(hold + ".held")
		pidHeld, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pidHeld != 0
	})
	x, xURL := "node A", e.nodeURL
	switch pidHeld {
	case nodeB.Cmd.Process.Pid:
		x, xURL = "node B", bURL
	case e.node.Cmd.Process.Pid:
	default:
		t.Fatalf("the held write is in process %d, neither node", pidHeld)
	}
	if err := syscall.Kill(pidHeld, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pidHeld, syscall.SIGCONT) })
	paused := time.Now()
	// Released while X is paused: X's write goes ahead only when it runs
	// again; the retry on the other node is not held.
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s paused holding the create's Apply (before its record write)", x)
	if err := <-created; err != nil {
		t.Fatalf("CreateWorker with %s paused in its Apply: %v", x, err)
	}
	t.Logf("the create completed %s after the pause", time.Since(paused).Round(time.Second))
	published := time.Now()
	e.publish(in, "while-paused", map[string]any{"n": 1}, "")
	// The paused node's daprd may have read it, and may claim it again at
	// each redelivery (Redis hands a pending message to whichever daprd
	// scans first after processingTimeout, 6 s here; daprd's streaming
	// handler stays blocked on a paused app, so it never gives up on it):
	// a coin toss every ~7 s. 30 s failed CI once; 120 s is 17 tosses.
	if d := decodeOut(t, expectEvent(t, outs, 120*time.Second).Data()); d.Version != "v1" {
		t.Fatalf("output %+v", d)
	}
	t.Logf("its first output came %s after its publish", time.Since(published).Round(time.Millisecond))
	if _, err := e.client.DeleteWorker(ctxT(t), &pb.DeleteWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	e.waitLifecycle(id, lifecycleevents.Deleted, 30*time.Second)
	if _, err := os.Stat(hold + ".done"); err == nil {
		t.Fatal("the held write went ahead while its node was paused")
	}

	if err := syscall.Kill(pidHeld, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s resumed %s after its pause", x, time.Since(paused).Round(time.Second))
	var done string
	waitFor(t, 30*time.Second, "the held write to go ahead", func() bool {
		b, err := os.ReadFile(hold + ".done")
		done = string(b)
		return err == nil && strings.Count(done, "\n") >= 2
	})
	if !strings.HasPrefix(done, key+"\n") || strings.HasSuffix(done, "<nil>\n") {
		t.Fatalf("the stale record write of %s: %q; want it refused by the store", x, done)
	}
	t.Logf("the stale write, made when %s ran again, was refused: %s", x, strings.ReplaceAll(strings.TrimSpace(done), "\n", ": "))
	waitFor(t, 60*time.Second, x+" a member again and reconciled", func() bool {
		c, ok := healthAt(t, xURL).Checks[reconcile.Membership]
		return ok && c.Status == health.Healthy && strings.Contains(c.Detail, "reconciled")
	})

	// The record stays a tombstone, and the API knows the worker as deleted.
	if rec := stateValue(t, e, key); !strings.Contains(rec, `"deleted":true`) {
		t.Fatalf("the worker's record after the stale write: %s; want its tombstone", rec)
	}
	if _, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id}); status.Code(err) != codes.NotFound {
		t.Fatalf("GetWorker of the deleted worker: %v; want NOT_FOUND", err)
	}
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); status.Code(err) != codes.NotFound {
		t.Fatalf("StopWorker of the deleted worker: %v; want NOT_FOUND", err)
	}
	if _, err := e.client.DeleteWorker(ctxT(t), &pb.DeleteWorkerRequest{WorkerId: id}); status.Code(err) != codes.NotFound {
		t.Fatalf("DeleteWorker of the deleted worker: %v; want NOT_FOUND", err)
	}
	list, err := e.client.ListWorkers(ctxT(t), &pb.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range list.GetWorkers() {
		if w.GetWorkerId() == id {
			t.Fatalf("ListWorkers lists the deleted worker: %v", w)
		}
	}
	// No node serves it: neither daprd holds a subscription to its topic,
	// and what is published there gets no output (a bounded wait over two
	// of Redis' 6 s redeliveries, after the paused node reconciled).
	e.waitUnsubscribed(t, e.stack.DaprHTTPAddr, in)
	e.waitUnsubscribed(t, scB.HTTPAddr, in)
	e.publish(in, "after-resume", map[string]any{"n": 2}, "")
	select {
	case ev := <-outs:
		t.Fatalf("the deleted worker answered: %s", ev.ID())
	case <-time.After(15 * time.Second):
	}
}

// stateValue reads key from the stack's state store through daprd ("" when
// absent).
func stateValue(t *testing.T, e *env, key string) string {
	t.Helper()
	resp, err := http.Get("http://" + e.stack.DaprHTTPAddr + "/v1.0/state/" + devstack.StateName + "/" + url.PathEscape(key))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("read %s: HTTP %d %v %s", key, resp.StatusCode, err, b)
	}
	return string(b)
}
