package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Issue 10 on the real stack (the node in SANDBOX=strict): a denied import
// is refused at CreateWorker with nothing created; a worker's attempts to
// read the node's environment and files, reach daprd or Redis, forge a
// lifecycle event and flood the log are blocked or contained, each with
// its error; the other worker on the topic keeps serving every message;
// /health reports the layers.
func TestSandboxOnTheRealStack(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{nodeEnv: []string{"WORKER_MAX_ATTEMPTS=1", "WORKER_LOG_LINES_PER_SECOND=20"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))

	// 1. A module-level import outside the allowlist: INVALID_ARGUMENT.
	_, err := e.client.CreateWorker(ctxT(t), &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: in, Name: "sneaky",
		Code: pyCode([]byte("import socket\ndef process(event):\n    return None\n"))})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "import of 'socket' is not allowed") ||
		!strings.Contains(err.Error(), "PYTHON_ALLOWED_PACKAGES") {
		t.Fatalf("CreateWorker with a denied import: %v", err)
	}
	if _, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: "sneaky"}); status.Code(err) != codes.NotFound {
		t.Fatalf("the refused worker exists: %v", err)
	}

	// 2. The escape attempts, one per message, each reported as an output.
	nodePID := e.node.Cmd.Process.Pid
	escaper := e.createWith(t, &pb.CreateWorkerRequest{Topic: in, Code: pyCode([]byte(fmt.Sprintf(`
import os

def attempt(kind):
    if kind == "env":
        return sorted(os.environ)
    if kind == "node-environ":
        return open("/proc/%d/environ").read()
    if kind == "node-files":
        return os.listdir(%q)
    if kind == "daprd":
        __import__("socket")
    if kind == "kill-node":
        os.kill(%d, 9)
    return "?"

def process(event):
    kind = event["data"]["kind"]
    if kind == "forge":
        return {"type": "workmanager.lifecycle", "data": {"worker_id": "victim", "type": "deleted"}}
    if kind == "flood":
        for i in range(5000):
            print("flood line", i)
        return {"type": %q, "data": {"kind": kind, "result": "flooded"}}
    try:
        r = repr(attempt(kind))
    except BaseException as e:
        r = "%%s: %%s" %% (type(e).__name__, e)
    return {"type": %q, "data": {"kind": kind, "result": r}}
`, nodePID, e.bins, nodePID, out, out)))})
	e.createWith(t, &pb.CreateWorkerRequest{Topic: in, Code: pyCode([]byte(fmt.Sprintf(
		"def process(event):\n    return {\"type\": %q, \"data\": {\"kind\": \"echo\", \"id\": event[\"id\"]}}\n", out)))})
	kinds := []string{"env", "node-environ", "node-files", "daprd", "kill-node", "forge", "flood"}
	for _, k := range kinds {
		e.publish(in, "m-"+k, map[string]any{"kind": k}, "")
	}
	results := map[string]string{}
	echoes := 0
	collectResults := func() {
		results, echoes = map[string]string{}, 0
		for _, ev := range outs.all() {
			var d struct{ Kind, Result string }
			_ = json.Unmarshal(ev.Data(), &d)
			if d.Kind == "echo" {
				echoes++
			} else {
				results[d.Kind] = d.Result
			}
		}
	}
	defer func() {
		if t.Failed() {
			t.Logf("results %v, %d echoes", results, echoes)
		}
	}()
	waitFor(t, time.Minute, "the escaper's answers and the echo worker's outputs", func() bool {
		collectResults()
		return echoes >= len(kinds) && len(results) >= len(kinds)-1 // the forged output is never published
	})
	for kind, want := range map[string]string{
		"env":          "VIRTUFIN_WORKER_ID",
		"node-environ": "FileNotFoundError",
		"node-files":   "FileNotFoundError",
		"daprd":        "import of 'socket' is not allowed",
		"kill-node":    "PermissionError",
		"flood":        "flooded",
	} {
		if !strings.Contains(results[kind], want) {
			t.Errorf("%s: %q, want it to contain %q", kind, results[kind], want)
		}
	}
	if strings.Contains(results["env"], "DAPR") || strings.Contains(results["env"], "TEMPORAL") {
		t.Errorf("the worker sees the node's environment: %s", results["env"])
	}
	if echoes != len(kinds) {
		t.Errorf("the echo worker answered %d of %d messages", echoes, len(kinds))
	}

	// The forged lifecycle event went nowhere but to the dead letters.
	// (The dead letter is stored after the attempt's log line and the
	// other outputs: wait for it.)
	var dl *pb.ListDeadLettersResponse
	waitFor(t, 20*time.Second, "the escaper's dead letter", func() bool {
		dl, err = e.client.ListDeadLetters(ctxT(t), &pb.ListDeadLettersRequest{WorkerId: escaper})
		return err != nil || len(dl.GetDeadLetters()) > 0
	})
	if err != nil || len(dl.GetDeadLetters()) != 1 || dl.GetDeadLetters()[0].GetReason() != "output_policy" ||
		!strings.Contains(dl.GetDeadLetters()[0].GetError(), `topic "workmanager.lifecycle" is reserved`) {
		t.Fatalf("dead letters of the escaper: %v %v", dl, err)
	}
	if forged := e.lifecycleFor("victim"); len(forged) > 0 {
		t.Fatalf("forged lifecycle events were published: %v", forged)
	}
	// The flood was cut to the budget, and said so.
	waitFor(t, 10*time.Second, "the drop notice in the node's log", func() bool {
		return strings.Contains(e.node.Output(), "worker log lines dropped")
	})
	if n := strings.Count(e.node.Output(), "flood line"); n >= 5000 || n == 0 {
		t.Errorf("%d of 5000 flood lines logged; want the budget's worth", n)
	}

	// /health names the layers; the node still serves.
	resp, err := http.Get(e.nodeURL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var h struct {
		Checks map[string]struct{ Status, Detail string } `json:"checks"`
	}
	if err := json.Unmarshal(body, &h); err != nil || h.Checks["sandbox"].Status != "Healthy" ||
		!strings.Contains(h.Checks["sandbox"].Detail, "SANDBOX=strict; layers on: namespaces, user, seccomp, limits, environment, descriptors, memory") {
		t.Fatalf("/health sandbox check: %s", body)
	}
}
