package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// echoWorker returns one event on outTopic whose data records the version,
// the input data and the correlation id the worker saw.
func echoWorker(outTopic, version string) []byte {
	return []byte(fmt.Sprintf(`
import time

def process(event):
    data = event.get("data") or {}
    if isinstance(data, dict) and data.get("hang"):
        time.sleep(3600)
    if isinstance(data, dict) and data.get("fail"):
        raise ValueError("asked to fail")
    return {"type": %q, "data": {"version": %q, "input": data, "seen_correlationid": event.get("correlationid")}}
`, outTopic, version))
}

func (e *env) create(t *testing.T, topic string, code []byte) string {
	t.Helper()
	resp, err := e.client.CreateWorker(ctxT(t), &pb.CreateWorkerRequest{
		Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: code}}, MimeType: "text/x-python", Topic: topic, Group: "g1"})
	if err != nil {
		t.Fatalf("CreateWorker: %v", err)
	}
	return resp.GetWorkerId()
}

func topicName(t *testing.T, suffix string) string {
	return strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")) + "-" + suffix + "-" + uuid.NewString()[:8]
}

type outData struct {
	Version           string         `json:"version"`
	Input             map[string]any `json:"input"`
	SeenCorrelationID *string        `json:"seen_correlationid"`
}

func decodeOut(t *testing.T, b []byte) outData {
	t.Helper()
	var d outData
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("output data %s: %v", b, err)
	}
	return d
}

