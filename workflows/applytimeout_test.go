package workflows

import (
	"testing"
	"time"

	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/virtufin/workmanager/engines/dotnet"
	"github.com/virtufin/workmanager/engines/native"
	"github.com/virtufin/workmanager/engines/python"
)

// Issue 43 item 13 (b): Apply loads the worker's code on its node, but its
// attempts were cut at one minute while a .NET load may take up to its
// engine's 120 s (and a Python load up to 60 s, plus the writes): every
// attempt of a slow load timed out. Each attempt now outlasts the longest
// engine load.
func TestApplyOutlastsTheLongestEngineLoad(t *testing.T) {
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	var got workflow.ActivityOptions
	env.ExecuteWorkflow(func(ctx workflow.Context) error {
		got = workflow.GetActivityOptions(applyCtx(ctx))
		return nil
	})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	const margin = 30 * time.Second // the history and record writes after the load
	for engine, load := range map[string]time.Duration{"dotnet": dotnet.DefaultLoadTimeout, "python": python.DefaultLoadTimeout, "native": native.DefaultLoadTimeout} {
		if got.StartToCloseTimeout < load+margin {
			t.Errorf("Apply's StartToClose %s does not leave room for a %s load (%s) and its writes", got.StartToCloseTimeout, engine, load)
		}
	}
	if got.HeartbeatTimeout != ApplyHeartbeat {
		t.Errorf("Apply's heartbeat timeout %s, want %s", got.HeartbeatTimeout, ApplyHeartbeat)
	}
}
