package reconcile_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/services/reconcile"
)

// recoveryRuns answers DescribeWorkflowExecution with the recovery
// workflow's latest run as the test sets it (nil: not found).
type recoveryRuns struct {
	latest atomic.Pointer[workflowpb.WorkflowExecutionInfo]
	asked  atomic.Int32
}

func (r *recoveryRuns) DescribeWorkflowExecution(context.Context, string, string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	r.asked.Add(1)
	info := r.latest.Load()
	if info == nil {
		return nil, errors.New("not found")
	}
	return &workflowservice.DescribeWorkflowExecutionResponse{WorkflowExecutionInfo: info}, nil
}

// A node whose restore is held brings its RUNNING workers up only once a
// recovery completes after it started: not for one from before, nor for
// one still running.
func TestAwaitRecoveryRestoresOnlyAfterARecoveryRan(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	good, _ := f.Catalog.PutCode(ctx, []byte("good"))
	if err := f.Catalog.SaveWorker(ctx, nodetest.Worker(catalog.StatusRunning, good)); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	f.Node.HoldRestore()
	if _, err := f.Node.Reconcile(ctx); err != nil || f.Dispatcher.Attached("w1") {
		t.Fatalf("held reconcile attached w1 (%v)", err)
	}
	runs := &recoveryRuns{}
	runs.latest.Store(&workflowpb.WorkflowExecutionInfo{Status: enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED,
		CloseTime: timestamppb.New(started.Add(-time.Minute))}) // an old one
	done := make(chan struct{})
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		defer close(done)
		reconcile.AwaitRecovery(actx, slog.New(slog.NewTextHandler(io.Discard, nil)), runs, f.Node, health.New(), started, time.Millisecond)
	}()
	waitUntil(t, "three questions to Temporal", func() bool { return runs.asked.Load() >= 3 })
	runs.latest.Store(&workflowpb.WorkflowExecutionInfo{Status: enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING})
	n := runs.asked.Load()
	waitUntil(t, "three more", func() bool { return runs.asked.Load() >= n+3 })
	if f.Dispatcher.Attached("w1") || !f.Node.RestoreHeld() {
		t.Fatal("restored before any recovery completed after the node started")
	}
	runs.latest.Store(&workflowpb.WorkflowExecutionInfo{Status: enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, CloseTime: timestamppb.Now()})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("AwaitRecovery did not return after a recovery completed")
	}
	if !f.Dispatcher.Attached("w1") || f.Node.RestoreHeld() {
		t.Fatalf("after RecoverWorkers: attached %v, held %v; want w1 restored", f.Dispatcher.Attached("w1"), f.Node.RestoreHeld())
	}
}
