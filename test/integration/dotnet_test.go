package integration

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	dotnetdevkit "github.com/virtufin/workmanager/sdk/dotnet"
)

// csharpWorker is a C# source worker built on the DevKit's WorkerBase: it
// answers on outTopic with its version, the input and the correlation id
// it saw, throws on {"fail": true} and ends its host process on
// {"crash": true}.
func csharpWorker(outTopic, version string) []byte {
	return []byte(fmt.Sprintf(`using System;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public class Echo : WorkerBase
{
    public Echo() : base(%q) { }

    public override Task<CloudEvent> ProcessAsync(CloudEvent input)
    {
        var data = input.Data as JsonObject;
        if (data != null && data["fail"] != null)
            throw new InvalidOperationException("asked to fail");
        if (data != null && data["crash"] != null)
            Environment.Exit(7);
        var corr = input["correlationid"];
        return Task.FromResult(Response(input, new JsonObject
        {
            ["version"] = %q,
            ["input"] = data == null ? null : data.DeepClone(),
            ["seen_correlationid"] = corr == null ? null : (JsonNode)corr.ToString(),
        }));
    }
}
`, outTopic, version))
}

// dotnetCommandWorker is a DevKit CommandWorker, built into a DLL package.
const dotnetCommandWorker = `using System;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

namespace Acme.Calc
{
    public enum Command { Add, Upper }

    public class CalcWorker : CommandWorker<Command>
    {
        public CalcWorker() : base(%q, "urn:acme:calc") { }

        protected override Task<CloudEvent> HandleAsync(CloudEvent input, Command command, JsonNode payload)
        {
            switch (command)
            {
                case Command.Add:
                    return Task.FromResult(Response(input, new JsonObject { ["sum"] = payload["a"].GetValue<long>() + payload["b"].GetValue<long>() }));
                case Command.Upper:
                    return Task.FromResult(Response(input, new JsonObject { ["text"] = payload["text"].GetValue<string>().ToUpperInvariant() }));
                default:
                    throw new ArgumentOutOfRangeException("command", command, null);
            }
        }
    }
}
`

// dotnetQuoteWorker is a DevKit ApiCommandWorker whose gateway call reaches
// the "pricing" backend through the node (Dapr service invocation).
const dotnetQuoteWorker = `using System;
using System.Threading.Tasks;
using Virtufin.Worker;
using Virtufin.Worker.Json;

public enum QuoteCommand { Quote }

public sealed class Quotes : ApiCommandWorker<QuoteCommand>
{
    public Quotes() : base(%q) { }

    protected override async Task<CloudEvent> HandleAsync(CloudEvent input, QuoteCommand command, JsonNode payload)
    {
        var quote = await Api.CallAsync("pricing", "quote", new JsonObject { ["sku"] = payload["sku"].DeepClone() });
        return Response(input, new JsonObject { ["quote"] = quote });
    }
}
`