// Done when 1 and 6: create → output on the topic named by the output type,
// correlation id propagated (and absent when absent); lifecycle events.
func testCreateProcessesAndPropagatesCorrelationID(t *testing.T) {
	e := sharedEnv(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v1"))

	w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if w.GetStatus() != pb.WorkerStatus_WORKER_STATUS_RUNNING || w.GetTopic() != in || w.GetCodeVersion() != 1 || w.GetGroup() != "g1" {
		t.Fatalf("unexpected worker %v", w)
	}
	e.waitLifecycle(id, lifecycleevents.Created, 10*time.Second)
	e.waitLifecycle(id, lifecycleevents.Started, 10*time.Second)

	e.publish(in, "m1", map[string]any{"n": 1}, "corr-123")
	ev := expectEvent(t, outs, 20*time.Second)
	if ev.Type() != out {
		t.Fatalf("output type %q, want %q", ev.Type(), out)
	}
	if got := ev.Extensions()["correlationid"]; got != "corr-123" {
		t.Fatalf("correlationid = %v, want corr-123", got)
	}
	d := decodeOut(t, ev.Data())
	if d.Version != "v1" || d.Input["n"] != float64(1) || d.SeenCorrelationID == nil || *d.SeenCorrelationID != "corr-123" {
		t.Fatalf("unexpected output %+v", d)
	}
	if ev.ID() == "" || ev.Source() == "" {
		t.Fatalf("output lacks id/source defaults: %v", ev)
	}

	e.publish(in, "m2", map[string]any{"n": 2}, "")
	ev = expectEvent(t, outs, 20*time.Second)
	if _, ok := ev.Extensions()["correlationid"]; ok {
		t.Fatalf("correlationid present although the input had none: %v", ev.Extensions())
	}
}

// Done when 2 and 6: stop pauses processing, start resumes it; both idempotent.
func testStopAndStart(t *testing.T) {
	e := sharedEnv(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v1"))

	for range 2 {
		w, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if w.GetStatus() != pb.WorkerStatus_WORKER_STATUS_STOPPED {
			t.Fatalf("status %v after stop", w.GetStatus())
		}
	}
	e.waitLifecycle(id, lifecycleevents.Stopped, 10*time.Second)
	// Stopped means unsubscribed: nothing can receive the next message
	// until the worker starts again (which then processes it, below).
	e.waitUnsubscribed(t, e.stack.DaprHTTPAddr, in)
	e.publish(in, "while-stopped", map[string]any{"n": 1}, "c1")

	for range 2 {
		w, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if w.GetStatus() != pb.WorkerStatus_WORKER_STATUS_RUNNING {
			t.Fatalf("status %v after start", w.GetStatus())
		}
	}
	// The message published while stopped waited in the broker and is
	// processed now; so is a new one.
	e.publish(in, "after-start", map[string]any{"n": 2}, "c2")
	// The one published while stopped may come back only by the broker's
	// redelivery (docs/architecture.md, "Stop pauses"), later still on a
	// busy machine: wait on it, generously.
	seen := map[float64]bool{}
	for range 2 {
		seen[decodeOut(t, expectEvent(t, outs, time.Minute).Data()).Input["n"].(float64)] = true
	}
	if !seen[1] || !seen[2] {
		t.Fatalf("outputs seen %v, want both messages", seen)
	}
	// Exactly one stopped and one (re)started event: the repeated calls were no-ops.
	var stopped, started int
	for _, typ := range e.lifecycleFor(id) {
		switch typ {
		case lifecycleevents.TypePrefix + "stopped":
			stopped++
		case lifecycleevents.TypePrefix + "started":
			started++
		}
	}
	if stopped != 1 || started != 2 {
		t.Fatalf("lifecycle events %v: want 1 stopped and 2 started (create + start)", e.lifecycleFor(id))
	}
}

// Done when 3 and 6: hot reload serves the next message with the new code and
// the history lists both versions.
func testLoadCodeAndHistory(t *testing.T) {
	e := sharedEnv(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v1"))
	e.publish(in, "a", map[string]any{"n": 1}, "")
	if v := decodeOut(t, expectEvent(t, outs, 20*time.Second).Data()).Version; v != "v1" {
		t.Fatalf("version %q before reload", v)
	}
	v2 := echoWorker(out, "v2")
	w, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: id, Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: v2}}})
	if err != nil {
		t.Fatal(err)
	}
	if w.GetCodeVersion() != 2 || w.GetCodeSha256() != catalog.SHA256(v2) || w.GetStatus() != pb.WorkerStatus_WORKER_STATUS_RUNNING {
		t.Fatalf("after LoadCode: %v", w)
	}
	e.waitLifecycle(id, lifecycleevents.CodeUpdated, 10*time.Second)
	e.publish(in, "b", map[string]any{"n": 2}, "")
	if v := decodeOut(t, expectEvent(t, outs, 20*time.Second).Data()).Version; v != "v2" {
		t.Fatalf("version %q after reload", v)
	}
	h, err := e.client.GetWorkerHistory(ctxT(t), &pb.GetWorkerHistoryRequest{WorkerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.GetEntries()) != 2 || h.Entries[0].GetVersion() != 1 || h.Entries[1].GetVersion() != 2 ||
		h.Entries[1].GetSha256() != catalog.SHA256(v2) || h.Entries[0].GetSourceKind() != "content" || h.Entries[0].GetCreatedAt() == nil {
		t.Fatalf("history %v", h.GetEntries())
	}
}

