package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// testReplayRealHistory replays the histories a real server recorded for a
// worker's whole lifecycle and for a recovery against the current workflow
// code: a non-deterministic change fails here. With WM_RECORD_HISTORY=1 it
// also refreshes workflows/testdata/{worker,recovery}_history.json for the
// unit replay test.
func testReplayRealHistory(t *testing.T) {
	e := sharedEnv(t)
	id := e.create(t, topicName(t, "in"), echoWorker("replay-out", "v1"))
	ctx := ctxT(t)
	if _, err := e.client.StopWorker(ctx, &pb.StopWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	if r, err := e.client.RecoverWorkers(ctx, &pb.RecoverWorkersRequest{}); err != nil || r.GetRecovered() != 1 {
		t.Fatalf("RecoverWorkers: %v %v", r, err)
	}
	if _, err := e.client.StartWorker(ctx, &pb.StartWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.LoadCode(ctx, &pb.LoadCodeRequest{WorkerId: id, Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: echoWorker("replay-out", "v2")}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.DeleteWorker(ctx, &pb.DeleteWorkerRequest{WorkerId: id}); err != nil {
		t.Fatal(err)
	}
	tc := e.temporalClient(t)
	replay(t, history(t, tc, workflows.WorkflowID(id)), workflows.WorkerWorkflow, "worker_history.json")
	replay(t, history(t, tc, workflows.RecoveryWorkflowID), workflows.RecoveryWorkflow, "recovery_history.json")
}

// history fetches the latest run's history of a workflow.
func history(t *testing.T, tc client.Client, workflowID string) *historypb.History {
	t.Helper()
	hist := &historypb.History{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	it := tc.GetWorkflowHistory(ctx, workflowID, "", false, 0)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		hist.Events = append(hist.Events, ev)
	}
	return hist
}

// replay replays hist against wf and, with WM_RECORD_HISTORY=1, records it
// as workflows/testdata/file.
func replay(t *testing.T, hist *historypb.History, wf any, file string) {
	t.Helper()
	r := worker.NewWorkflowReplayer()
	r.RegisterWorkflow(wf)
	if err := r.ReplayWorkflowHistory(nil, hist); err != nil {
		t.Fatalf("replay %s: %v", file, err)
	}
	if os.Getenv("WM_RECORD_HISTORY") != "" {
		b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(hist)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repoRoot(), "workflows", "testdata", file), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
