package integration

import (
	"archive/zip"
	"bytes"
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

	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// nativePackage compiles testdata/native_worker.c with gcc and zips it with
// its manifest, as a worker author would ship it.
func nativePackage(t testing.TB, version string) []byte {
	t.Helper()
	return nativePackageOf(t, "native_worker.c", fmt.Sprintf(`-DVERSION="%s"`, version))
}

// nativePackageOf compiles testdata/source with gcc (and the extra flags)
// into a native worker package.
func nativePackageOf(t testing.TB, source string, flags ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	so := filepath.Join(dir, "libnativeworker.so")
	args := append([]string{"-O2", "-shared", "-fPIC", "-I", filepath.Join(repoRoot(), "sdk", "native")}, flags...)
	out, err := exec.Command("gcc", append(args, "-o", so, filepath.Join("testdata", source))...).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	lib, err := os.ReadFile(so)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, body := range map[string][]byte{
		"manifest.json": []byte(`{"abi_version": 1, "library": "nativeworker"}`),
		"runtimes/linux-x64/native/libnativeworker.so": lib,
	} {
		w, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write(body)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type nativeOut struct {
	Version string         `json:"version"`
	ID      string         `json:"id"`
	Gateway map[string]any `json:"gateway"`
}

// Issue 3, done when: a native worker from a zip on the real stack — outputs
// with correlation id, the log callback and gateway_call (through Dapr
// service invocation) exercised, hot reload under load with no lost or torn
// calls, and stop cleans up its extracted files and library mapping.
func TestNativeWorkerEndToEnd(t *testing.T) {
	inTurn(t) // a stack of its own
	var gatewayCalls atomic.Int32
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gatewayCalls.Add(1)
		body, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, `{"path":%q,"request":%s,"price":42}`, r.URL.Path, body)
	}))
	defer backend.Close()
	tmp := t.TempDir()
	e := newEnvWith(t, envConfig{
		resources: map[string]string{"pricing.yaml": devstack.HTTPEndpoint("pricing", backend.URL)},
		nodeEnv:   []string{"NATIVE_TEMP_DIR=" + tmp},
	})
	in := topicName(t, "in")
	outs := e.subscribe("native-out")
	v1, v2 := nativePackage(t, "v1"), nativePackage(t, "v2")
	resp, err := e.client.CreateWorker(ctxT(t), &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: v1}},
		MimeType: "application/x-native-dll", Topic: in})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetWorkerId()

	e.publishEvent(in, map[string]any{"id": "lookup-1", "type": "native.lookup", "correlationid": "corr-n",
		"datacontenttype": "application/json", "data": map[string]any{"sku": "a"}})
	ev := expectEvent(t, outs, 20*time.Second)
	var o nativeOut
	if err := json.Unmarshal(ev.Data(), &o); err != nil {
		t.Fatalf("output %s: %v", ev.Data(), err)
	}
	if o.Version != "v1" || o.ID != "lookup-1" || o.Gateway["price"] != float64(42) || o.Gateway["path"] != "/quote" ||
		ev.Extensions()["correlationid"] != "corr-n" {
		t.Fatalf("output %+v %v", o, ev.Extensions())
	}
	if gatewayCalls.Load() != 1 {
		t.Fatalf("backend saw %d calls", gatewayCalls.Load())
	}
	if log, _ := os.ReadFile(filepath.Join(e.dir, "node.log")); !strings.Contains(string(log), "native worker v1 handling lookup-1") {
		t.Fatal("the worker's host->log line is not in the node's log")
	}

	// Hot reload under load: every message is answered exactly by v1 or v2
	// (none lost, none torn), and every message sent after LoadCode returned
	// is answered by v2.
	const total = 150
	var afterReload atomic.Int32
	afterReload.Store(total)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range total {
			if i == total/3 {
				if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: id, Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: v2}}}); err != nil {
					t.Errorf("LoadCode: %v", err)
				}
				afterReload.Store(int32(i))
			}
			e.publishEvent(in, map[string]any{"id": "m-" + strconv.Itoa(i), "type": "native.ping", "data": map[string]any{"i": i}})
		}
	}()
	seen := map[int]string{}
	deadline := time.After(90 * time.Second)
	for len(seen) < total {
		select {
		case ev := <-outs:
			var o nativeOut
			if err := json.Unmarshal(ev.Data(), &o); err != nil || (o.Version != "v1" && o.Version != "v2") {
				t.Fatalf("torn output %q: %v", ev.Data(), err)
			}
			n, err := strconv.Atoi(strings.TrimPrefix(o.ID, "m-"))
			if err != nil {
				t.Fatalf("unexpected output id %q", o.ID)
			}
			seen[n] = o.Version
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

	// One extracted package left after the reload (the old one is removed
	// once drained); none and no mapping after stop.
	waitFor(t, 10*time.Second, "one extracted package after reload", func() bool { return len(extracted(t, tmp)) == 1 })
	if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "no extracted package after stop", func() bool { return len(extracted(t, tmp)) == 0 })
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", e.node.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(maps), "libnativeworker") {
		t.Fatal("the worker library is still mapped in the node after stop")
	}
}

func extracted(t *testing.T, dir string) []string {
	t.Helper()
	// The node's native engine extracts into an owner directory of its
	// own (engines/native/owner.go).
	m, err := filepath.Glob(filepath.Join(dir, "virtufin-native-owner-*", "virtufin-native-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
