package dotnet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/enginetest"
	"github.com/virtufin/workmanager/engines/sandbox/sandboxtest"
	dotnetdevkit "github.com/virtufin/workmanager/sdk/dotnet"
)

// seedGateway answers gateway calls from a table ("service/method" to the
// response) and records them ("service/method request").
type seedGateway struct {
	mu      sync.Mutex
	calls   []string
	answers map[string]string
}

func (g *seedGateway) Call(_ context.Context, service, method string, request []byte) ([]byte, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls = append(g.calls, service+"/"+method+" "+string(request))
	a, ok := g.answers[service+"/"+method]
	if !ok {
		return nil, errors.New("no answer for " + service + "/" + method)
	}
	return []byte(a), nil
}

func (g *seedGateway) taken() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.calls
	g.calls = nil
	return c
}

// seedCase is one input to a seed worker and the output it must give.
type seedCase struct {
	data     string // the input's JSON data
	wantType string
	wantData string // JSON
	wantGW   []string
}

// seedShapes are the specification's worker shapes (testdata/seed_*.cs,
// `using Virtufin.Worker.DevKit;` only) and what each answers.
var seedShapes = []struct {
	name  string
	cases []seedCase
}{
	{"seed_apiworker", []seedCase{
		{`{"sku":"a-1"}`, "order.priced", `{"price":12.5,"api":"localhost:5002"}`, []string{`pricing/quote {"sku":"a-1"}`}},
	}},
	{"seed_commandworker", []seedCase{
		{`{"command":"hello","name":"Ada"}`, "greeting", `{"greeting":"hello, Ada"}`, nil},
		{`{"command":"bye"}`, "greeting.error", `{"error":"Unknown command: bye","input_id":"in-1","input_type":"commands"}`, nil},
		{`{"name":"Ada"}`, "greeting.error", `{"error":"Missing 'command' field","input_id":"in-1","input_type":"commands"}`, nil},
	}},
	{"seed_genericcommand", []seedCase{
		{`{"command":"create","url":"wss://x"}`, "websocket.response", `{"created":"wss://x"}`, nil},
		{`{"command":"CLOSE"}`, "websocket.response", `{"closed":true}`, nil},
		{`{"command":"open"}`, "websocket.response.error", `{"error":"Unknown command: open","input_id":"in-1","input_type":"commands"}`, nil},
	}},
	{"seed_apicommand", []seedCase{
		{`{"command":"quote","symbol":"ACME"}`, "quote.response", `{"api":"api.internal:6000","answer":{"price":12.5}}`, []string{`pricing/quote "ACME"`}},
		{`{"command":"quote","symbol":"ACME","api_host":"other"}`, "quote.response", `{"api":"other:5002","answer":{"price":12.5}}`, []string{`pricing/quote "ACME"`}},
		{`{"command":"quote","symbol":"ACME","api_port":7000}`, "quote.response", `{"api":"api.internal:7000","answer":{"price":12.5}}`, []string{`pricing/quote "ACME"`}},
		{`{"command":"quote","symbol":"ACME","api_port":"x"}`, "quote.response.error", `{"error":"Invalid 'api_port' field: \"x\"","input_id":"in-1","input_type":"commands"}`, nil},
	}},
}

// runSeedShape loads code as the worker name and checks every case.
func runSeedShape(t *testing.T, e *Engine, gw *seedGateway, mime, name string, code []byte, cases []seedCase) {
	t.Helper()
	inst := enginetest.Load(t, e, engines.Spec{WorkerID: "w-" + name, MIMEType: mime, Timeout: time.Minute}, code)
	for _, c := range cases {
		var data any
		if err := json.Unmarshal([]byte(c.data), &data); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		outs, err := inst.Process(ctx, enginetest.NewEvent("in-1", "commands", data, "corr-9"))
		cancel()
		if err != nil {
			t.Fatalf("%s %s: %v", name, c.data, err)
		}
		if len(outs) != 1 {
			t.Fatalf("%s %s: %d outputs, want 1", name, c.data, len(outs))
		}
		out := outs[0]
		if out.Type() != c.wantType {
			t.Errorf("%s %s: type %q, want %q", name, c.data, out.Type(), c.wantType)
		}
		if got, want := normalizeJSON(t, out.Data()), normalizeJSON(t, []byte(c.wantData)); got != want {
			t.Errorf("%s %s: data %s, want %s", name, c.data, got, want)
		}
		if corr, _ := out.Extensions()["correlationid"].(string); corr != "corr-9" {
			t.Errorf("%s %s: correlationid %q, want the input's", name, c.data, corr)
		}
		if got := gw.taken(); strings.Join(got, "\n") != strings.Join(c.wantGW, "\n") {
			t.Errorf("%s %s: gateway calls %q, want %q", name, c.data, got, c.wantGW)
		}
	}
}

func normalizeJSON(t *testing.T, b []byte) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("not JSON: %s: %v", b, err)
	}
	n, _ := json.Marshal(v)
	return string(n)
}

