package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/node/nodetest"
)

// BenchmarkReconcileAfterLapse is what a node does when it is a cluster
// member again after a lapse (reconcile.MemberGate): fenced (every worker
// detached), unfenced, reconciled, so every Python worker is loaded again
// (a runner process started each). One at a time is the baseline, in the
// same run; ns/op is the whole pass over the workers.
func BenchmarkReconcileAfterLapse(b *testing.B) {
	const workers = 24
	for _, p := range []int{1, 2, node.DefaultReconcileParallelism} {
		b.Run(fmt.Sprintf("python-%d/parallelism-%d", workers, p), func(b *testing.B) {
			py := python.New(python.Config{Logger: slog.New(slog.DiscardHandler)})
			b.Cleanup(func() { _ = py.Close() })
			f, ctx := nodetest.New(b, py), context.Background()
			f.Node.SetReconcileParallelism(p)
			sha, err := f.Catalog.PutCode(ctx, []byte("def process(event):\n    return None\n"))
			if err != nil {
				b.Fatal(err)
			}
			for i := range workers {
				w := catalog.Worker{ID: fmt.Sprintf("w%02d", i), MIMEType: python.MIMEType, Topic: fmt.Sprintf("t%d", i%4),
					Status: catalog.StatusRunning, CodeVersion: 1, CodeSHA256: sha}
				if err := f.Catalog.SaveWorker(ctx, w); err != nil {
					b.Fatal(err)
				}
			}
			reconcile := func() {
				res, err := f.Node.Reconcile(ctx)
				if err != nil || res.Running != workers || res.Failed != 0 {
					b.Fatalf("reconcile: %+v %v", res, err)
				}
			}
			reconcile() // attached once, as before the lapse
			for b.Loop() {
				f.Node.Fence(ctx)
				f.Node.Unfence()
				reconcile()
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N)/workers, "ms/worker")
		})
	}
}
