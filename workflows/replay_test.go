package workflows

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/worker"
	"google.golang.org/protobuf/encoding/protojson"
)

// Recorded histories, each recorded on a real Temporal server (the
// integration stack: its own dev server, daprd, Redis and nodes) and
// replayed against the current code: a non-deterministic change of the
// branch a history took fails here. Every change to workflow code is
// versioned (workflow.GetVersion) and the histories of the code it replaces
// are kept beside the new ones: a deployment may have such workflows
// running. TestReplayCoversEveryVersion checks that every version's new
// side is in one of them.
//
//   - worker_history.json, recovery_history.json: a lifecycle (create,
//     stop, start, load_code, delete) and a recovery from before any
//     version (refresh with `WM_RECORD_HISTORY=1 go test ./test/integration
//     -run TestSharedStack/ReplayRealHistory`).
//   - recovery_paged_history.json: a recovery with paged-index, recorded by
//     that hook on commit 6ddad88 (before recovery-window): the recovery a
//     deployment of that commit may have running when it is upgraded.
//   - the others were recorded by a one-off test on the integration
//     harness (two nodes, A and B; WM_TEST_STATE_FAULT_FILE), with the
//     binaries of commit 14bcea0 plus worker-incarnation:
//   - worker_recovered_history.json: the worker's workflow terminated (lost),
//     RecoverWorkers starts it again (recovered-rereads-catalog), then stop
//     and delete; recovery_window_history.json is that recovery
//     (recovery-window).
//   - worker_create_outlasting_history.json: a workflow started with a 1 ms
//     CreateTimeout and two create updates with CreateID "" (a run of
//     recovery's kind), the code's load taking 1.5 s: the create outlasts
//     the timeout (create-outlasting-timeout-lives) and the second create,
//     queued on the lock, is refused (create-rechecks-after-lock); then
//     delete.
//   - worker_create_failed_history.json: a create whose Apply fails every
//     attempt (the worker's history key refused by the fault file):
//     apply-failure-reads-record, apply-failure-resyncs-nodes,
//     failed-create-always-undone.
//   - worker_node_failures_history.json: node B SIGSTOPped (still a member):
//     a stop answered NotApplied (node-failures-reported), then a delete
//     (delete-failures-reported).
//   - worker_unannounced_history.json (the same way, with binaries of the
//     work on issue 43 item 7): create; a LoadCode whose Apply fails (the
//     history key refused); a stop that node B (SIGSTOPped) did not apply;
//     B runs again, and a LoadCode that every node applies takes the failed
//     load's number (failed-load-number-reused) and publishes the held
//     "stopped" (unannounced-events-published); delete.
//   - worker_deleted_history.json: create, stop, start (through the
//     temporal CLI), delete, which sets the WorkerStatus search attribute
//     to DELETED (deleted-search-attribute); recorded by
//     `WM_RECORD_HISTORY=1 go test ./test/integration -run
//     'TestSharedStack$/^TemporalCLIControlsWorker$'`.
//   - worker_local_activities_history.json: create, stop, start, LoadCode,
//     delete (wmctl on bin/devstack, half a second apart) with ListNodes
//     and Emit run as local activities (local-list-and-emit, issue 48).
//
// Every lifecycle history after the first also takes
// unconfirmed-nodes-not-applied, and every create worker-incarnation.
var (
	workerHistories = []string{
		"testdata/worker_history.json",
		"testdata/worker_recovered_history.json",
		"testdata/worker_create_outlasting_history.json",
		"testdata/worker_create_failed_history.json",
		"testdata/worker_node_failures_history.json",
		"testdata/worker_unannounced_history.json",
		"testdata/worker_deleted_history.json",
		"testdata/worker_local_activities_history.json",
		// An epoch-1 run (WorkerInput.Epoch): create, stop, start, reload,
		// rollback, delete on make run, no version marker.
		"testdata/worker_epoch1_history.json",
		// An epoch-2 run: the same calls on make run (one node), whose
		// fan-out skips the node that made each change: no Activate.
		"testdata/worker_epoch2_history.json",
		// An epoch-3 run continued as new by its bound (3) before it was
		// MinRunAge old: stops and starts on make run with
		// WORKMANAGER_CONTINUE_AS_NEW_AFTER=3 (TestEpoch3RunWaitsOutMinRunAge).
		"testdata/worker_epoch3_min_age_history.json",
		// Epoch-4 runs on make run: create, stop, start, reload, rollback,
		// delete; and a create the code's check refused
		// (TestEpoch4CreateSetsNoTimerAndUpsertsOnlyChanges).
		"testdata/worker_epoch4_history.json",
		"testdata/worker_epoch4_create_failed_history.json",
		// An epoch-5 run on make run, the same six calls: Apply as a
		// local activity (TestEpoch5AppliesInTheWorkflowTask).
		"testdata/worker_epoch5_history.json",
		// An epoch-6 run on make run, the same six calls: the delete's
		// Delete as a local activity too (TestEpoch6DeletesInTheWorkflowTask).
		"testdata/worker_epoch6_history.json",
	}
	recoveryHistories = []string{
		"testdata/recovery_history.json",
		"testdata/recovery_paged_history.json",
		"testdata/recovery_window_history.json",
	}
)

