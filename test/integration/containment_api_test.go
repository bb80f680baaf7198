package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// TestGatewayIsNoProxyToDaprd: issue 32 item 1 on the real stack (daprd
// without DAPR_API_TOKEN, the node in SANDBOX=strict). A Python worker with
// the default policy (no allowed_gateway_targets) tries what the review
// did: call_gateway with daprd's own HTTP address as the service, to read
// state in bulk and to publish a forged lifecycle event; WorkManager's own
// app id; a method that climbs with a query. Each raises GatewayError; no
// state comes back and no forged event is published. The worker's code
// cannot reach daprd's API directly either: with `socket` allowed by the
// guard, a connection to daprd's port fails in the sandbox's network
// namespace.
func TestGatewayIsNoProxyToDaprd(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnvWith(t, envConfig{nodeEnv: []string{"WORKER_MAX_ATTEMPTS=1", "PYTHON_ALLOWED_PACKAGES=os,socket"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))

	// A secret in the state store that the worker must not read.
	const secretKey, secret = "workmanager/test-secret", "s3cr3t-value-32"
	body, _ := json.Marshal([]map[string]any{{"key": secretKey, "value": secret}})
	resp, err := http.Post(fmt.Sprintf("http://%s/v1.0/state/%s", e.stack.DaprHTTPAddr, devstack.StateName), "application/json", bytes.NewReader(body))
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("seeding the state store: %v %v", resp, err)
	}
	resp.Body.Close()

	daprd := "http://" + e.stack.DaprHTTPAddr
	_, port, _ := strings.Cut(e.stack.DaprHTTPAddr, ":")
	e.createWith(t, &pb.CreateWorkerRequest{Topic: in, Code: pyCode([]byte(fmt.Sprintf(`
import virtufin_host

def attempt(kind):
    if kind == "state-bulk":
        return virtufin_host.call_gateway(%[1]q, "v1.0/state/%[2]s/bulk", {"keys": [%[3]q]})
    if kind == "state-bulk-https":
        return virtufin_host.call_gateway(%[1]q.replace("http:", "https:"), "v1.0/state/%[2]s/bulk", {"keys": [%[3]q]})
    if kind == "publish-lifecycle":
        return virtufin_host.call_gateway(%[1]q, "v1.0/publish/%[4]s/workmanager.lifecycle",
            {"worker_id": "victim-gw", "type": "deleted"})
    if kind == "own-app":
        return virtufin_host.call_gateway("workmanager", "v1.0/state/%[2]s")
    if kind == "climb":
        return virtufin_host.call_gateway("admin", "admin/../internal?debug=1")
    if kind == "encoded":
        return virtufin_host.call_gateway("admin", "x/%%2e%%2e/v1.0/state/%[2]s")
    if kind == "socket-daprd":
        import socket
        s = socket.create_connection(("127.0.0.1", %[5]s), timeout=2)
        s.sendall(b"GET /v1.0/metadata HTTP/1.0\r\n\r\n")
        return s.recv(200)
    return "?"

def process(event):
    kind = event["data"]["kind"]
    try:
        r = "answered: " + repr(attempt(kind))
    except BaseException as e:
        r = "%%s: %%s" %% (type(e).__name__, e)
    return {"type": %[6]q, "data": {"kind": kind, "result": r}}
`, daprd, devstack.StateName, secretKey, devstack.PubSubName, port, out)))})

	kinds := []string{"state-bulk", "state-bulk-https", "publish-lifecycle", "own-app", "climb", "encoded", "socket-daprd"}
	for _, k := range kinds {
		e.publish(in, "gw-"+k, map[string]any{"kind": k}, "")
	}
	results := map[string]string{}
	defer func() {
		if t.Failed() {
			t.Logf("results: %q", results)
		}
	}()
	waitFor(t, time.Minute, "the worker's answers", func() bool {
		for _, ev := range outs.all() {
			var d struct{ Kind, Result string }
			_ = json.Unmarshal(ev.Data(), &d)
			results[d.Kind] = d.Result
		}
		return len(results) >= len(kinds)
	})
	for kind, want := range map[string]string{
		"state-bulk":        "GatewayError",
		"state-bulk-https":  "GatewayError",
		"publish-lifecycle": "GatewayError",
		"own-app":           "GatewayError",
		"climb":             "GatewayError",
		"encoded":           "GatewayError",
	} {
		if !strings.HasPrefix(results[kind], want) || !strings.Contains(results[kind], "refused") {
			t.Errorf("%s: %q, want %s (refused)", kind, results[kind], want)
		}
	}
	// The sandbox's own network namespace: nothing listens on its loopback
	// (the guard let socket through here).
	if r := results["socket-daprd"]; !strings.HasPrefix(r, "ConnectionRefusedError") {
		t.Errorf("socket-daprd: %q, want ConnectionRefusedError (the worker's own loopback)", r)
	}
	for kind, r := range results {
		if strings.Contains(r, secret) || strings.Contains(r, "answered") {
			t.Errorf("%s answered: %s", kind, r)
		}
	}
	// The forged lifecycle event was never published (give it the time a
	// publish takes to come round).
	time.Sleep(2 * time.Second)
	if forged := e.lifecycleFor("victim-gw"); len(forged) > 0 {
		t.Fatalf("forged lifecycle events were published: %v", forged)
	}
}
