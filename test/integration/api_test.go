package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/devstack"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// The control API serves the standard health service and reflection, so
// grpcurl works without proto files.
func testHealthAndReflection(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxT(t)
	h, err := healthpb.NewHealthClient(e.conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "workmanager.v1.WorkManagerService"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	st, err := reflectionpb.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{ListServices: ""}}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !slices.Contains(names, "workmanager.v1.WorkManagerService") || !slices.Contains(names, "grpc.health.v1.Health") {
		t.Fatalf("reflection lists %v", names)
	}
	body := e.httpGet(t, "/health")
	if !strings.Contains(body, `"status":"Healthy"`) || !strings.Contains(body, `"cluster":{"status":"Healthy","detail":"node `) {
		t.Fatalf("/health: %s", body)
	}
}

// The temporal CLI commands of docs/api.md ("Through Temporal directly")
// control a worker through its workflow.
func testTemporalCLIControlsWorker(t *testing.T) {
	e := sharedEnv(t)
	id := e.create(t, topicName(t, "in"), echoWorker("cli-out", "v1"))
	cli := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		args = append(args, "--address", e.stack.TemporalAddr, "--namespace", e.stack.TemporalNamespace(), "--workflow-id", workflows.WorkflowID(id))
		out, err := exec.CommandContext(ctx, filepath.Join(repoRoot(), ".tools", "bin", "temporal"), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("temporal %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	cli("workflow", "update", "execute", "--name", "stop")
	if w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id}); err != nil || w.GetStatus() != pb.WorkerStatus_WORKER_STATUS_STOPPED {
		t.Fatalf("after CLI stop: %v %v", w, err)
	}
	if out := cli("workflow", "query", "--type", "state"); !strings.Contains(out, `"status":"STOPPED"`) {
		t.Fatalf("query output: %s", out)
	}
	cli("workflow", "update", "execute", "--name", "start")
	if w, err := e.client.GetWorker(ctxT(t), &pb.GetWorkerRequest{WorkerId: id}); err != nil || w.GetStatus() != pb.WorkerStatus_WORKER_STATUS_RUNNING {
		t.Fatalf("after CLI start: %v %v", w, err)
	}
	// The search attributes let the CLI (and the Web UI) find the worker.
	list := func(status string) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, filepath.Join(repoRoot(), ".tools", "bin", "temporal"), "workflow", "list",
			"--address", e.stack.TemporalAddr, "--namespace", e.stack.TemporalNamespace(), "--query", "WorkerId='"+id+"' AND WorkerStatus='"+status+"'").CombinedOutput()
		return strings.Contains(string(out), workflows.WorkflowID(id))
	}
	waitFor(t, 10*time.Second, "workflow list by search attributes finds the running worker", func() bool { return list("RUNNING") })
	// Issue 44 item 6: a deleted worker's (closed) workflow says DELETED,
	// so a query for running workers no longer lists it.
	if _, err := e.client.DeleteWorker(ctxT(t), &pb.DeleteWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "workflow list finds the deleted worker as DELETED, not RUNNING", func() bool { return list("DELETED") && !list("RUNNING") })
	// With WM_RECORD_HISTORY=1: the recorded history of the
	// deleted-search-attribute branch (workflows/replay_test.go).
	replay(t, history(t, e.temporalClient(t), workflows.WorkflowID(id)), workflows.WorkerWorkflow, "worker_deleted_history.json")
}

// The example worker does what the walkthroughs (README's with wmctl,
// docs/api.md's with grpcurl) say.
func testExampleWorker(t *testing.T) {
	e := sharedEnv(t)
	code, err := os.ReadFile(filepath.Join(repoRoot(), "examples", "python", "enrich", "worker.py"))
	if err != nil {
		t.Fatal(err)
	}
	// Topics of its own: the README's guide runs the same example on
	// "orders" in this shared stack, and reads "order.priced" --since 1m.
	in, out := topicName(t, "orders"), topicName(t, "order.priced")
	code = bytes.ReplaceAll(code, []byte(`"order.priced"`), []byte(strconv.Quote(out)))
	outs := e.subscribe(out)
	e.create(t, in, code)
	e.publish(in, "o-1", map[string]any{"items": []map[string]any{{"sku": "a", "price": 2, "qty": 3}, {"sku": "b", "price": 1}}}, "c-42")
	ev := expectEvent(t, outs, 20*time.Second)
	var d map[string]any
	if err := ev.DataAs(&d); err != nil {
		t.Fatal(err)
	}
	if d["total"] != float64(7) || d["order_id"] != "o-1" || ev.Extensions()["correlationid"] != "c-42" {
		t.Fatalf("example output %v %v", d, ev.Extensions())
	}
}

