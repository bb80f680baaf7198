package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Spare runners on the real stack (PYTHON_SPARE_RUNNERS, on by default; the
// other tests' nodes share a writable path, which turns them off): workers
// created, reloaded, stopped and started on a node that keeps spares are
// served by spares (the node's log says so), each answering with its own
// worker id and the version the last call put in place.
func TestSpareRunnersOnTheRealStack(t *testing.T) {
	e := newEnvWith(t, envConfig{nodeEnv: []string{"SANDBOX_WRITABLE_PATHS="}})
	out := topicName(t, "out")
	outs := e.subscribe(out)
	code := func(version string) []byte {
		return []byte(fmt.Sprintf(`
import os

def process(event):
    return {"type": %q, "data": {"version": %q, "worker": os.environ.get("VIRTUFIN_WORKER_ID"), "in": event["data"]}}
`, out, version))
	}
	type answer struct{ Version, Worker, In string }
	ask := func(topic, in string) answer {
		t.Helper()
		e.publish(topic, in, in, "")
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
			var a answer
			if err := json.Unmarshal(expectEvent(t, outs, time.Until(deadline)).Data(), &a); err != nil {
				t.Fatal(err)
			}
			if a.In == in {
				return a
			}
		}
		t.Fatalf("no answer to %s", in)
		return answer{}
	}
	create := func(topic string) string {
		t.Helper()
		resp, err := e.client.CreateWorker(ctxT(t), &pb.CreateWorkerRequest{Topic: topic, MimeType: "text/x-python", Code: pyCode(code("v1"))})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetWorkerId()
	}
	inA, inB := topicName(t, "a"), topicName(t, "b")
	a := create(inA)
	if got := ask(inA, "a1"); got.Version != "v1" || got.Worker != a {
		t.Fatalf("a: %+v, want v1 of %s", got, a)
	}
	b := create(inB) // the spares started after a
	if got := ask(inB, "b1"); got.Version != "v1" || got.Worker != b {
		t.Fatalf("b: %+v, want v1 of %s", got, b)
	}
	if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: a, Code: pyCode(code("v2"))}); err != nil {
		t.Fatal(err)
	}
	if got := ask(inA, "a2"); got.Version != "v2" || got.Worker != a {
		t.Fatalf("a after LoadCode: %+v, want v2 of %s", got, a)
	}
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: b}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: b}); err != nil {
		t.Fatal(err)
	}
	if got := ask(inB, "b2"); got.Version != "v1" || got.Worker != b {
		t.Fatalf("b after stop and start: %+v, want v1 of %s", got, b)
	}
	taken := strings.Count(e.node.Output(), "python engine: a spare runner taken")
	if taken == 0 {
		t.Fatal("no spare runner was taken: the node's log never says so")
	}
	t.Logf("%d spare runners taken", taken)
}