// TestSeedWorkerSources: C# sources written as the original DevKit's
// specification shows them (`using Virtufin.Worker.DevKit;`, ApiWorker with
// (apiHost, apiPort, responseEventType, source) and ProcessAsync(CloudEvent,
// ApiClient), `dynamic gateway = Api.Gateway`, the non-generic
// CommandWorker, CommandWorker<T>, ApiCommandWorker<T>) compile and run.
func TestSeedWorkerSources(t *testing.T) {
	gw := &seedGateway{answers: map[string]string{"pricing/quote": `{"price":12.5}`}}
	e := newTestEngine(t, Config{Gateway: gw})
	for _, s := range seedShapes {
		t.Run(s.name, func(t *testing.T) {
			runSeedShape(t, e, gw, MIMESource, s.name, fixture(t, s.name), s.cases)
		})
	}
}

// seedReferenceDevKit compiles the DevKit's sources under the original's
// assembly name, Virtufin.Worker.DevKit, as a user of the original DevKit
// has it to build against.
func seedReferenceDevKit(t *testing.T, rt *runtime) string {
	t.Helper()
	dir := t.TempDir()
	var srcs []string
	for name, b := range dotnetdevkit.AssemblySources() {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, p)
	}
	sort.Strings(srcs)
	ref := filepath.Join(dir, seedDevKitDLL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, rt.mcs, append([]string{"-target:library", "-out:" + ref}, srcs...)...).CombinedOutput(); err != nil {
		t.Fatalf("mcs (reference DevKit): %v\n%s", err, out)
	}
	return ref
}

// seedPackage compiles the worker source name against ref into a net48
// package that ships ref too (as a build output folder has it).
func seedPackage(t *testing.T, rt *runtime, ref, name string) []byte {
	t.Helper()
	dir := t.TempDir()
	dll := filepath.Join(dir, name+".dll")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src := filepath.Join("testdata", name+".cs")
	if out, err := exec.CommandContext(ctx, rt.mcs, "-target:library", "-out:"+dll, "-r:"+ref, "-r:Microsoft.CSharp.dll", src).CombinedOutput(); err != nil {
		t.Fatalf("mcs %s: %v\n%s", name, err, out)
	}
	b, err := os.ReadFile(dll)
	if err != nil {
		t.Fatal(err)
	}
	// It references the original's name only: the string
	// "Virtufin.Worker" (the node's assembly name, or that namespace) is
	// not in its metadata, "Virtufin.Worker.DevKit" is.
	if bytes.Contains(b, []byte("\x00Virtufin.Worker\x00")) || !bytes.Contains(b, []byte("\x00Virtufin.Worker.DevKit\x00")) {
		t.Fatalf("%s.dll does not reference Virtufin.Worker.DevKit alone", name)
	}
	refBytes, err := os.ReadFile(ref)
	if err != nil {
		t.Fatal(err)
	}
	return zipFiles(t, map[string]string{
		name + ".nuspec":             `<?xml version="1.0"?><package><metadata><id>` + name + `</id><version>1.0.0</version></metadata></package>`,
		"lib/net48/" + name + ".dll": string(b),
		"lib/net48/" + seedDevKitDLL: string(refBytes),
	})
}

// TestSeedWorkerDLLs: the same workers built into DLLs against a reference
// assembly named Virtufin.Worker.DevKit (the original DevKit's name), as an
// original-DevKit user's DLL references it, load and run: the host
// resolves that name to the node's DevKit (a copy shipped in the package
// is ignored).
func TestSeedWorkerDLLs(t *testing.T) {
	gw := &seedGateway{answers: map[string]string{"pricing/quote": `{"price":12.5}`}}
	e := newTestEngine(t, Config{Gateway: gw})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := e.runtimeFor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ref := seedReferenceDevKit(t, rt)
	for _, s := range seedShapes {
		t.Run(s.name, func(t *testing.T) {
			runSeedShape(t, e, gw, MIMEPackage, s.name, seedPackage(t, rt, ref, s.name), s.cases)
		})
	}
}

// TestSeedEnumConstraintCheckedAtLoad: `where T : struct, Enum`, which mcs
// cannot express, refuses a CommandWorker<T> over a struct at load, with
// the error a C# compiler gives (CS0315), from a source and from a DLL.
func TestSeedEnumConstraintCheckedAtLoad(t *testing.T) {
	e := newTestEngine(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rt, err := e.runtimeFor(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const want = "BadModes: error CS0315: The type 'Mode' cannot be used as type parameter 'T' in the generic type or method " +
		"'Virtufin.Worker.DevKit.CommandWorker<T>'. There is no boxing conversion from 'Mode' to 'System.Enum'."
	for mime, code := range map[string][]byte{
		MIMESource:  fixture(t, "seed_notenum"),
		MIMEPackage: seedPackage(t, rt, seedReferenceDevKit(t, rt), "seed_notenum"),
	} {
		err := e.Check(ctx, engines.Spec{WorkerID: "w-notenum", MIMEType: mime}, code)
		if !errors.Is(err, engines.ErrInvalidCode) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want ErrInvalidCode with %q", mime, err, want)
		}
	}
}

// TestSeedDynamicGatewaySandboxed: the dynamic gateway (Microsoft.CSharp's
// binder) works inside the real sandbox with the host's lockdown filter.
func TestSeedDynamicGatewaySandboxed(t *testing.T) {
	gw := &seedGateway{answers: map[string]string{"pricing/quote": `{"price":12.5}`}}
	e := newTestEngine(t, Config{Sandbox: sandboxtest.Strict(t), Gateway: gw})
	for _, s := range seedShapes {
		if s.name != "seed_apiworker" && s.name != "seed_apicommand" {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			runSeedShape(t, e, gw, MIMESource, s.name, fixture(t, s.name), s.cases)
		})
	}
}
