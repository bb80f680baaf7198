package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/encoding/protojson"

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

// keepSlowHistories writes the workflow history of every worker a slow
// lifecycle call was about (all runs, newest first, back through
// continue-as-new) to history-<name>.jsonl.log in the stack's directory, and
// makes the stack keep its logs: what finding 10 lacked to be explained.
// It returns the report's line, or "" when no call was slow.
func (c *cluster) keepSlowHistories(j *journal) string {
	j.mu.Lock()
	slow := append([]slowCallRec(nil), j.slow...)
	j.mu.Unlock()
	if len(slow) == 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b strings.Builder
	fmt.Fprintf(&b, "lifecycle calls slower than %s (their workflows' histories are kept with the logs):", slowCall)
	tc, err := client.DialContext(ctx, client.Options{HostPort: c.stack.TemporalAddr, Namespace: "default"})
	if err != nil {
		fmt.Fprintf(&b, " (Temporal: %v)", err)
		tc = nil
	} else {
		defer tc.Close()
	}
	done := map[string]bool{}
	for _, s := range slow {
		fmt.Fprintf(&b, " %s %s at %s took %s (%v);", s.what, s.name, j.rel(s.at), s.took.Round(time.Second), s.err)
		if tc == nil || done[s.name] {
			continue
		}
		done[s.name] = true
		r, err := c.client.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: s.name})
		if err != nil {
			continue
		}
		if err := writeHistories(ctx, tc, workflows.WorkflowID(r.GetWorkerId()), filepath.Join(c.dir, "history-"+s.name+".jsonl.log")); err != nil {
			fmt.Fprintf(&b, " (history of %s: %v)", s.name, err)
		}
	}
	c.keepLogs = true
	return b.String()
}

// writeHistories writes every event of the workflow's runs, newest run
// first, as JSON lines.
func writeHistories(ctx context.Context, tc client.Client, wfID, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	runID := ""
	for range 20 {
		it := tc.GetWorkflowHistory(ctx, wfID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		prev := ""
		for it.HasNext() {
			ev, err := it.Next()
			if err != nil {
				return err
			}
			if a := ev.GetWorkflowExecutionStartedEventAttributes(); a != nil {
				prev = a.GetContinuedExecutionRunId()
			}
			line, err := protojson.Marshal(ev)
			if err != nil {
				return err
			}
			if _, err := f.Write(append(line, '\n')); err != nil {
				return err
			}
		}
		if prev == "" {
			return nil
		}
		runID = prev
	}
	return nil
}