// TestReplayRecordedHistory replays the recorded worker workflows.
func TestReplayRecordedHistory(t *testing.T) {
	replayFiles(t, WorkerWorkflow, workerHistories)
}

// TestReplayRecordedPlacement replays a placement workflow recorded on the
// real stack (three nodes, a fourth joining, one killed, one drained:
// test/integration TestPlacementAcrossNodes with WM_RECORD_HISTORY=1).
func TestReplayRecordedPlacement(t *testing.T) {
	replayFiles(t, PlacementWorkflow, []string{"testdata/placement_history.json"})
}

// TestReplayRecordedRecovery replays the recorded recoveries.
func TestReplayRecordedRecovery(t *testing.T) {
	replayFiles(t, RecoveryWorkflow, recoveryHistories)
}

func replayFiles(t *testing.T, wf any, files []string) {
	t.Helper()
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflow(wf)
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReplayCoversEveryVersion fails when a change id of workflow.GetVersion
// in this package has no recorded history that took its new version (1): a
// new versioned branch needs one (record it on the real stack, as above).
func TestReplayCoversEveryVersion(t *testing.T) {
	src, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	// The change id is a string literal or a constant of this package.
	// (entity.version's calls, of epoch-0 runs, included; the id in
	// version's own GetVersion call is its parameter.)
	call := regexp.MustCompile(`(?:GetVersion\(ctx|e\.version\(ctx), ("[^"]+"|\w+)(?:, workflow\.DefaultVersion, 1)?\)`)
	var code []byte
	for _, f := range src {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		code = append(code, b...)
	}
	var ids []string
	for _, m := range call.FindAllSubmatch(code, -1) {
		id := string(m[1])
		if id == "changeID" {
			continue
		}
		if !strings.HasPrefix(id, `"`) {
			c := regexp.MustCompile(`(?m)^\s*(?:const\s+)?` + id + `\s*=\s*"([^"]+)"`).FindSubmatch(code)
			if c == nil {
				t.Fatalf("GetVersion's change id %s: no string constant of that name", id)
			}
			id = `"` + string(c[1]) + `"`
		}
		if id = strings.Trim(id, `"`); !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		t.Fatal("no GetVersion call found: the pattern is out of date")
	}
	recorded := map[string]string{}
	for _, f := range slices.Concat(workerHistories, recoveryHistories) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var h historypb.History
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &h); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, ev := range h.GetEvents() {
			m := ev.GetMarkerRecordedEventAttributes()
			if m.GetMarkerName() != "Version" {
				continue
			}
			var id string
			var version int
			dc := converter.GetDefaultDataConverter()
			if err := dc.FromPayloads(m.GetDetails()["change-id"], &id); err != nil {
				t.Fatalf("%s: change id: %v", f, err)
			}
			if err := dc.FromPayloads(m.GetDetails()["version"], &version); err != nil {
				t.Fatalf("%s: version: %v", f, err)
			}
			if version == 1 {
				recorded[id] = f
			}
		}
	}
	for _, id := range ids {
		if f, ok := recorded[id]; ok {
			t.Logf("%s: %s", id, f)
		} else {
			t.Errorf("version %q: no recorded history takes its new side", id)
		}
	}
}

