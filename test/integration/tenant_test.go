package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Tenants on the real stack: each caller's tenant comes from its
// credentials; a tenant sees and changes only its own workers, its workers
// stay under its topic prefix (in and out), the workflows carry the
// WorkerTenant search attribute, lifecycle events carry the tenant, and
// the default tenant (the dev token) keeps bare ids and any topic.
func TestTenants(t *testing.T) {
	inTurn(t) // functional, no timing assertions: runs next to the other parallel tests after the serial ones
	e := newEnvWithTokens(t, []apiToken{
		{"acme-operator-token-01", "operator", "acme", "alice"},
		{"acme-reader-token-0001", "reader", "acme", "ann"},
		{"globex-operator-token1", "operator", "globex", "bob"},
	}, "TENANT_TOPIC_PREFIXES=globex=gx/")
	as := func(token string) pb.WorkManagerServiceClient {
		conn, err := grpc.NewClient(e.apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(devstack.Bearer(token)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return pb.NewWorkManagerServiceClient(conn)
	}
	acme, acmeReader, globex := as("acme-operator-token-01"), as("acme-reader-token-0001"), as("globex-operator-token1")
	ctx := ctxT(t)
	suffix := strings.ToLower(t.Name())
	acmeIn, acmeOut := "acme."+topicName(t, "in"), "acme."+topicName(t, "out")

	// Topics outside the tenant's prefix are refused, and nothing is created.
	for _, req := range []*pb.CreateWorkerRequest{
		{Topic: topicName(t, "in"), Name: "outside"},
		{Topic: "gx/" + suffix, Name: "outside"},
		{Topic: acmeIn, Name: "outside", AllowedOutputTopics: []string{"gx/*"}},
	} {
		req.MimeType, req.Code = "text/x-python", pyCode(echoWorker(acmeOut, "v1"))
		if _, err := acme.CreateWorker(ctx, req); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `must start with "acme."`) {
			t.Fatalf("acme creates on %q (outputs %q): %v", req.Topic, req.AllowedOutputTopics, err)
		}
	}
	if _, err := acme.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: "outside"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a refused worker exists: %v", err)
	}

	// Each tenant creates a worker named "shared": two workers, ids that
	// carry their tenant.
	mk := func(c pb.WorkManagerServiceClient, topic, out string) *pb.Worker {
		t.Helper()
		resp, err := c.CreateWorker(ctx, &pb.CreateWorkerRequest{MimeType: "text/x-python", Topic: topic, Name: "shared",
			Code: pyCode(echoWorker(out, "v1"))})
		if err != nil {
			t.Fatalf("CreateWorker on %s: %v", topic, err)
		}
		w, err := c.StartWorker(ctx, &pb.StartWorkerRequest{WorkerId: resp.GetWorkerId()})
		if err != nil {
			t.Fatalf("StartWorker: %v", err)
		}
		return w
	}
	aw := mk(acme, acmeIn, acmeOut)
	gw := mk(globex, "gx/"+topicName(t, "in"), "gx/"+topicName(t, "out"))
	if !strings.HasPrefix(aw.GetWorkerId(), "acme.") || aw.GetTenant() != "acme" || !strings.HasPrefix(gw.GetWorkerId(), "globex.") || gw.GetTenant() != "globex" {
		t.Fatalf("ids and tenants: %s %s, %s %s", aw.GetWorkerId(), aw.GetTenant(), gw.GetWorkerId(), gw.GetTenant())
	}

	// globex cannot see, stop, reload, replay or delete acme's worker, by id
	// or by name (its "shared" is its own); the answer is the one for a
	// worker that does not exist.
	notFound := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "not found") {
			t.Fatalf("globex %s acme's worker: %v", what, err)
		}
	}
	id := aw.GetWorkerId()
	_, err := globex.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: id})
	notFound("gets", err)
	_, err = globex.StopWorker(ctx, &pb.StopWorkerRequest{WorkerId: id})
	notFound("stops", err)
	_, err = globex.LoadCode(ctx, &pb.LoadCodeRequest{WorkerId: id, Code: pyCode(echoWorker(acmeOut, "evil"))})
	notFound("replaces", err)
	_, err = globex.DeleteWorker(ctx, &pb.DeleteWorkerRequest{WorkerId: id})
	notFound("deletes", err)
	_, err = globex.GetWorkerHistory(ctx, &pb.GetWorkerHistoryRequest{WorkerId: id})
	notFound("reads the history of", err)
	if w, err := globex.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: "shared"}); err != nil || w.GetWorkerId() != gw.GetWorkerId() {
		t.Fatalf("globex's \"shared\": %v %v", w, err)
	}
	list := func(c pb.WorkManagerServiceClient) map[string]bool {
		t.Helper()
		resp, err := c.ListWorkers(ctx, &pb.ListWorkersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		ids := map[string]bool{}
		for _, w := range resp.GetWorkers() {
			ids[w.GetWorkerId()] = true
		}
		return ids
	}
	if ids := list(globex); ids[id] || !ids[gw.GetWorkerId()] {
		t.Fatalf("globex lists %v", ids)
	}
	if ids := list(acmeReader); !ids[id] || ids[gw.GetWorkerId()] {
		t.Fatalf("acme's reader lists %v", ids)
	}
	if ids := list(e.client); !ids[id] || !ids[gw.GetWorkerId()] {
		t.Fatalf("the admin lists %v", ids)
	}
	if _, err := acmeReader.StopWorker(ctx, &pb.StopWorkerRequest{WorkerId: id}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("acme's reader stops: %v", err)
	}

	// The worker runs: in and out under the prefix; an output outside it
	// is refused (dead letter with output_policy).
	outs := e.subscribe(acmeOut)
	e.publish(acmeIn, "t-1", map[string]any{"n": 1}, "")
	if got := decodeOut(t, expectEvent(t, outs, 30*time.Second).Data()); got.Version != "v1" {
		t.Fatalf("output %+v", got)
	}
	dead := e.subscribe(acmeIn + "-dead")
	if _, err := acme.LoadCode(ctx, &pb.LoadCodeRequest{WorkerId: "shared", Code: pyCode(echoWorker("gx/stolen", "v2"))}); err != nil {
		t.Fatal(err)
	}
	e.publish(acmeIn, "t-2", map[string]any{"n": 2}, "")
	dl := expectEvent(t, dead, 60*time.Second)
	if r, _ := dl.Extensions()["deadletterreason"].(string); r != "output_policy" || !strings.Contains(fmt.Sprint(dl.Extensions()["deadlettererror"]), "outside the tenant's topics") {
		t.Fatalf("dead letter %v", dl.Extensions())
	}

	// Lifecycle events carry the tenant; the workflows are listed per tenant.
	if ev := e.waitLifecycle(id, lifecycleevents.Started, 30*time.Second); ev.Data.Tenant != "acme" {
		t.Fatalf("lifecycle event tenant %q", ev.Data.Tenant)
	}
	tc := e.temporalClient(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := tc.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: "WorkerTenant = 'acme'"})
		if err == nil && len(resp.GetExecutions()) >= 1 {
			for _, x := range resp.GetExecutions() {
				if !strings.Contains(x.GetExecution().GetWorkflowId(), "acme.") {
					t.Fatalf("WorkerTenant = 'acme' lists %s", x.GetExecution().GetWorkflowId())
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no workflow listed for WorkerTenant = 'acme': %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