// dotnetPackage compiles the DevKit and src with mcs, as a worker author
// would, and packs the worker DLL as a nupkg (lib/net48/).
func dotnetPackage(t testing.TB, id, src string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var devkit []string
	for name, b := range dotnetdevkit.Sources() {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		devkit = append(devkit, p)
	}
	lib := filepath.Join(dir, "Virtufin.Worker.dll")
	if out, err := exec.CommandContext(ctx, "mcs", append([]string{"-target:library", "-out:" + lib}, devkit...)...).CombinedOutput(); err != nil {
		t.Fatalf("mcs (DevKit): %v\n%s", err, out)
	}
	cs := filepath.Join(dir, id+".cs")
	if err := os.WriteFile(cs, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	dll := filepath.Join(dir, id+".dll")
	if out, err := exec.CommandContext(ctx, "mcs", "-target:library", "-out:"+dll, "-r:"+lib, cs).CombinedOutput(); err != nil {
		t.Fatalf("mcs (worker): %v\n%s", err, out)
	}
	b, err := os.ReadFile(dll)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, content := range map[string][]byte{
		id + ".nuspec":             []byte(`<?xml version="1.0"?><package><metadata><id>` + id + `</id><version>1.0.0</version></metadata></package>`),
		"lib/net48/" + id + ".dll": b,
	} {
		w, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(content)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Issue 13, done when: a C# source worker and a DLL worker built from the
// DevKit process messages with correlation ids; hot reload under load; a
// compile error names its line; a throwing worker yields worker.error; a
// worker that ends its host is restarted and the node keeps serving.
func TestDotnetWorkers(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	var quotes atomic.Int32
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		quotes.Add(1)
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, `{"path":%q,"request":%s,"price":42}`, r.URL.Path, body)
	}))
	defer backend.Close()
	e := newEnvWith(t, envConfig{resources: map[string]string{"pricing.yaml": devstack.HTTPEndpoint("pricing", backend.URL)}})
	srcIn, pkgIn, apiIn, out := topicName(t, "src"), topicName(t, "pkg"), topicName(t, "api"), topicName(t, "out")
	outs := e.subscribe(out)
	errOuts := collectFrom(e.subscribe(out + ".error"))

	// A compile error is INVALID_ARGUMENT with the file, line and column,
	// and no worker is left behind.
	_, err := e.client.CreateWorker(ctxT(t), &pb.CreateWorkerRequest{MimeType: "text/x-csharp", Topic: srcIn,
		Code: pyCode([]byte("using Virtufin.Worker;\npublic class W : IWorker {\n  public int x = ;\n}\n"))})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "Worker.cs:3:") || !strings.Contains(err.Error(), "error CS") {
		t.Fatalf("CreateWorker with a compile error: %v", err)
	}
	if list, err := e.client.ListWorkers(ctxT(t), &pb.ListWorkersRequest{}); err != nil || len(list.GetWorkers()) != 0 {
		t.Fatalf("workers after the failed create: %v, %v", list.GetWorkers(), err)
	}

	srcID := e.createWith(t, &pb.CreateWorkerRequest{MimeType: "text/x-csharp", Topic: srcIn, Code: pyCode(csharpWorker(out, "v1"))})
	pkgID := e.createWith(t, &pb.CreateWorkerRequest{MimeType: "application/x-dotnet-dll", Topic: pkgIn,
		Code: pyCode(dotnetPackage(t, "Acme.Calc", fmt.Sprintf(dotnetCommandWorker, out)))})
	apiID := e.createWith(t, &pb.CreateWorkerRequest{MimeType: "text/x-csharp", Topic: apiIn,
		Code: pyCode([]byte(fmt.Sprintf(dotnetQuoteWorker, out))), AllowedGatewayTargets: []string{"pricing/*"}})
	for _, id := range []string{srcID, pkgID, apiID} {
		if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id}); err != nil {
			t.Fatal(err)
		}
	}

	// Correlation ids go through both.
	e.publish(srcIn, "s-1", map[string]any{"n": 1}, "corr-s")
	ev := expectEvent(t, outs, 30*time.Second)
	if d := decodeOut(t, ev.Data()); d.Version != "v1" || d.Input["n"] != float64(1) || d.SeenCorrelationID == nil ||
		*d.SeenCorrelationID != "corr-s" || ev.Extensions()["correlationid"] != "corr-s" {
		t.Fatalf("C# source output %s %v", ev.Data(), ev.Extensions())
	}
	e.publishEvent(pkgIn, map[string]any{"id": "p-add", "type": "calc", "correlationid": "corr-p",
		"datacontenttype": "application/json", "data": map[string]any{"command": "ADD", "a": 2, "b": 40}})
	ev = expectEvent(t, outs, 30*time.Second)
	var sum struct{ Sum int }
	if err := json.Unmarshal(ev.Data(), &sum); err != nil || sum.Sum != 42 || ev.Extensions()["correlationid"] != "corr-p" || ev.Source() != "urn:acme:calc" {
		t.Fatalf("DLL output %s %v %s: %v", ev.Data(), ev.Extensions(), ev.Source(), err)
	}
	// A gateway call from C# reaches the backend through Dapr.
	e.publishEvent(apiIn, map[string]any{"id": "a-quote", "type": "quote", "correlationid": "corr-a",
		"datacontenttype": "application/json", "data": map[string]any{"command": "quote", "sku": "abc"}})
	ev = expectEvent(t, outs, 30*time.Second)
	var q struct {
		Quote struct {
			Path    string
			Price   int
			Request map[string]any
		}
	}
	if err := json.Unmarshal(ev.Data(), &q); err != nil || q.Quote.Price != 42 || q.Quote.Path != "/quote" ||
		q.Quote.Request["sku"] != "abc" || ev.Extensions()["correlationid"] != "corr-a" || quotes.Load() != 1 {
		t.Fatalf("gateway output %s %v (backend calls %d): %v", ev.Data(), ev.Extensions(), quotes.Load(), err)
	}
	e.publishEvent(pkgIn, map[string]any{"id": "p-mul", "type": "calc", "datacontenttype": "application/json", "data": map[string]any{"command": "mul"}})
	waitFor(t, 30*time.Second, "the unknown command's error response", func() bool { return errOuts.distinct() == 1 })

	// A throwing worker yields worker.error with the exception.
	e.publish(srcIn, "s-fail", map[string]any{"fail": true}, "")
	lc := e.waitLifecycleFor(srcID, lifecycleevents.Error, "s-fail", 30*time.Second)
	if lc.Data.ErrorType != "worker_failed" || !strings.Contains(lc.Data.ErrorMessage, "InvalidOperationException: asked to fail") {
		t.Fatalf("error event %+v", lc.Data)
	}

	// A worker that ends its host: worker.error, the host is restarted, the
	// worker and the node keep serving (the throwing input's later attempts
	// report theirs meanwhile).
	e.publish(srcIn, "s-crash", map[string]any{"crash": true}, "")
	lc = e.waitLifecycleFor(srcID, lifecycleevents.Error, "s-crash", 30*time.Second)
	if !strings.Contains(lc.Data.ErrorMessage, "exited during the call") {
		t.Fatalf("crash error event %+v", lc.Data)
	}
	e.publish(srcIn, "s-after", map[string]any{"n": 2}, "")
	if d := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data()); d.Input["n"] != float64(2) {
		t.Fatalf("output after the crash %+v", d)
	}
	e.publishEvent(pkgIn, map[string]any{"id": "p-upper", "type": "calc", "datacontenttype": "application/json", "data": map[string]any{"command": "upper", "text": "abc"}})
	if ev := expectEvent(t, outs, 30*time.Second); !strings.Contains(string(ev.Data()), `"ABC"`) {
		t.Fatalf("DLL worker after the other's crash: %s", ev.Data())
	}

	// Hot reload under load: every message answered by v1 or v2, those
	// sent after LoadCode returned by v2.
	const total = 120
	var afterReload atomic.Int32
	afterReload.Store(total)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range total {
			if i == total/3 {
				if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: srcID, Code: pyCode(csharpWorker(out, "v2"))}); err != nil {
					t.Errorf("LoadCode: %v", err)
				}
				afterReload.Store(int32(i))
			}
			e.publish(srcIn, "m-"+strconv.Itoa(i), map[string]any{"i": i}, "")
		}
	}()
	seen := map[int]string{}
	deadline := time.After(120 * time.Second)
	for len(seen) < total {
		select {
		case ev := <-outs:
			d := decodeOut(t, ev.Data())
			if d.Version != "v1" && d.Version != "v2" {
				t.Fatalf("torn output %s", ev.Data())
			}
			i, ok := d.Input["i"].(float64)
			if !ok {
				t.Fatalf("unexpected output %s", ev.Data())
			}
			seen[int(i)] = d.Version
		case <-deadline:
			t.Fatalf("only %d of %d messages answered", len(seen), total)
		}
	}
	<-done
	for n, v := range seen {
		if n >= int(afterReload.Load()) && v != "v2" {
			t.Fatalf("message %d sent after the reload was answered by %s", n, v)
		}
	}
	if body := e.httpGet(t, "/health"); !strings.Contains(body, "Mono") {
		t.Fatalf("/health does not describe the .NET runtime: %s", body)
	}
}
