package chaos

import (
	"context"
	"sort"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/virtufin/workmanager/internal/catalog"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// temporalAgreement checks, after convergence, that Temporal (each
// worker's entity workflow, its "state" query) agrees with ListWorkers:
// every listed worker's workflow runs and shows the same status, code
// version and code hash; every worker the API answered deleted has no
// running workflow, or one whose state says deleted.
func (c *cluster) temporalAgreement(j *journal) *invariant {
	iv := &invariant{name: "Temporal agreement (each worker's workflow state matches ListWorkers)"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tc, err := client.DialContext(ctx, client.Options{HostPort: c.stack.TemporalAddr, Namespace: "default"})
	if err != nil {
		iv.fail("dialling Temporal: %v", err)
		return iv
	}
	defer tc.Close()
	l, err := c.client.ListWorkers(ctx, &pb.ListWorkersRequest{})
	if err != nil {
		iv.fail("ListWorkers: %v", err)
		return iv
	}
	listed := map[string]*pb.Worker{}
	for _, w := range l.GetWorkers() {
		listed[w.GetWorkerId()] = w
	}
	j.mu.Lock()
	ids := make([]string, 0, len(j.workers))
	names := map[string]string{}
	for id, w := range j.workers {
		ids = append(ids, id)
		names[id] = idOf(w)
	}
	j.mu.Unlock()
	for id := range listed {
		if _, ok := names[id]; !ok {
			ids = append(ids, id)
			names[id] = id
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		iv.checked++
		wfID := workflows.WorkflowID(id)
		var st workflows.WorkerState
		var qerr error
		desc, derr := tc.DescribeWorkflowExecution(ctx, wfID, "")
		running := derr == nil && desc.GetWorkflowExecutionInfo().GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
		if derr == nil {
			v, err := tc.QueryWorkflow(ctx, wfID, "", workflows.QueryState)
			if qerr = err; qerr == nil {
				qerr = v.Get(&st)
			}
		}
		lw, isListed := listed[id]
		if !isListed {
			if running && qerr == nil && !st.Deleted {
				iv.fail("%s: not listed (deleted) but its workflow runs with status %s", names[id], st.Worker.Status)
			}
			continue
		}
		switch {
		case derr != nil:
			iv.fail("%s: listed %v, describing its workflow: %v", names[id], lw.GetStatus(), derr)
		case !running:
			iv.fail("%s: listed %v, its workflow is %v", names[id], lw.GetStatus(), desc.GetWorkflowExecutionInfo().GetStatus())
		case qerr != nil:
			iv.fail("%s: listed %v, querying its workflow: %v", names[id], lw.GetStatus(), qerr)
		case st.Deleted:
			iv.fail("%s: listed %v, its workflow says deleted", names[id], lw.GetStatus())
		case statusOf(st.Worker.Status) != lw.GetStatus() || st.Worker.CodeVersion != lw.GetCodeVersion() || st.Worker.CodeSHA256 != lw.GetCodeSha256():
			iv.fail("%s: listed %v v%d %.8s, its workflow %s v%d %.8s", names[id], lw.GetStatus(), lw.GetCodeVersion(), lw.GetCodeSha256(),
				st.Worker.Status, st.Worker.CodeVersion, st.Worker.CodeSHA256)
		}
	}
	return iv
}

func statusOf(s catalog.Status) pb.WorkerStatus {
	switch s {
	case catalog.StatusRunning:
		return pb.WorkerStatus_WORKER_STATUS_RUNNING
	case catalog.StatusStopped:
		return pb.WorkerStatus_WORKER_STATUS_STOPPED
	}
	return pb.WorkerStatus(-1)
}
