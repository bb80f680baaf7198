package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	devkit "github.com/virtufin/workmanager/sdk/python"
)

// devkitCommandWorker has three commands; devkitAPIWorker calls the
// "pricing" service through the gateway.
const devkitCommandWorker = `
import enum
from typing import Any, assert_never
from virtufin_worker import CloudEvent, CommandWorker

class Command(enum.Enum):
    ADD = enum.auto()
    UPPER = enum.auto()
    FAIL = enum.auto()

class Tools(CommandWorker[Command]):
    def handle(self, event: CloudEvent, command: Command, payload: dict[str, Any]) -> CloudEvent:
        match command:
            case Command.ADD:
                return self.response(event, {"sum": payload["a"] + payload["b"]})
            case Command.UPPER:
                return self.response(event, {"text": payload["text"].upper()})
            case Command.FAIL:
                raise ValueError("asked to fail")
            case _ as unreachable:
                assert_never(unreachable)

process = Tools(Command, %q)
`

const devkitAPIWorker = `
import enum
from virtufin_worker import ApiCommandWorker, GatewayError

class Command(enum.Enum):
    QUOTE = enum.auto()

class Quotes(ApiCommandWorker[Command]):
    def handle(self, event, command, payload):
        try:
            quote = self.api.gateway.pricing.quote({"sku": payload["sku"]})
        except GatewayError as e:
            return self.error(event, "pricing unavailable: %%s" %% e)
        return self.response(event, {"sku": payload["sku"], "quote": quote})

process = Quotes(Command, %q)
`