// TestEpochRunRecordsNoVersionMarker: runs started with an epoch
// (recorded on the real stack, make run with one node: a create, stop,
// start, reload, rollback and delete each) record no version marker and
// no TemporalChangeVersion upsert — what epochs save, two history events
// and a visibility write per change — and replay
// (TestReplayRecordedHistory). The epoch-2 run (CurrentEpoch) schedules
// no Activate (its only node made every change: skipApplier) and cancels
// the create's timeout timer (awaitCreate).
func TestEpochRunRecordsNoVersionMarker(t *testing.T) {
	for file, epoch := range map[string]int{"testdata/worker_epoch1_history.json": 1, "testdata/worker_epoch2_history.json": 2} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var h historypb.History
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &h); err != nil {
			t.Fatal(err)
		}
		var in WorkerInput
		if err := converter.GetDefaultDataConverter().FromPayloads(h.GetEvents()[0].GetWorkflowExecutionStartedEventAttributes().GetInput(), &in); err != nil || in.Epoch != epoch {
			t.Fatalf("%s: the recorded run's input: epoch %d (%v), want %d", file, in.Epoch, err, epoch)
		}
		updates, activates, timers := 0, 0, 0
		for _, ev := range h.GetEvents() {
			if ev.GetMarkerRecordedEventAttributes().GetMarkerName() == "Version" {
				t.Fatalf("%s: event %d: a version marker in an epoch-%d run", file, ev.GetEventId(), epoch)
			}
			if _, ok := ev.GetUpsertWorkflowSearchAttributesEventAttributes().GetSearchAttributes().GetIndexedFields()["TemporalChangeVersion"]; ok {
				t.Fatalf("%s: event %d: a TemporalChangeVersion upsert in an epoch-%d run", file, ev.GetEventId(), epoch)
			}
			if ev.GetWorkflowExecutionUpdateCompletedEventAttributes() != nil {
				updates++
			}
			if ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() == "Activate" {
				activates++
			}
			switch {
			case ev.GetTimerStartedEventAttributes() != nil:
				timers++
			case ev.GetTimerCanceledEventAttributes() != nil:
				timers--
			}
		}
		if updates != 6 {
			t.Fatalf("%s: %d updates completed in the recorded run, want 6 (create, stop, start, reload, rollback, delete)", file, updates)
		}
		if want := map[int]int{1: 6, 2: 0}[epoch]; activates != want {
			t.Fatalf("%s: %d Activates scheduled on one node, want %d", file, activates, want)
		}
		// The create's timeout timer: left to fire in epoch 1, cancelled
		// once the create is done from epoch 2 on (awaitCreate).
		if want := map[int]int{1: 1, 2: 0}[epoch]; timers != want {
			t.Fatalf("%s: %d timers left running, want %d", file, timers, want)
		}
	}
}

// recordedRun loads a history recorded on the real stack and the input
// its run was started with.
func recordedRun(t *testing.T, file string) ([]*historypb.HistoryEvent, WorkerInput) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var h historypb.History
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	var in WorkerInput
	if err := converter.GetDefaultDataConverter().FromPayloads(h.GetEvents()[0].GetWorkflowExecutionStartedEventAttributes().GetInput(), &in); err != nil {
		t.Fatalf("%s: the run's input: %v", file, err)
	}
	return h.GetEvents(), in
}