// Done when 7: bad input gets the documented code, nothing is persisted and
// the service stays up.
func testBadInput(t *testing.T) {
	e := sharedEnv(t)
	// What earlier tests on the shared stack stored (their code bodies,
	// collected after a grace period) is not this test's to judge.
	earlier := map[string]bool{}
	for _, k := range e.redisKeys(t) {
		earlier[k] = true
	}
	good := []byte("def process(event):\n    return None\n")
	code := func(b []byte) *pb.CodeSource { return &pb.CodeSource{Source: &pb.CodeSource_Content{Content: b}} }
	// A server that serves code whose sha256 is not the one claimed.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(good) }))
	defer srv.Close()
	wrongSHA := strings.Repeat("ab", 32)

	cases := []struct {
		name string
		req  *pb.CreateWorkerRequest
		code codes.Code
		msg  string
	}{
		{"unknown mime", &pb.CreateWorkerRequest{Code: code(good), MimeType: "text/x-cobol", Topic: "t"}, codes.InvalidArgument, "unknown mime_type"},
		{"empty mime", &pb.CreateWorkerRequest{Code: code(good), Topic: "t"}, codes.InvalidArgument, "mime_type is empty"},
		{"empty topic", &pb.CreateWorkerRequest{Code: code(good), MimeType: "text/x-python"}, codes.InvalidArgument, "topic is empty"},
		{"no code", &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: "t"}, codes.InvalidArgument, "code is required"},
		{"syntax error", &pb.CreateWorkerRequest{Code: code([]byte("def process(event)\n    return 1\n")), MimeType: "text/x-python", Topic: "t-syntax"}, codes.InvalidArgument, "SyntaxError"},
		{"no process function", &pb.CreateWorkerRequest{Code: code([]byte("x = 1\n")), MimeType: "text/x-python", Topic: "t-noproc"}, codes.InvalidArgument, "process"},
		{"wrong sha256", &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Url{Url: &pb.UrlSource{Url: srv.URL + "/w.py", Sha256: wrongSHA}}},
			MimeType: "text/x-python", Topic: "t-sha"}, codes.InvalidArgument, "sha256 mismatch"},
		{"malformed sha256", &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Url{Url: &pb.UrlSource{Url: srv.URL, Sha256: "xyz"}}},
			MimeType: "text/x-python", Topic: "t"}, codes.InvalidArgument, "sha256"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.client.CreateWorker(ctxT(t), c.req)
			if status.Code(err) != c.code || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("got %v, want %v containing %q", err, c.code, c.msg)
			}
		})
	}
	unknown := uuid.NewString()
	notFound := map[string]func() error{
		"GetWorker": func() error {
			_, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: unknown})
			return err
		},
		"StartWorker": func() error {
			_, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: unknown})
			return err
		},
		"StopWorker": func() error {
			_, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: unknown})
			return err
		},
		"DeleteWorker": func() error {
			_, err := e.client.DeleteWorker(ctxT(t), &pb.DeleteWorkerRequest{WorkerId: unknown})
			return err
		},
		"LoadCode": func() error {
			_, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: unknown, Code: code(good)})
			return err
		},
		"GetWorkerHistory": func() error {
			_, err := e.client.GetWorkerHistory(ctxT(t), &pb.GetWorkerHistoryRequest{WorkerId: unknown})
			return err
		},
		"GetWorker not a uuid": func() error {
			_, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: "nope"})
			return err
		},
	}
	for name, call := range notFound {
		t.Run(name, func(t *testing.T) {
			if err := call(); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "not found") {
				t.Fatalf("got %v, want NotFound", err)
			}
		})
	}
	// A bad LoadCode on a real worker leaves it untouched.
	id := e.create(t, topicName(t, "in"), good)
	_, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: id, Code: code([]byte("def process(:\n"))})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "SyntaxError") {
		t.Fatalf("bad LoadCode: %v", err)
	}
	w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id})
	if err != nil || w.GetCodeVersion() != 1 || w.GetCodeSha256() != catalog.SHA256(good) {
		t.Fatalf("worker changed by a rejected LoadCode: %v %v", w, err)
	}
	// Nothing persisted: only the one good worker exists, and the bad code
	// bodies are neither stored nor left in staging.
	list, err := e.client.ListWorkers(ctxT(t), &pb.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetWorkers()) != 1 || list.Workers[0].GetWorkerId() != id {
		t.Fatalf("workers after bad input: %v", list.GetWorkers())
	}
	keys := e.redisKeys(t)
	for _, k := range keys {
		if earlier[k] {
			continue
		}
		if strings.Contains(k, "staging/") || (strings.Contains(k, "code/") && !strings.HasSuffix(k, catalog.SHA256(good))) {
			t.Fatalf("bad input left %q in the state store (keys %v)", k, keys)
		}
	}
	if !slices.ContainsFunc(keys, func(k string) bool { return strings.HasSuffix(k, "code/"+catalog.SHA256(good)) }) {
		t.Fatalf("good code not stored: %v", keys)
	}
	if e.api.Exited() || e.node.Exited() {
		t.Fatal("a process died on bad input")
	}
}