// The DevKit on the real stack: a CommandWorker with three commands and an
// ApiCommandWorker whose gateway call reaches a second Dapr application
// (its own daprd, app id "pricing", a small HTTP service of the test)
// process published events; outputs carry the correlation id; problems
// are error responses.
func TestDevKitWorkers(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	var quotes atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/quote" { // daprd asks its app for /dapr/config and /dapr/subscribe
			http.NotFound(w, r)
			return
		}
		quotes.Add(1)
		var req struct{ SKU string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		fmt.Fprintf(w, `{"path":%q,"price":%d}`, r.URL.Path, len(req.SKU)*10)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	e := newEnv(t, "")
	app, err := e.stack.StartAppSidecar(ctxT(t), "daprd-pricing", "pricing", ln.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Proc.Stop(5 * time.Second)

	// A worker that needs a newer DevKit than the node's is refused at
	// CreateWorker, saying so.
	_, err = e.client.CreateWorker(ctxT(t), &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: topicName(t, "new"),
		Code: pyCode([]byte("from virtufin_worker import require\nrequire(\"99.0\")\ndef process(event):\n    return None\n"))})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "needs virtufin_worker >= 99.0; the node provides "+devkit.Version()) {
		t.Fatalf("a worker needing DevKit 99.0: %v", err)
	}

	cmdIn, apiIn, out := topicName(t, "cmd"), topicName(t, "api"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	for _, w := range []struct {
		topic, code string
		targets     []string
	}{
		{cmdIn, fmt.Sprintf(devkitCommandWorker, out), nil},
		{apiIn, fmt.Sprintf(devkitAPIWorker, out), []string{"pricing/*"}},
	} {
		id := e.createWith(t, &pb.CreateWorkerRequest{Topic: w.topic, Code: pyCode([]byte(w.code)), AllowedGatewayTargets: w.targets})
		if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(topic, id, corr string, data any) {
		ce := map[string]any{"id": id, "type": "devkit.request", "datacontenttype": "application/json", "data": data}
		if corr != "" {
			ce["correlationid"] = corr
		}
		e.publishEvent(topic, ce)
	}
	send(cmdIn, "c-add", "corr-add", map[string]any{"command": "ADD", "a": 2, "b": 3})
	send(cmdIn, "c-upper", "corr-upper", map[string]any{"command": "upper", "text": "abc"})
	send(cmdIn, "c-fail", "corr-fail", map[string]any{"command": "Fail"})
	send(cmdIn, "c-unknown", "", map[string]any{"command": "mul"})
	send(cmdIn, "c-missing", "corr-missing", map[string]any{"a": 1})
	send(apiIn, "a-quote", "corr-quote", map[string]any{"command": "quote", "sku": "abcd"})
	want := map[string]struct {
		typ, corr string
		data      map[string]any
	}{
		"c-add":     {out, "corr-add", map[string]any{"sum": 5.0}},
		"c-upper":   {out, "corr-upper", map[string]any{"text": "ABC"}},
		"c-fail":    {out + ".error", "corr-fail", map[string]any{"error": "Internal error: ValueError: asked to fail"}},
		"c-unknown": {out + ".error", "", map[string]any{"error": "Unknown command: mul"}},
		"c-missing": {out + ".error", "corr-missing", map[string]any{"error": "Missing 'command' field"}},
		"a-quote":   {out, "corr-quote", map[string]any{"sku": "abcd", "quote": map[string]any{"path": "/quote", "price": 40.0}}},
	}
	errOuts := collectFrom(e.subscribe(out + ".error"))
	deadline := time.Now().Add(60 * time.Second)
	for id, w := range want {
		var got []event.Event
		for time.Now().Before(deadline) {
			if got = append(outs.all(), errOuts.all()...); hasInput(got, id) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		ev, ok := findInput(got, id)
		if !ok {
			t.Fatalf("no output for %s", id)
		}
		var data map[string]any
		if err := json.Unmarshal(ev.Data(), &data); err != nil {
			t.Fatal(err)
		}
		corr, _ := ev.Extensions()["correlationid"].(string)
		if ev.Type() != w.typ || corr != w.corr {
			t.Errorf("%s: type %q correlationid %q, want %q %q", id, ev.Type(), corr, w.typ, w.corr)
		}
		for k, v := range w.data {
			if fmt.Sprint(data[k]) != fmt.Sprint(v) {
				t.Errorf("%s: data[%s] = %v, want %v (%v)", id, k, data[k], v, data)
			}
		}
	}
	if quotes.Load() != 1 {
		t.Errorf("the pricing service saw %d calls, want 1", quotes.Load())
	}
}

// hasInput / findInput find the output of input id (output ids are
// "<input id>/<worker id>/<index>").
func hasInput(evs []event.Event, id string) bool { _, ok := findInput(evs, id); return ok }

func findInput(evs []event.Event, id string) (event.Event, bool) {
	for _, ev := range evs {
		if strings.HasPrefix(ev.ID(), id+"/") {
			return ev, true
		}
	}
	return event.Event{}, false
}

// The DevKit's local harness gives the node's outputs: one corpus of
// events through a worker on the real stack and through
// `python -m virtufin_worker run` with the same worker id and topic; the
// outputs (id, source, type, data, correlation id) are the same.
func TestDevKitHarnessMatchesTheNode(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnv(t, "")
	in, out := topicName(t, "in"), topicName(t, "out")
	code := []byte(fmt.Sprintf(devkitCommandWorker, out))
	id := e.createWith(t, &pb.CreateWorkerRequest{Topic: in, Code: pyCode(code)})
	if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	corpus := []map[string]any{
		{"id": "h-1", "source": "corpus", "type": "t", "correlationid": "k-1", "datacontenttype": "application/json", "data": map[string]any{"command": "add", "a": 1, "b": 2}},
		{"id": "h-2", "source": "corpus", "type": "t", "datacontenttype": "application/json", "data": map[string]any{"command": "UPPER", "text": "héllo"}},
		{"id": "h-3", "source": "corpus", "type": "t", "correlationid": "k-3", "datacontenttype": "application/json", "data": map[string]any{"command": "nope"}},
		{"id": "h-4", "source": "corpus", "type": "t", "datacontenttype": "application/json", "data": map[string]any{"command": "fail"}},
		{"id": "h-5", "source": "corpus", "type": "t", "correlationid": "k-5", "datacontenttype": "text/plain", "data": "not json"},
		{"id": "h-6", "source": "corpus", "type": "t", "datacontenttype": "application/json", "data": []any{1, 2}},
	}
	outs := collectFrom(e.subscribe(out))
	errs := collectFrom(e.subscribe(out + ".error"))
	for _, ce := range corpus {
		e.publishEvent(in, ce)
	}
	deadline := time.Now().Add(60 * time.Second)
	for outs.count()+errs.count() < len(corpus) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	node := map[string]map[string]any{}
	for _, ev := range append(outs.all(), errs.all()...) {
		node[strings.SplitN(ev.ID(), "/", 2)[0]] = comparable(t, ev)
	}

	dir := t.TempDir()
	worker, events := filepath.Join(dir, "worker.py"), filepath.Join(dir, "corpus.jsonl")
	var lines bytes.Buffer
	for _, ce := range corpus {
		b, _ := json.Marshal(ce)
		lines.Write(append(b, '\n'))
	}
	if err := os.WriteFile(worker, code, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(events, lines.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctxT(t), "python3", "-m", "virtufin_worker", "run", worker, "--events", events, "--worker-id", id, "--topic", in)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot(), "sdk", "python", "src"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("harness: %v\n%s", err, stderr.String())
	}
	harness := map[string]map[string]any{}
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	for sc.Scan() {
		var r struct {
			EventID string            `json:"event_id"`
			OK      bool              `json:"ok"`
			Outputs []json.RawMessage `json:"outputs"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || !r.OK || len(r.Outputs) != 1 {
			t.Fatalf("harness line %s: %v", sc.Text(), err)
		}
		var ev event.Event
		if err := json.Unmarshal(r.Outputs[0], &ev); err != nil {
			t.Fatalf("harness output %s: %v", r.Outputs[0], err)
		}
		harness[r.EventID] = comparable(t, ev)
	}
	if len(node) != len(corpus) || len(harness) != len(corpus) {
		t.Fatalf("node answered %d, harness %d of %d events", len(node), len(harness), len(corpus))
	}
	for id, n := range node {
		if fmt.Sprint(n) != fmt.Sprint(harness[id]) {
			t.Errorf("%s:\n node    %v\n harness %v", id, n, harness[id])
		}
	}
}

// comparable is what must agree between node and harness.
func comparable(t *testing.T, ev event.Event) map[string]any {
	t.Helper()
	var data any
	if err := json.Unmarshal(ev.Data(), &data); err != nil {
		t.Fatalf("output data %s: %v", ev.Data(), err)
	}
	return map[string]any{"id": ev.ID(), "source": ev.Source(), "type": ev.Type(), "data": data,
		"correlationid": ev.Extensions()["correlationid"], "datacontenttype": ev.DataContentType()}
}