// TestEpoch4CreateSetsNoTimerAndUpsertsOnlyChanges: in runs of epoch 4
// recorded on the real stack, a create sent with the start (the API's
// UpdateWithStart, which sets WorkerStatus RUNNING at the start) starts no
// timeout timer and upserts no search attribute: the create is 15 history
// events (18 in epoch 3). A stop and a start upsert WorkerStatus alone, a
// reload and a rollback nothing; a create the code's check refused takes
// WorkerStatus off again before the run fails, so a query for running
// workers does not list it.
func TestEpoch4CreateSetsNoTimerAndUpsertsOnlyChanges(t *testing.T) {
	load := func(file string) []*historypb.HistoryEvent {
		evs, in := recordedRun(t, file)
		if in.Epoch != 4 {
			t.Fatalf("%s: the recorded run's epoch is %d, want 4", file, in.Epoch)
		}
		return evs
	}
	evs := load("testdata/worker_epoch4_history.json")
	if _, ok := evs[0].GetWorkflowExecutionStartedEventAttributes().GetSearchAttributes().GetIndexedFields()["WorkerStatus"]; !ok {
		t.Fatal("the run was started without WorkerStatus")
	}
	var upserts [][]string
	createdAt := 0
	for _, ev := range evs {
		if ev.GetTimerStartedEventAttributes() != nil {
			t.Fatalf("event %d: a timer in an epoch-4 run whose create came with its start", ev.GetEventId())
		}
		if a := ev.GetUpsertWorkflowSearchAttributesEventAttributes(); a != nil {
			var keys []string
			for k := range a.GetSearchAttributes().GetIndexedFields() {
				keys = append(keys, k)
			}
			upserts = append(upserts, keys)
		}
		if ev.GetWorkflowExecutionUpdateCompletedEventAttributes() != nil && createdAt == 0 {
			createdAt = int(ev.GetEventId())
			if len(upserts) != 0 {
				t.Fatalf("the create upserted %v", upserts)
			}
		}
	}
	if createdAt != 15 {
		t.Fatalf("the create completed at event %d, want 15", createdAt)
	}
	// Stop, start (WorkerStatus each) and delete (WorkerStatus DELETED).
	if len(upserts) != 3 {
		t.Fatalf("upserts %v, want 3 (stop, start, delete)", upserts)
	}
	for _, keys := range upserts {
		if len(keys) != 1 || keys[0] != "WorkerStatus" {
			t.Fatalf("an upsert of %v, want WorkerStatus alone", keys)
		}
	}

	evs = load("testdata/worker_epoch4_create_failed_history.json")
	last := evs[len(evs)-1]
	if last.GetWorkflowExecutionFailedEventAttributes() == nil {
		t.Fatalf("the refused create's run ended with %s, want failed", last.GetEventType())
	}
	prev := evs[len(evs)-2].GetUpsertWorkflowSearchAttributesEventAttributes()
	if prev == nil {
		t.Fatalf("event %d before the failure is %s, want the upsert that takes WorkerStatus off", len(evs)-1, evs[len(evs)-2].GetEventType())
	}
	f, ok := prev.GetSearchAttributes().GetIndexedFields()["WorkerStatus"]
	if !ok || len(f.GetData()) != 0 && string(f.GetData()) != "null" {
		t.Fatalf("the upsert before the failure: WorkerStatus %v (set %v), want it unset", f, ok)
	}
}

// callTasks is what a recorded run's history says of its calls: the
// activities it scheduled (by name), its local activities (by name), its
// updates, and how many completed in the workflow task that accepted
// them.
type callTasks struct {
	scheduled, local   map[string]int
	updates, inOneTask int
}

func callTasksOf(evs []*historypb.HistoryEvent) callTasks {
	c := callTasks{scheduled: map[string]int{}, local: map[string]int{}}
	taskOfAccept := false
	for _, ev := range evs {
		switch {
		case ev.GetActivityTaskScheduledEventAttributes() != nil:
			c.scheduled[ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName()]++
		case ev.GetMarkerRecordedEventAttributes().GetMarkerName() == "LocalActivity":
			var la struct{ ActivityType string }
			if err := converter.GetDefaultDataConverter().FromPayloads(ev.GetMarkerRecordedEventAttributes().GetDetails()["data"], &la); err == nil {
				c.local[la.ActivityType]++
			}
		case ev.GetWorkflowExecutionUpdateAcceptedEventAttributes() != nil:
			taskOfAccept = true
		case ev.GetWorkflowTaskScheduledEventAttributes() != nil:
			taskOfAccept = false
		case ev.GetWorkflowExecutionUpdateCompletedEventAttributes() != nil:
			c.updates++
			if taskOfAccept {
				c.inOneTask++
			}
		}
	}
	return c
}