// Many concurrent lifecycle updates across continue-as-new boundaries lose
// nothing: every LoadCode gets its own version, the final state is what the
// last call said, and the workflow really continued as new (twice, while
// the updates ran: a run lives workflows.MinRunAge at least, so the stops
// and starts go on until then, and two of the loads wait for the first).
func TestConcurrentUpdatesAcrossContinueAsNew(t *testing.T) {
	inTurn(t) // a stack of its own
	e := newEnvWith(t, envConfig{apiEnv: []string{"WORKMANAGER_CONTINUE_AS_NEW_AFTER=3"}})
	in, out := topicName(t, "in"), topicName(t, "out")
	outs := e.subscribe(out)
	id := e.create(t, in, echoWorker(out, "v0"))
	tc := e.temporalClient(t)
	first, err := tc.DescribeWorkflowExecution(ctxT(t), workflows.WorkflowID(id), "")
	if err != nil {
		t.Fatal(err)
	}
	logHistories(t, tc, workflows.WorkflowID(id), first.GetWorkflowExecutionInfo().GetExecution().GetRunId())

	// cans counts the runs that followed the first (polled).
	var cans atomic.Int32
	watch, stopWatch := context.WithCancel(ctxT(t))
	defer stopWatch()
	go func() {
		last := first.GetWorkflowExecutionInfo().GetExecution().GetRunId()
		for watch.Err() == nil {
			d, err := tc.DescribeWorkflowExecution(watch, workflows.WorkflowID(id), "")
			if run := d.GetWorkflowExecutionInfo().GetExecution().GetRunId(); err == nil && run != last {
				last = run
				cans.Add(1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	waitCANs := func(n int32) error {
		for end := time.Now().Add(60 * time.Second); cans.Load() < n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				return fmt.Errorf("the workflow did not continue as new %d times within 60 s", n)
			}
		}
		return nil
	}

	const loads = 4
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range loads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i >= loads/2 {
				if err := waitCANs(1); err != nil {
					errs <- err
					return
				}
			}
			code := echoWorker(out, "v"+string(rune('1'+i)))
			if _, err := e.client.LoadCode(ctxT(t), &pb.LoadCodeRequest{WorkerId: id, Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: code}}}); err != nil {
				errs <- err
			}
		}()
	}
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for round := 0; round < 3 || cans.Load() < 2; round++ {
				if round == 1000 {
					errs <- fmt.Errorf("%d stop/start rounds and the workflow continued as new %d times, want 2", round, cans.Load())
					return
				}
				if _, err := e.client.StopWorker(ctxT(t), &pb.StopWorkerRequest{WorkerId: id}); err != nil {
					errs <- err
				}
				if _, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id}); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("update failed: %v", err)
	}
	w, err := e.client.StartWorker(ctxT(t), &pb.StartWorkerRequest{WorkerId: id})
	if err != nil {
		t.Fatal(err)
	}
	if w.GetCodeVersion() != loads+1 || w.GetStatus() != pb.WorkerStatus_WORKER_STATUS_RUNNING {
		t.Fatalf("final worker %v", w)
	}
	h, err := e.client.GetWorkerHistory(ctxT(t), &pb.GetWorkerHistoryRequest{WorkerId: id})
	if err != nil || len(h.GetEntries()) != loads+1 {
		t.Fatalf("history %v %v", h.GetEntries(), err)
	}
	now, err := tc.DescribeWorkflowExecution(ctxT(t), workflows.WorkflowID(id), "")
	if err != nil {
		t.Fatal(err)
	}
	if now.GetWorkflowExecutionInfo().GetExecution().GetRunId() == first.GetWorkflowExecutionInfo().GetExecution().GetRunId() {
		t.Fatal("the workflow never continued as new")
	}
	// The node serves the code of the last version loaded, whichever of the
	// concurrent loads that was.
	last := h.GetEntries()[len(h.GetEntries())-1]
	if last.GetSha256() != w.GetCodeSha256() {
		t.Fatalf("last history entry %v, worker serves sha256 %s", last, w.GetCodeSha256())
	}
	want := ""
	for i := range loads {
		v := "v" + string(rune('1'+i))
		if catalog.SHA256(echoWorker(out, v)) == last.GetSha256() {
			want = v
		}
	}
	if want == "" {
		t.Fatalf("the last loaded sha256 %s is none of the loaded codes", last.GetSha256())
	}
	e.publish(in, "final", map[string]any{"n": 1}, "")
	// A wait, not a bound: 20 s ran out once on a machine at load 12.
	if d := decodeOut(t, expectEvent(t, outs, 90*time.Second).Data()); d.Version != want {
		t.Fatalf("serving %q, want %q (version %d, the last loaded)", d.Version, want, last.GetVersion())
	}
}

