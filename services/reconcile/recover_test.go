package reconcile_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/mocks"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/services/reconcile"
	"github.com/virtufin/workmanager/workflows"
)

// Issue 33 item 9: a start-up recovery that fails (Temporal not up yet) is
// tried again until it succeeds, and the node then reconciles and reports
// recovery healthy, instead of staying unready for ever.
func TestRecoverLoopRetriesAFailedRecovery(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	if err := f.Catalog.SaveWorker(ctx, nodetest.Worker(catalog.StatusRunning, sha)); err != nil {
		t.Fatal(err)
	}
	tc := mocks.NewClient(t)
	tc.On("ExecuteWorkflow", mock.Anything, mock.Anything, mock.Anything, mock.Anything).Return(nil, errors.New("connection refused")).Twice()
	run := mocks.NewWorkflowRun(t)
	run.On("Get", mock.Anything, mock.Anything).Return(func(_ context.Context, v any) error {
		*(v.(*workflows.RecoveryResult)) = workflows.RecoveryResult{Recovered: 1}
		return nil
	}).Once()
	tc.On("ExecuteWorkflow", mock.Anything, mock.Anything, mock.Anything, mock.Anything).Return(run, nil).Once()
	h := health.New()
	var mu sync.Mutex
	var outcomes []error
	reconcile.RecoverLoop(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), tc, f.Node, h, true, 0, 10*time.Millisecond, func(_ time.Duration, err error) {
		mu.Lock()
		outcomes = append(outcomes, err)
		mu.Unlock()
	})
	if len(outcomes) != 3 || outcomes[0] == nil || outcomes[1] == nil || outcomes[2] != nil {
		t.Fatalf("outcomes %v: want two failures, then success", outcomes)
	}
	if c := h.Report().Checks[health.Recovery]; c.Status != health.Healthy || !h.Ready() {
		t.Fatalf("recovery check %+v", c)
	}
	if f.Engine.Loads() != 1 {
		t.Fatalf("the node reconciled %d loads, want its worker attached", f.Engine.Loads())
	}
}

// Issue 49 item 5 (which replaces issue 33 item 9): with recovery on
// start off, the node reconciles itself once before it reports recovery
// healthy — it keeps what it should not run detached — but brings no
// RUNNING worker up: that waits for RecoverWorkers (AwaitRecovery).
func TestRecoverLoopWithRecoveryOffHoldsTheRestore(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	if err := f.Catalog.SaveWorker(ctx, nodetest.Worker(catalog.StatusRunning, sha)); err != nil {
		t.Fatal(err)
	}
	h := health.New()
	reconcile.RecoverLoop(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), mocks.NewClient(t), f.Node, h, false, 0, 10*time.Millisecond, nil)
	if f.Engine.Loads() != 0 || !f.Node.RestoreHeld() {
		t.Fatalf("loads %d, held %v: the worker must wait for RecoverWorkers", f.Engine.Loads(), f.Node.RestoreHeld())
	}
	if c := h.Report().Checks[health.Recovery]; c.Status != health.Healthy || !h.Ready() || !strings.Contains(c.Detail, "1 running workers wait for RecoverWorkers") {
		t.Fatalf("recovery check %+v", c)
	}
}
