package localrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
)

func TestParseEventDefaults(t *testing.T) {
	ev, err := ParseEvent([]byte(`{"type": "t", "data": {"a": 1}, "correlationid": "c"}`))
	if err != nil {
		t.Fatal(err)
	}
	if ev.SpecVersion() != "1.0" || ev.Source() != "local" || ev.ID() == "" || ev.DataContentType() != "application/json" ||
		string(ev.Data()) != `{"a":1}` || ev.Extensions()["correlationid"] != "c" {
		t.Fatalf("event %v", ev)
	}
	if ev, err := ParseEvent([]byte(`{"type": "t", "data": "hi"}`)); err != nil || ev.DataContentType() != "text/plain" {
		t.Fatalf("text data: %v %v", ev, err)
	}
	for _, bad := range []string{`[]`, `null`, `{"data": 1}`, `{"type": 3}`} {
		if _, err := ParseEvent([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// Outputs are completed and held to the policy and limits as on the node;
// gateway calls are answered by the stubs.
func TestRunCompletesAndChecksOutputs(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not on PATH")
	}
	code := []byte(`import virtufin_host

def process(event):
    kind = event["type"]
    if kind == "loop":
        return {"type": "orders"}
    if kind == "many":
        return [{"type": "x"}] * 3
    if kind == "gateway":
        return {"type": "priced", "data": {"quote": virtufin_host.call_gateway("pricing", "quote", b"{}").decode()}}
    if kind == "gateway-fails":
        virtufin_host.call_gateway("pricing", "down", b"{}")
    return {"type": "done", "fencingtoken": "7", "workmanagerx": "y"}
`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := Start(ctx, code, Options{MIMEType: engines.MIMEPython, WorkerID: "w-1", Topic: "orders", MaxOutputs: 2, CacheDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Stubs:  map[string]json.RawMessage{"pricing/quote": json.RawMessage(`{"price": 3}`), "pricing/down": json.RawMessage(`{"$error": "backend down"}`)}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ev := func(typ string) string {
		return `{"id": "e-1", "source": "shop", "type": "` + typ + `", "correlationid": "c-1"}`
	}
	run := func(typ string) Result {
		e, err := ParseEvent([]byte(ev(typ)))
		if err != nil {
			t.Fatal(err)
		}
		return r.Run(ctx, e)
	}
	res := run("plain")
	if !res.OK || len(res.Outputs) != 1 {
		t.Fatalf("plain: %+v", res)
	}
	o := res.Outputs[0]
	tag := sha256.Sum256([]byte("shop"))
	if o.ID() != "e-1/w-1/0/"+hex.EncodeToString(tag[:4]) || o.Source() != "workmanager/workers/w-1" ||
		o.Extensions()["correlationid"] != "c-1" || o.Extensions()["fencingtoken"] != nil || o.Extensions()["workmanagerx"] != nil {
		t.Fatalf("plain output not completed as on the node: %v", o)
	}
	if res := run("loop"); res.OK || res.Reason != "output_policy" || !strings.Contains(res.Error, "own input topic") {
		t.Fatalf("loop: %+v", res)
	}
	if res := run("many"); res.OK || res.Reason != "output_limit" {
		t.Fatalf("many: %+v", res)
	}
	if res := run("gateway"); !res.OK || string(res.Outputs[0].Data()) != `{"quote":"{\"price\": 3}"}` {
		t.Fatalf("gateway: %+v %s", res, res.Outputs[0].Data())
	}
	if res := run("gateway-fails"); res.OK || res.Reason != "worker_failed" || !strings.Contains(res.Error, "backend down") {
		t.Fatalf("gateway failure: %+v", res)
	}
	if _, err := Start(ctx, []byte("def process(:\n"), Options{MIMEType: engines.MIMEPython, CacheDir: t.TempDir(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); !errors.Is(err, engines.ErrInvalidCode) {
		t.Fatalf("bad code: %v", err)
	}
}