// apiToken is a line of the API's tokens file.
type apiToken struct{ token, role, tenant, subject string }

// newEnvWithTokens starts a stack whose API accepts the dev token (an
// admin of the default tenant) and tokens.
func newEnvWithTokens(t *testing.T, tokens []apiToken, apiEnv ...string) *env {
	t.Helper()
	dir := t.TempDir()
	_, file, err := devstack.DevToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range tokens {
		fmt.Fprintf(f, "sha256:%s %s %s %s\n", auth.HashToken(tk.token), tk.role, tk.tenant, tk.subject)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return newEnvWith(t, envConfig{dir: dir, apiEnv: append([]string{"API_TOKENS_FILE=" + file}, apiEnv...)})
}

// Issue 11: the control API authenticates every call and authorizes it by
// role, on the real stack: no credentials and a wrong token are
// UNAUTHENTICATED (the health service too, unless API_PUBLIC_HEALTH), a
// reader reads but cannot create, and a refused create leaves nothing.
func TestAPIAuthentication(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnvWithTokens(t, []apiToken{{"reader-token-0123456789", "reader", "default", "viewer"}})
	dial := func(creds ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient(e.apiAddr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, creds...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	anon, wrong, reader := dial(), dial(grpc.WithPerRPCCredentials(devstack.Bearer("not-a-token"))),
		dial(grpc.WithPerRPCCredentials(devstack.Bearer("reader-token-0123456789")))
	ctx := ctxT(t)
	if _, err := pb.NewWorkManagerServiceClient(anon).ListWorkers(ctx, &pb.ListWorkersRequest{}); status.Code(err) != codes.Unauthenticated ||
		!strings.Contains(err.Error(), "no credentials") {
		t.Fatalf("no credentials: %v", err)
	}
	if _, err := healthpb.NewHealthClient(anon).Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("health without credentials (API_PUBLIC_HEALTH unset): %v", err)
	}
	if _, err := pb.NewWorkManagerServiceClient(wrong).ListWorkers(ctx, &pb.ListWorkersRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
	rc := pb.NewWorkManagerServiceClient(reader)
	if _, err := rc.ListWorkers(ctx, &pb.ListWorkersRequest{}); err != nil {
		t.Fatalf("reader lists: %v", err)
	}
	_, err := rc.CreateWorker(ctx, &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: topicName(t, "in"), Name: "by-a-reader",
		Code: pyCode([]byte("def process(event):\n    return None\n"))})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "needs the operator role") {
		t.Fatalf("reader creates: %v", err)
	}
	if _, err := e.client.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: "by-a-reader"}); status.Code(err) != codes.NotFound {
		t.Fatalf("the refused worker exists: %v", err)
	}
	// The admin (the harness's dev token) creates.
	e.create(t, topicName(t, "in"), echoWorker(topicName(t, "out"), "v1"))
}

