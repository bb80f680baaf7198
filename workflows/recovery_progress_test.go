package workflows

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
)

// recoveryRuns is what driveRecovery saw over every run of one recovery.
type recoveryRuns struct {
	runs, restarts int
	res            RecoveryResult
	activated      []string
	emitted        []activities.EmitInput
	inputs         []RecoveryInput // each continue-as-new's input
}

// driveRecovery runs a recovery the way a node does: each run under
// RecoveryRunTimeout, a continue-as-new goes on with its input, and a run
// that failed (timed out) is started again from the start (RecoverLoop).
// It gives up after maxRuns runs.
func driveRecovery(t *testing.T, start RecoveryInput, maxRuns int, mk func() *recoveryEnv) recoveryRuns {
	t.Helper()
	var out recoveryRuns
	in := start
	for {
		if out.runs == maxRuns {
			t.Fatalf("recovery did not finish in %d runs (%d restarted from the start after a failed run)", maxRuns, out.restarts)
		}
		out.runs++
		r := mk()
		r.env.SetWorkflowRunTimeout(RecoveryRunTimeout)
		r.env.ExecuteWorkflow(RecoveryWorkflow, in)
		require.True(t, r.env.IsWorkflowCompleted())
		r.mu.Lock()
		out.activated = append(out.activated, r.activated...)
		out.emitted = append(out.emitted, r.emitted...)
		r.mu.Unlock()
		err := r.env.GetWorkflowError()
		var can *workflow.ContinueAsNewError
		switch {
		case err == nil:
			require.NoError(t, r.env.GetWorkflowResult(&out.res))
			return out
		case errors.As(err, &can):
			in = RecoveryInput{}
			require.NoError(t, converterDecode(can, &in))
			out.inputs = append(out.inputs, in)
		default:
			t.Logf("run %d failed: %v; starting again", out.runs, err)
			out.restarts++
			in = start
		}
	}
}

// Issue 43 item 2: one worker that cannot load in each of four batches
// (every Activate attempt runs a minute and fails) held each batch for
// its slowest worker until the run's timeout, and every retry started
// again from the first page. Recovery must finish: the other workers are
// recovered, and the four are counted as failed with an error event each.
func TestRecoveryFinishesWithOneWorkerThatCannotLoadInEachBatch(t *testing.T) {
	const n = 4 * DefaultRecoveryBatch
	slow := map[string]bool{}
	for b := range 4 {
		slow[fmt.Sprintf("w%d", b*DefaultRecoveryBatch+7)] = true
	}
	got := driveRecovery(t, RecoveryInput{}, 4, func() *recoveryEnv {
		r := newRecoveryEnv(n, nil, nil)
		r.slowIDs, r.slowFor, r.slowFails = slow, time.Minute, true
		return r
	})
	require.Zero(t, got.restarts, "no run may time out")
	require.Equal(t, n-len(slow), got.res.Recovered)
	require.Equal(t, len(slow), got.res.Failed)
	require.ElementsMatch(t, keys(slow), got.res.FailedIDs)
	require.Len(t, got.activated, n-len(slow))
	var failedEvents []string
	for _, e := range got.emitted {
		for _, ev := range e.Events {
			require.Equal(t, lifecycleevents.Error, ev.Kind)
			require.Equal(t, RecoveryFailedType, ev.ErrorType)
			require.Contains(t, ev.ErrorMessage, "engine load timed out")
			failedEvents = append(failedEvents, e.Worker.ID)
		}
	}
	require.ElementsMatch(t, keys(slow), failedEvents, "one error event for each worker that could not be recovered")
}

// Issue 43 item 2: workers that load, but slowly (two minutes each), make
// a run end at its timeout before it reaches its count of workers. A run
// continues as new on a time budget, carrying what is left, so that every
// run finishes and every worker is activated once.
func TestRecoveryContinuesAsNewOnATimeBudget(t *testing.T) {
	const n = 12
	all := map[string]bool{}
	for i := range n {
		all[fmt.Sprintf("w%d", i)] = true
	}
	got := driveRecovery(t, RecoveryInput{Batch: 2}, 10, func() *recoveryEnv {
		r := newRecoveryEnv(n, nil, nil)
		r.slowIDs, r.slowFor = all, 2*time.Minute
		return r
	})
	require.Zero(t, got.restarts, "no run may time out")
	require.Greater(t, got.runs, 1, "the runs continued as new")
	require.Equal(t, RecoveryResult{Recovered: n}, got.res)
	require.ElementsMatch(t, keys(all), got.activated, "every worker activated once")
	for i := 1; i < len(got.inputs); i++ {
		require.Greater(t, got.inputs[i].Done.Recovered, got.inputs[i-1].Done.Recovered, "every run made progress")
	}
}

// Issue 43 item 2: recovery's Activate has the node fan-out's timeout (room
// for a .NET load) and heartbeat (a node that stops running it is noticed
// within ActivateHeartbeat).
func TestRecoveryActivateHasTheFanOutsTimeoutAndHeartbeat(t *testing.T) {
	r := newRecoveryEnv(1, nil, nil)
	r.env.ExecuteWorkflow(RecoveryWorkflow, RecoveryInput{})
	require.NoError(t, r.env.GetWorkflowError())
	require.Len(t, r.infos, 1)
	info := r.infos[0]
	require.Equal(t, ActivateHeartbeat, info.HeartbeatTimeout)
	require.Equal(t, ActivateTimeout, info.Deadline.Sub(info.StartedTime))
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
