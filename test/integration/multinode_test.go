package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Two nodes, each with its own daprd, share Temporal and Redis, with their
// periodic reconcile turned off: only the fan-out of each lifecycle change to
// every live node's task queue can bring a change to the node that did not
// run the Apply activity. A stop therefore silences both nodes as soon as it
// returns, a start revives both, and when one node dies the other keeps
// processing and keeps applying lifecycle operations (waiting at most the
// schedule-to-start timeout for the dead node until its membership expires).
func TestSecondNodeTakesOver(t *testing.T) {
	inTurn(t) // a stack of its own
	noReconcile := []string{"RECONCILE_INTERVAL=0"}
	e := newEnvWith(t, envConfig{nodeEnv: noReconcile})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sc, err := e.stack.StartSidecar(ctx, "daprd-b")
	if err != nil {
		t.Fatal(err)
	}
	nodeB, _ := e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := devstack.StartProc(e.dir, "node-b", e.withSandbox(append(append(e.stack.Env(), "DAPR_GRPC_ADDRESS="+sc.GRPCAddr,
			"WORKMANAGER_HTTP_ADDR="+addr, "WORKER_TIMEOUT=2s", "LOG_LEVEL=debug", "WORKMANAGER_NODE_ID=node-b", "NODE_HEARTBEAT=1s"), noReconcile...)),
			filepath.Join(e.bins, "worker"))
		if err != nil {
			return nil, err
		}
		return p, devstack.WaitHTTP(ctx, p, "http://"+addr+"/readyz", 90*time.Second)
	})
	defer nodeB.Kill()
	if m := members(t, e); !strings.Contains(m, `"node-b"`) {
		t.Fatalf("node B is not in the cluster: %s", m)
	}

	in, out := topicName(t, "in"), topicName(t, "out")
	o := &outputs{t: t, ch: e.subscribe(out), seen: map[string]bool{}}
	id := e.create(t, in, echoWorker(out, "v1"))
	publish := func(prefix string, n int) []string {
		var ids []string
		for i := range n {
			ids = append(ids, prefix+strconv.Itoa(i))
			e.publish(in, ids[i], map[string]any{"n": i}, "")
		}
		return ids
	}
	o.expect(publish("both-", 4)...)
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	// Neither node still runs it: both daprds dropped the subscription.
	e.waitUnsubscribed(t, e.stack.DaprHTTPAddr, in)
	e.waitUnsubscribed(t, sc.HTTPAddr, in)
	paused := publish("stopped-", 4)
	if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	o.expect(paused...)

	e.killNode() // node A is gone; only node B serves now
	o.expect(publish("after-kill-", 3)...)
	// Lifecycle operations run their activities on node B; the dead node is
	// skipped after its schedule-to-start timeout.
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	e.waitUnsubscribed(t, sc.HTTPAddr, in)
	e.waitUnsubscribed(t, e.stack.DaprHTTPAddr, in) // node A's stream died with it
	publish("while-stopped-", 1)

	// A node that stops cleanly leaves the cluster at once.
	nodeB.Stop(10 * time.Second)
	if m := members(t, e); strings.Contains(m, `"node-b"`) {
		t.Fatalf("node B stopped but is still a member: %s", m)
	}
}

// members reads the cluster membership through daprd's state API.
func members(t *testing.T, e *env) string {
	t.Helper()
	resp, err := http.Get("http://" + e.stack.DaprHTTPAddr + "/v1.0/state/" + devstack.StateName + "/" + url.PathEscape("workmanager/nodes"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("read members: HTTP %d %v %s", resp.StatusCode, err, b)
	}
	return string(b)
}

// outputs tracks the outputs of a topic by the input they answer. Delivery
// is at least once: a node killed between publishing an output and acking
// its input makes the input run again elsewhere, with the same output id.
// Repeats are therefore skipped, as consumers are told to do.
type outputs struct {
	t    *testing.T
	ch   <-chan event.Event
	seen map[string]bool // input ids answered
}

// input is the id of the input an output answers (outputs are
// "<input id>/<worker id>/<n>").
func input(ev event.Event) string { id, _, _ := strings.Cut(ev.ID(), "/"); return id }

// expect waits for an output for each of ids; anything else new fails.
func (o *outputs) expect(ids ...string) {
	o.t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	for len(want) > 0 {
		ev := expectEvent(o.t, o.ch, 30*time.Second)
		in := input(ev)
		switch {
		case want[in]:
			delete(want, in)
			o.seen[in] = true
		case !o.seen[in]:
			o.t.Fatalf("unexpected output %s while waiting for %v", ev.ID(), want)
		}
	}
}

// Issue 43 item 13 (c): a node that cannot load a worker's new code (its
// import raises there, WM_TEST_REFUSE_LOAD) does not leave the worker
// half-changed, and does not block later changes. Each LoadCode of such
// code ends one of two ways, both consistent: the change is persisted and
// every other node runs it while the failing node parks the worker (its
// messages go to the others), and the answer is UNAVAILABLE naming that
// node (the not_applied promise: code_updated is not announced while a
// live node runs the old code); or, when the load check or the Apply
// itself ran on the failing node, INVALID_ARGUMENT with the import's
// error and that node's id, and nothing changed. Code that every node loads is then applied
// everywhere and answered OK: the failing node does not make LoadCode
// fail for ever.
func TestLoadCodeThatOneNodeCannotLoad(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{})
	e.startNodeB(t, "WM_TEST_REFUSE_LOAD=1")
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v1"))
	serves := func(round int, want string) {
		t.Helper()
		for i := range 3 {
			e.publish(in, fmt.Sprintf("r%d-%d", round, i), map[string]any{"n": i}, "")
		}
		for range 3 {
			if d := decodeOut(t, expectEvent(t, outs, 60*time.Second).Data()); d.Version != want {
				t.Fatalf("round %d: output of %s, want %s", round, d.Version, want)
			}
		}
	}
	serves(0, "v1")
	version, current := int64(1), "v1"
	outcomes := map[codes.Code]int{}
	for round := 1; round <= 3; round++ {
		next := fmt.Sprintf("v%d", round+1)
		_, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: id, Code: pyCode(refusing(echoWorker(out, next)))})
		outcomes[status.Code(err)]++
		w, gerr := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id})
		if gerr != nil {
			t.Fatal(gerr)
		}
		switch status.Code(err) {
		case codes.Unavailable:
			if !strings.Contains(err.Error(), "node-b") {
				t.Fatalf("round %d: %v; want the failing node named", round, err)
			}
			version, current = version+1, next
		case codes.InvalidArgument:
			if !strings.Contains(err.Error(), "this node cannot load me") || !strings.Contains(err.Error(), "node node-b") {
				t.Fatalf("round %d: %v; want the import's error and the node it failed on", round, err)
			}
		default:
			t.Fatalf("round %d: LoadCode of code node B cannot load: %v; want UNAVAILABLE or INVALID_ARGUMENT", round, err)
		}
		if w.GetCodeVersion() != version {
			t.Fatalf("round %d (%v): worker at version %d, want %d", round, status.Code(err), w.GetCodeVersion(), version)
		}
		serves(round, current)
		t.Logf("round %d: %v; the worker serves %s", round, status.Code(err), current)
	}
	t.Logf("LoadCode of code one node cannot load, three times: %v", outcomes)
	if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: id, Code: pyCode(echoWorker(out, "v9"))}); err != nil {
		t.Fatalf("LoadCode of code every node loads, after the failures: %v", err)
	}
	serves(9, "v9")
}