// The API's limits and its HTTP health on the real stack: a caller over
// its rate of changing calls gets RESOURCE_EXHAUSTED (others and reads do
// not), code over API_MAX_CODE_BYTES is INVALID_ARGUMENT, and /health
// says whether authentication is on, loudly when it is off.
func TestAPILimitsAndHealth(t *testing.T) {
	inTurn(t) // a stack of its own
	port, err := devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	healthAddr := fmt.Sprintf("127.0.0.1:%d", port)
	e := newEnvWith(t, envConfig{apiEnv: []string{"API_RATE_LIMIT=1", "API_RATE_BURST=3", "API_MAX_CODE_BYTES=1000",
		"WORKMANAGER_API_HEALTH_ADDR=" + healthAddr}})
	ctx := ctxT(t)
	// Reads are not limited (the harness has listed already).
	for range 5 {
		if _, err := e.client.ListWorkers(ctx, &pb.ListWorkersRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = e.client.CreateWorker(ctx, &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: topicName(t, "in"),
		Code: pyCode(make([]byte, 1001))})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "more than API_MAX_CODE_BYTES 1000") {
		t.Fatalf("oversized code: %v", err)
	}
	// The create took one of the 3 calls of the burst.
	var limited error
	for i := range 10 {
		_, err := e.client.StopWorker(ctx, &pb.StopWorkerRequest{WorkerId: "no-such-worker"})
		if status.Code(err) == codes.ResourceExhausted {
			limited = err
			if i < 2 {
				t.Fatalf("limited within the burst (call %d): %v", i, err)
			}
			break
		}
	}
	if limited == nil || !strings.Contains(limited.Error(), "API_RATE_LIMIT") {
		t.Fatalf("10 quick changing calls were not limited: %v", limited)
	}
	var report struct {
		Status string
		Checks map[string]struct{ Status, Detail string }
	}
	get := func() {
		t.Helper()
		resp, err := http.Get("http://" + healthAddr + "/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&report); err != nil {
			t.Fatal(err)
		}
	}
	get()
	if c := report.Checks["auth"]; c.Status != "Healthy" || report.Status != "Healthy" || report.Checks["temporal"].Status != "Healthy" || report.Checks["state"].Status != "Healthy" {
		t.Fatalf("API health with authentication on: %+v", report)
	}
	// An API with authentication off says so on /health.
	port, err = devstack.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	offHealth := fmt.Sprintf("127.0.0.1:%d", port)
	e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := e.stack.StartAPI(filepath.Join(e.bins, "api"), addr, "API_AUTH=off", "WORKMANAGER_API_HEALTH_ADDR="+offHealth)
		if err != nil {
			return p, err
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
		return p, devstack.WaitHTTP(ctx, p, "http://"+offHealth+"/health", 30*time.Second)
	})
	healthAddr = offHealth
	get()
	if c := report.Checks["auth"]; c.Status != "Degraded" || !strings.Contains(c.Detail, "API_AUTH=off") || report.Status != "Degraded" {
		t.Fatalf("API health with authentication off: %+v", report)
	}
}

// Mutual TLS with the dev certificates (make run RUN_FLAGS=-mtls): a
// client certificate authenticates (CN dev, OU admin, O default), a
// bearer token still does over TLS, a TLS caller with neither is
// UNAUTHENTICATED, and plaintext gets no answer.
func TestAPIMutualTLS(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnv(t, "")
	certs, err := devstack.DevTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, addr := e.onFreePort(func(addr string) (*devstack.Proc, error) {
		p, err := e.stack.StartAPI(filepath.Join(e.bins, "api"), addr, certs.Env()...)
		if err != nil {
			return p, err
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
		return p, devstack.WaitTCP(ctxT(t), p, addr, 30*time.Second)
	})
	caPEM, err := os.ReadFile(certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	client, err := tls.LoadX509KeyPair(certs.ClientCert, certs.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(opts ...grpc.DialOption) pb.WorkManagerServiceClient {
		conn, err := grpc.NewClient(addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return pb.NewWorkManagerServiceClient(conn)
	}
	ctx := ctxT(t)
	list := func(c pb.WorkManagerServiceClient) error {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := c.ListWorkers(ctx, &pb.ListWorkersRequest{})
		return err
	}
	withCert := dial(grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{client}})))
	if err := list(withCert); err != nil {
		t.Fatalf("client certificate: %v", err)
	}
	token, _, err := devstack.DevToken(e.stack.Dir)
	if err != nil {
		t.Fatal(err)
	}
	tlsOnly := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots}))
	if err := list(dial(tlsOnly, grpc.WithPerRPCCredentials(devstack.Bearer(token)))); err != nil {
		t.Fatalf("bearer token over TLS: %v", err)
	}
	if err := list(dial(tlsOnly)); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("TLS without credentials: %v", err)
	}
	if err := list(dial(grpc.WithTransportCredentials(insecure.NewCredentials()))); err == nil || status.Code(err) == codes.OK {
		t.Fatal("plaintext was answered")
	}
}
