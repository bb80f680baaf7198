package workflows

import (
	"testing"

	"go.temporal.io/sdk/worker"
)

// TestReplayRecordedHistory replays a worker lifecycle (create, stop, start,
// load_code, delete) recorded on a real Temporal server against the current
// code. Refresh it with `WM_RECORD_HISTORY=1 go test ./test/integration -run
// TestReplayRealHistory` only when a change is meant to be incompatible (and
// then version the workflow instead).
func TestReplayRecordedHistory(t *testing.T) {
	r := worker.NewWorkflowReplayer()
	r.RegisterWorkflow(WorkerWorkflow)
	if err := r.ReplayWorkflowHistoryFromJSONFile(nil, "testdata/worker_history.json"); err != nil {
		t.Fatal(err)
	}
}
