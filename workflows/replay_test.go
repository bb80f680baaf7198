package workflows

import (
	"testing"

	"go.temporal.io/sdk/worker"
)

// TestReplayRecordedHistory replays a worker lifecycle (create, stop, start,
// load_code, delete) recorded on a real Temporal server against the current
// code. Refresh it with `WM_RECORD_HISTORY=1 go test ./test/integration -run
// TestSharedStack/ReplayRealHistory`. Every change to workflow code from now on is
// versioned (workflow.GetVersion) and the history it replaces is kept here
// beside the new one: a deployment may have such workflows running.
func TestReplayRecordedHistory(t *testing.T) {
	for _, f := range []string{"testdata/worker_history.json"} {
		t.Run(f, func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(WorkerWorkflow)
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReplayRecordedRecovery replays a recovery recorded on a real server
// (refreshed by the same WM_RECORD_HISTORY run as worker_history.json).
func TestReplayRecordedRecovery(t *testing.T) {
	for _, f := range []string{"testdata/recovery_history.json"} {
		t.Run(f, func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(RecoveryWorkflow)
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatal(err)
			}
		})
	}
}