// TestEpoch5AppliesInTheWorkflowTask: in a run of epoch 5 recorded on the
// real stack (create, stop, start, reload, rollback, delete), Apply runs
// as a local activity in the workflow task that took the update: no Apply
// activity is scheduled, and each of the five changes completes in the
// workflow task that accepted it (one task a call; two in epoch 4). The
// delete's Delete is still an activity.
func TestEpoch5AppliesInTheWorkflowTask(t *testing.T) {
	evs, in := recordedRun(t, "testdata/worker_epoch5_history.json")
	if in.Epoch != 5 {
		t.Fatalf("the recorded run's epoch is %d, want 5", in.Epoch)
	}
	c := callTasksOf(evs)
	if c.scheduled["Apply"] != 0 || c.scheduled["Delete"] != 1 || c.updates != 6 || c.local["Apply"] != 5 || c.inOneTask != 5 {
		t.Fatalf("activities %v, %d updates, local %v, %d completed in the task that accepted them; want a Delete activity, 6 updates, 5 local Applies and 5 (the delete's Delete is an activity)",
			c.scheduled, c.updates, c.local, c.inOneTask)
	}
}

// TestEpoch6DeletesInTheWorkflowTask: in a run of epoch 6 recorded on
// make run (wmctl create, stop, start, reload, rollback, delete, half a
// second apart), the delete's Delete runs as a local activity too: no
// activity is scheduled at all, and each of the six calls completes in
// the workflow task that accepted it.
func TestEpoch6DeletesInTheWorkflowTask(t *testing.T) {
	evs, in := recordedRun(t, "testdata/worker_epoch6_history.json")
	if in.Epoch != 6 {
		t.Fatalf("the recorded run's epoch is %d, want 6", in.Epoch)
	}
	c := callTasksOf(evs)
	if len(c.scheduled) != 0 || c.updates != 6 || c.local["Delete"] != 1 || c.local["Apply"] != 5 || c.inOneTask != 6 {
		t.Fatalf("activities %v, %d updates, local %v, %d completed in the task that accepted them; want none, 6, a Delete and 5 Applies, and 6",
			c.scheduled, c.updates, c.local, c.inOneTask)
	}
}

// TestEpoch3RunWaitsOutMinRunAge: a run of epoch 3 recorded on the real
// stack (a bound of 3 reached 100 ms after the run began) started a timer
// for the rest of MinRunAge, took the updates that came meanwhile, and
// continued as new when it fired, no sooner than MinRunAge after its start
// (replayed by TestReplayRecordedHistory).
func TestEpoch3RunWaitsOutMinRunAge(t *testing.T) {
	evs, in := recordedRun(t, "testdata/worker_epoch3_min_age_history.json")
	if in.Epoch != 3 || in.ContinueAsNewAfter != 3 {
		t.Fatalf("the recorded run's input: epoch %d, bound %d, want 3 and 3", in.Epoch, in.ContinueAsNewAfter)
	}
	timerAt, fired, acceptedAfter := -1, false, 0
	for i, ev := range evs {
		switch {
		case ev.GetTimerStartedEventAttributes() != nil:
			timerAt = i
		case ev.GetTimerFiredEventAttributes() != nil:
			fired = true
		case ev.GetWorkflowExecutionUpdateAcceptedEventAttributes() != nil && timerAt >= 0:
			acceptedAfter++
		}
	}
	last := evs[len(evs)-1]
	if last.GetWorkflowExecutionContinuedAsNewEventAttributes() == nil || timerAt < 0 || !fired {
		t.Fatalf("want a timer started and fired, then continue-as-new; last event %s, timer at %d, fired %v", last.GetEventType(), timerAt, fired)
	}
	if acceptedAfter == 0 {
		t.Fatal("no update taken while the run waited out MinRunAge")
	}
	if lived := last.GetEventTime().AsTime().Sub(evs[0].GetEventTime().AsTime()); lived < MinRunAge {
		t.Fatalf("the run continued as new %s after its start, want at least %s", lived, MinRunAge)
	}
}
