package workflows

import (
	"testing"

	"go.temporal.io/sdk/worker"
)

// TestReplayRecordedHistory replays worker lifecycles (create, stop, start,
// load_code, delete) recorded on a real Temporal server against the current
// code: one from before the sync-all-nodes change (it must keep its path
// through the version marker) and one from the current code. Refresh the
// current one with `WM_RECORD_HISTORY=1 go test ./test/integration -run
// TestReplayRealHistory`; an incompatible change is versioned, and the
// history it replaces is kept here.
func TestReplayRecordedHistory(t *testing.T) {
	for _, f := range []string{"testdata/worker_history_unversioned.json", "testdata/worker_history.json"} {
		t.Run(f, func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(WorkerWorkflow)
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReplayRecordedRecovery replays two recoveries recorded on a real
// server: one from before paged recovery (it must keep taking the old path
// through the pagedRecovery version marker) and one from the current code
// (refreshed by the same WM_RECORD_HISTORY run as worker_history.json).
func TestReplayRecordedRecovery(t *testing.T) {
	for _, f := range []string{"testdata/recovery_history_unversioned.json", "testdata/recovery_history.json"} {
		t.Run(f, func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(RecoveryWorkflow)
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatal(err)
			}
		})
	}
}
