package reconcile_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/node/nodetest"
	"github.com/virtufin/workmanager/services/reconcile"
)

// A node whose lease check fails for longer than the lease fences itself
// (serves no worker, and reconcile attaches none meanwhile); when the check
// answers again it unfences and serves the catalog's workers again.
func TestLeaseFencesAndUnfencesTheNode(t *testing.T) {
	f, ctx := nodetest.New(t), context.Background()
	sha, _ := f.Catalog.PutCode(ctx, []byte("good"))
	w := nodetest.Worker(catalog.StatusRunning, sha)
	if err := f.Node.Apply(ctx, w, nil); err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	down.Store(true)
	h := health.New()
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	go reconcile.LeaseLoop(lctx, slog.New(slog.NewTextHandler(io.Discard, nil)), func(context.Context) error {
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	}, f.Node, h, 200*time.Millisecond)

	// The loop fences the node, then reports it: wait for both.
	waitUntil(t, "fenced and reported Unhealthy", func() bool {
		return f.Node.Fenced() && !f.Dispatcher.Attached(w.ID) && h.Report().Checks[reconcile.Temporal].Status == health.Unhealthy
	})
	if res, err := f.Node.Reconcile(ctx); err != nil || f.Dispatcher.Attached(w.ID) {
		t.Fatalf("a fenced node's reconcile attached the worker: %+v %v", res, err)
	}
	down.Store(false)
	waitUntil(t, "unfenced, serving and reported Healthy", func() bool {
		return !f.Node.Fenced() && f.Dispatcher.Attached(w.ID) && h.Report().Checks[reconcile.Temporal].Status == health.Healthy
	})
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
