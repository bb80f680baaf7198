package node

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/virtufin/workmanager/internal/catalog"
)

// TestWorkerLogCarriesTheIDOnce (issue 44 item 4): the engines put
// worker_id on each line of a worker's own output (engines/internal/wire)
// and on their records about it; the node's logger for the worker must not
// add it again, also with a log budget and on its "dropped" notice.
func TestWorkerLogCarriesTheIDOnce(t *testing.T) {
	for _, budget := range []int{0, 1} {
		var buf bytes.Buffer
		n := New(slog.New(slog.NewTextHandler(&buf, nil)), nil, nil, nil, 0)
		n.SetLogBudget(budget)
		log := n.Spec(catalog.Worker{ID: "w-1"}).Logger
		log.Info("a line of the worker", "worker_id", "w-1", "stream", "stderr") // as wire.LineLogger
		log.With("worker_id", "w-1").Info("a native log call")                   // as engines/native
		log.Info("over the budget", "worker_id", "w-1")
		log.Info("let through after the notice", "worker_id", "w-1")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		for _, l := range lines {
			if c := strings.Count(l, "worker_id="); c != 1 {
				t.Errorf("budget %d: worker_id %d times in %q", budget, c, l)
			}
		}
	}
}
