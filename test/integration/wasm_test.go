package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// wasmC compiles testdata/wasm_worker.c for wasm32-wasi with clang (the
// toolchain make test installs), its outputs of type outType.
func wasmC(t testing.TB, outType string, defines ...string) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "worker.wasm")
	args := []string{"--target=wasm32-wasi", "-O2", "-mbulk-memory", "-mexec-model=reactor", "-Wall", "-Werror",
		"-I", "../../sdk/native", "-I", "../../sdk/wasm/c", `-DOUT_TYPE="` + outType + `"`, "-o", out}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	args = append(args, "testdata/wasm_worker.c")
	if b, err := exec.Command("clang", args...).CombinedOutput(); err != nil {
		t.Fatalf("clang %v: %v\n%s", args, err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wasmGo builds examples/wasm/go-pricer for wasip1.
func wasmGo(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "go-pricer.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, ".")
	cmd.Dir = "../../examples/wasm/go-pricer"
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("GOOS=wasip1 go build: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWasmWorkersEndToEnd is issue 50's real-stack test: a C worker in a
// group and the Go example (go-pricer), WebAssembly modules created by
// MIME type application/wasm, get CloudEvents from their topics and
// publish to the topics their outputs' types name, correlation ids kept;
// the grouped one sees its group and a fencing token, which its output
// carries too.
func TestWasmWorkersEndToEnd(t *testing.T) {
	e := sharedEnv(t)
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := collectFrom(e.subscribe(out))
	c := e.createWith(t, &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: wasmC(t, out)}},
		MimeType: "application/wasm", Topic: in, Group: "g-wasm"})
	for i := range 3 {
		e.publishEvent(in, map[string]any{"id": "w-" + strconv.Itoa(i), "type": "wasm.ping", "correlationid": "corr-w" + strconv.Itoa(i),
			"datacontenttype": "application/json", "data": map[string]any{"i": i}})
	}
	var tokens []string
	for i := range 3 {
		id := firstOutputID("w-"+strconv.Itoa(i), c)
		waitFor(t, 60*time.Second, "the C worker's output for w-"+strconv.Itoa(i), func() bool { return len(outs.get(id)) > 0 })
		ev := outs.get(id)[0]
		var d struct{ ID, Fencingtoken, Group string }
		if err := json.Unmarshal(ev.Data(), &d); err != nil {
			t.Fatalf("output %s: %v", ev.Data(), err)
		}
		tok, err := strconv.ParseInt(d.Fencingtoken, 10, 64)
		if d.ID != "w-"+strconv.Itoa(i) || d.Group != "g-wasm" || err != nil || tok <= 0 ||
			ev.Extensions()["fencingtoken"] != d.Fencingtoken || ev.Extensions()["correlationid"] != "corr-w"+strconv.Itoa(i) {
			t.Fatalf("output %s, extensions %v: want its id, group g-wasm, the fencing token it saw (also on the output) and its correlation id", ev.Data(), ev.Extensions())
		}
		tokens = append(tokens, d.Fencingtoken)
	}
	// Daprd hands the three inputs over at once, so the group may run them
	// in any order; each run has a token of its own, and the outputs stand
	// in the topic's stream in token order (read with redis-cli).
	var inStream []int64
	for _, line := range strings.Split(e.redisCLI(t, "XRANGE", out, "-", "+"), "\n") {
		var ce map[string]any
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &ce) != nil || ce["specversion"] == nil {
			continue // an entry's id, its field names, its metadata
		}
		tok, err := strconv.ParseInt(fmt.Sprint(ce["fencingtoken"]), 10, 64)
		if err != nil {
			t.Fatalf("an output without a fencing token in the stream: %s", line)
		}
		// (Equal: one call's outputs published again, at least once.)
		if n := len(inStream); n > 0 && tok < inStream[n-1] {
			t.Fatalf("fencing tokens in the output stream %v then %d: want them in order (the tokens seen: %v)", inStream, tok, tokens)
		}
		inStream = append(inStream, tok)
	}
	if len(inStream) < 3 || len(map[string]bool{tokens[0]: true, tokens[1]: true, tokens[2]: true}) != 3 {
		t.Fatalf("outputs in the stream with tokens %v, the calls saw %v: want three calls with tokens of their own", inStream, tokens)
	}

	orders := topicName(t, "orders")
	priced := collectFrom(e.subscribe("order.priced"))
	g := e.createWith(t, &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: wasmGo(t)}},
		MimeType: "application/wasm", Topic: orders})
	orderID := "o-" + orders
	e.publishEvent(orders, map[string]any{"id": orderID, "type": "order.placed", "correlationid": "corr-o",
		"datacontenttype": "application/json", "data": map[string]any{"items": []any{map[string]any{"sku": "a", "price": 2, "qty": 3}}}})
	id := firstOutputID(orderID, g)
	waitFor(t, 60*time.Second, "the Go worker's priced order", func() bool { return len(priced.get(id)) > 0 })
	ev := priced.get(id)[0]
	var d map[string]any
	if err := json.Unmarshal(ev.Data(), &d); err != nil || d["total"] != float64(6) || d["order_id"] != orderID || ev.Extensions()["correlationid"] != "corr-o" {
		t.Fatalf("priced order %s (%v), extensions %v", ev.Data(), err, ev.Extensions())
	}
}
