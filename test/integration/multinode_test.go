package integration

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Two nodes, each with its own daprd, share Temporal and Redis. A worker
// created through either reaches both (the node that runs the activity at
// once, the other by its periodic reconcile); when one node dies the other
// keeps processing, and lifecycle operations keep working through it.
func TestSecondNodeTakesOver(t *testing.T) {
	e := newEnv(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sc, err := e.stack.StartSidecar(ctx, "daprd-b")
	if err != nil {
		t.Fatal(err)
	}
	nodeB, _ := e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := devstack.StartProc(e.dir, "node-b", append(e.stack.Env(), "DAPR_GRPC_ADDRESS="+sc.GRPCAddr,
			"WORKMANAGER_HTTP_ADDR="+addr, "WORKER_TIMEOUT=2s", "RECONCILE_INTERVAL=1s", "LOG_LEVEL=debug"), filepath.Join(e.bins, "worker"))
		if err != nil {
			return nil, err
		}
		return p, devstack.WaitHTTP(ctx, p, "http://"+addr+"/readyz", 90*time.Second)
	})
	defer nodeB.Kill()

	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v1"))
	time.Sleep(3 * time.Second) // > node B's reconcile interval

	e.killNode() // node A is gone; only node B serves now
	for i := range 3 {
		e.publish(in, "after-kill-"+strconv.Itoa(i), map[string]any{"n": i}, "")
	}
	for range 3 {
		expectEvent(t, outs, 30*time.Second)
	}
	// Lifecycle operations run their activities on node B.
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	e.publish(in, "while-stopped", map[string]any{"n": 9}, "")
	expectNoEvent(t, outs, 3*time.Second)
}
