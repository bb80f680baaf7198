package integration

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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
	noReconcile := []string{"RECONCILE_INTERVAL=0"}
	e := newEnvWith(t, envConfig{nodeEnv: noReconcile})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sc, err := e.stack.StartSidecar(ctx, "daprd-b")
	if err != nil {
		t.Fatal(err)
	}
	nodeB, _ := e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := devstack.StartProc(e.dir, "node-b", append(append(e.stack.Env(), "DAPR_GRPC_ADDRESS="+sc.GRPCAddr,
			"WORKMANAGER_HTTP_ADDR="+addr, "WORKER_TIMEOUT=2s", "LOG_LEVEL=debug", "WORKMANAGER_NODE_ID=node-b", "NODE_HEARTBEAT=1s"), noReconcile...),
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
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v1"))
	for i := range 4 {
		e.publish(in, "both-"+strconv.Itoa(i), map[string]any{"n": i}, "")
	}
	for range 4 {
		expectEvent(t, outs, 30*time.Second)
	}
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		e.publish(in, "stopped-"+strconv.Itoa(i), map[string]any{"n": i}, "")
	}
	expectNoEvent(t, outs, 3*time.Second) // neither node still runs it
	if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	for range 4 { // the paused messages
		expectEvent(t, outs, 30*time.Second)
	}

	e.killNode() // node A is gone; only node B serves now
	for i := range 3 {
		e.publish(in, "after-kill-"+strconv.Itoa(i), map[string]any{"n": i}, "")
	}
	for range 3 {
		expectEvent(t, outs, 30*time.Second)
	}
	// Lifecycle operations run their activities on node B; the dead node is
	// skipped after its schedule-to-start timeout.
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	e.publish(in, "while-stopped", map[string]any{"n": 9}, "")
	expectNoEvent(t, outs, 3*time.Second)

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
