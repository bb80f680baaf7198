package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/google/uuid"

	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// create starts worker w's entity workflow and sends it the create update,
// waiting for its outcome. Without a request id (rid "") the workflow id is
// new and must not exist. With one, a running workflow of the same id is
// joined (USE_EXISTING) and the update's id is create/<rid>/<attempt>, so
// Temporal answers a retried or concurrent twin with the first call's
// outcome (also from a run that has closed: hence the attempt number, which
// lets a request try again in a new run after a failed create); a completed
// workflow (a deleted worker) is never started again.
//
// A named worker without a request id (w.Name set, rid "") must not exist
// and never have existed (names are not reused), unless its create failed.
//
// The run only creates with the create of the request that started it
// (createID, in the start input and the update): a request that joined a
// run another request started is refused with AlreadyExists at once, so
// the code that runs is always that of the request whose topic, name and
// request id the worker has (issue 33).
func (s *Server) create(ctx context.Context, w catalog.Worker, ref catalog.CodeRef, rid string, attempt int) (catalog.Worker, error) {
	createID := uuid.NewString()
	if rid != "" {
		// Twins of one request (the same id and attempt) share it: Temporal
		// answers them with one update's outcome.
		createID = fmt.Sprintf("request/%s/%d", rid, attempt)
	}
	conflict, reuse, updateID := enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL, enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE, ""
	if w.Name != "" {
		// Only a create that failed frees its name again.
		reuse = enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY
	}
	if rid != "" {
		conflict, reuse, updateID = enumspb.WORKFLOW_ID_CONFLICT_POLICY_USE_EXISTING, enumspb.WORKFLOW_ID_REUSE_POLICY_ALLOW_DUPLICATE_FAILED_ONLY, fmt.Sprintf("create/%s/%d", rid, attempt)
	}
	start := s.temporal.NewWithStartWorkflowOperation(client.StartWorkflowOptions{
		ID:                       workflows.WorkflowID(w.ID),
		TaskQueue:                workflows.TaskQueue,
		WorkflowIDConflictPolicy: conflict,
		WorkflowIDReusePolicy:    reuse,
		TypedSearchAttributes: temporal.NewSearchAttributes(workflows.SAWorkerID.ValueSet(w.ID),
			workflows.SAWorkerTopic.ValueSet(w.Topic), workflows.SAWorkerGroup.ValueSet(w.Group),
			workflows.SAWorkerTenant.ValueSet(w.TenantName()),
			// What the worker has once created: the run then upserts
			// nothing after its create (a run of epoch 4 takes it off if
			// the create fails).
			workflows.SAWorkerStatus.ValueSet(string(catalog.StatusRunning))),
		Memo: memo(w),
	}, workflows.WorkerWorkflow, workflows.WorkerInput{State: workflows.WorkerState{Worker: w}, ContinueAsNewAfter: s.opts.ContinueAsNewAfter, CreateID: createID, Epoch: workflows.CurrentEpoch})
	h, err := s.temporal.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: start,
		UpdateOptions: client.UpdateWorkflowOptions{
			WorkflowID: workflows.WorkflowID(w.ID), UpdateID: updateID, UpdateName: workflows.UpdateCreate,
			Args: []any{workflows.CreateRequest{Ref: ref, CreateID: createID}}, WaitForStage: client.WorkflowUpdateStageCompleted,
		},
	})
	if err != nil {
		return catalog.Worker{}, err
	}
	var created catalog.Worker
	return created, h.Get(ctx, &created)
}

// memo is what the Temporal Web UI shows of a worker's workflow besides
// its id: the worker's name, when it has one.
func memo(w catalog.Worker) map[string]any {
	if w.Name == "" {
		return nil
	}
	return map[string]any{"name": w.Name}
}

// createOnce is CreateWorker with request id rid; w.ID derives from w.Name,
// or from rid when unnamed.
// The answer of create may be an earlier call's (Temporal's remembered
// outcome of the same update, or AlreadyExists once the workflow continued
// as new, or when another request started the run), so the worker as it is
// now decides:
//   - created with the same topic, MIME type and group: this request's
//     worker, answered again;
//   - created with other parameters, or by another request, or deleted:
//     ALREADY_EXISTS;
//   - being created by another request: ALREADY_EXISTS at once; by a twin
//     of this request (same request id): its outcome, once it is known;
//   - an earlier create with this id failed: once its run has closed, the
//     request is tried again in a new run (so a corrected request succeeds
//     and a repeated bad one fails with its own error: restage puts the
//     uploaded body back first, since a run that refuses code drops it).
func (s *Server) createOnce(ctx context.Context, w catalog.Worker, ref catalog.CodeRef, rid string, restage func(context.Context) error) (*pb.CreateWorkerResponse, error) {
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			if err := restage(ctx); err != nil {
				return nil, err
			}
		}
		_, err := s.createSent(ctx, w, ref, rid, attempt)
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		if errors.As(err, &started) {
			return nil, gone(w, rid)
		}
		if k := failure.Kind(err); (k == failure.InvalidArgument || k == failure.PermissionDenied) && attempt == 1 {
			// Possibly the remembered failure of an earlier request with
			// this id: wait until that run has closed, then try once more.
			if werr := s.waitClosed(ctx, w.ID); werr != nil {
				return nil, s.status(werr, w.ID)
			}
			continue
		}
		if err != nil && failure.Kind(err) != failure.AlreadyExists {
			return nil, s.status(err, w.ID)
		}
		st, err := s.settledState(ctx, w.ID, rid)
		if err != nil {
			return nil, s.status(err, w.ID)
		}
		switch {
		case st.Deleted:
			return nil, gone(w, rid)
		case !st.Created && st.CreateFailed && attempt < 3:
			// Another request's (or an earlier attempt's) create failed:
			// the name is free once its run has closed.
			if werr := s.waitClosed(ctx, w.ID); werr != nil {
				return nil, s.status(werr, w.ID)
			}
			continue
		case !st.Created && st.CreateFailed:
			return nil, status.Errorf(codes.AlreadyExists, "worker %s already exists", w.ID)
		case !st.Created:
			return nil, beingCreated(w)
		}
		if c := st.Worker; w.Name != "" && c.RequestID != rid {
			return nil, status.Errorf(codes.AlreadyExists, "name %q is taken by worker %s (created by another request)", w.Name, w.ID)
		}
		if c := st.Worker; c.Topic != w.Topic || c.MIMEType != w.MIMEType || c.Group != w.Group ||
			!slices.Equal(c.AllowedOutputs, w.AllowedOutputs) || !slices.Equal(c.GatewayTargets, w.GatewayTargets) ||
			!samePlacement(c.Placement, w.Placement) || c.MaxConcurrency != w.MaxConcurrency || c.MaxProcesses != w.MaxProcesses || c.GroupKey != w.GroupKey || c.TimeoutMS != w.TimeoutMS {
			return nil, status.Errorf(codes.AlreadyExists, "request_id %q was used for worker %s with other parameters (topic %q, mime_type %q, group %q, allowed_output_topics %q, allowed_gateway_targets %q, %s)",
				rid, w.ID, c.Topic, c.MIMEType, c.Group, c.AllowedOutputs, c.GatewayTargets, placementText(c.Placement))
		}
		return &pb.CreateWorkerResponse{WorkerId: w.ID}, nil
	}
}

// createSent is create with request id rid, sent again while Temporal
// refuses it because the run's workflow task failed (WorkflowNotReady: a
// node stopped, or too slow, while it held the task that had the update;
// the update was never accepted and left no trace). The same attempt's
// ids: twins share one outcome, and the run the first send started is
// used (a create without a request id may not be sent again: its start
// would find that run and answer ALREADY_EXISTS; it is UNAVAILABLE, try
// again).
func (s *Server) createSent(ctx context.Context, w catalog.Worker, ref catalog.CodeRef, rid string, attempt int) (catalog.Worker, error) {
	for wait := 100 * time.Millisecond; ; {
		c, err := s.create(ctx, w, ref, rid, attempt)
		if !isServiceError[*serviceerror.WorkflowNotReady](err) {
			return c, err
		}
		s.log.Warn("the worker's workflow task failed before it took the create; sending it again", "worker_id", w.ID, "err", err)
		if !backOff(ctx, &wait, 2*time.Second) {
			return c, err
		}
	}
}

// createNamed is CreateWorker of a named worker without a request id. The
// loser of two concurrent creates of one name is answered ALREADY_EXISTS
// as soon as it finds the other's run, created or still creating (it never
// waits for that run to close: a live worker's run never does). A name
// whose earlier create failed is free again once that run has closed:
// then it waits for the close and tries once more.
func (s *Server) createNamed(ctx context.Context, w catalog.Worker, ref catalog.CodeRef, restage func(context.Context) error) (*pb.CreateWorkerResponse, error) {
	for try := 0; ; try++ {
		if try > 0 {
			if err := restage(ctx); err != nil {
				return nil, err
			}
		}
		_, err := s.create(ctx, w, ref, "", 0)
		if err == nil {
			return &pb.CreateWorkerResponse{WorkerId: w.ID}, nil
		}
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		if !errors.As(err, &started) && failure.Kind(err) != failure.AlreadyExists {
			return nil, s.status(err, w.ID)
		}
		st, serr := s.settledState(ctx, w.ID, "")
		switch {
		case serr != nil && isContextErr(serr):
			return nil, s.status(serr, w.ID)
		case serr == nil && !st.Created && st.CreateFailed:
			if try == 0 {
				if werr := s.waitClosed(ctx, w.ID); werr != nil {
					return nil, s.status(werr, w.ID)
				}
				continue
			}
		case serr == nil && !st.Created && !st.Deleted:
			return nil, beingCreated(w)
		case serr == nil && st.Deleted:
			return nil, takenByDeleted(w)
		}
		return nil, status.Errorf(codes.AlreadyExists, "name %q is taken by worker %s (names are unique and never reused)", w.Name, w.ID)
	}
}

// takenByDeleted answers a create of a name whose worker was deleted. A name
// is never reused (its worker id is derived from it, and that id's history,
// events and dead letters stay the deleted worker's), so the answer says to
// pick another: GetWorker of the name is NOT_FOUND, which would otherwise
// leave the caller puzzled.
func takenByDeleted(w catalog.Worker) error {
	return status.Errorf(codes.AlreadyExists, "name %q is taken by a deleted worker %s (names are never reused; pick another)", w.Name, w.ID)
}

// beingCreated answers a create that met another request's create in
// progress.
func beingCreated(w catalog.Worker) error {
	if w.Name != "" {
		return status.Errorf(codes.AlreadyExists, "name %q is taken: worker %s is being created by another request", w.Name, w.ID)
	}
	return status.Errorf(codes.AlreadyExists, "worker %s is being created by another request", w.ID)
}

// settledState queries worker id's workflow as it is (queryState). A run
// that has not finished its first task yet (WorkflowNotReady) is asked
// again. When the worker is being created by a twin of request rid (the
// run's start input has rid; the twin's update is another attempt), it
// waits for that create's outcome.
func (s *Server) settledState(ctx context.Context, id, rid string) (workflows.WorkerState, error) {
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		var st workflows.WorkerState
		v, err := s.queryState(ctx, id)
		if err == nil {
			err = v.Get(&st)
		}
		var notReady *serviceerror.WorkflowNotReady
		switch {
		case errors.As(err, &notReady):
		case err != nil:
			return st, err
		case !st.Created && !st.CreateFailed && !st.Deleted && rid != "" && st.Worker.RequestID == rid:
		default:
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// closeWait bounds the wait for a run whose create failed to close (it
// closes as soon as its handlers have finished).
const closeWait = 30 * time.Second

// waitClosed waits until worker id's current run has closed (at most
// closeWait).
func (s *Server) waitClosed(ctx context.Context, id string) error {
	wctx, cancel := context.WithTimeout(ctx, closeWait)
	defer cancel()
	err := s.temporal.GetWorkflow(wctx, workflows.WorkflowID(id), "").Get(wctx, nil)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if wctx.Err() != nil {
		return fmt.Errorf("worker %s: the run of its failed create did not close within %s", id, closeWait)
	}
	_ = err // the run's own outcome (a failed create) is not this request's
	return nil
}

func isContextErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// gone is the answer to a create whose worker id belongs to a deleted
// worker.
func gone(w catalog.Worker, rid string) error {
	if w.Name != "" {
		return takenByDeleted(w)
	}
	return status.Errorf(codes.AlreadyExists, "request_id %q was used by worker %s, which has been deleted", rid, w.ID)
}

// requestIDSpace namespaces the worker ids derived from request ids.
var requestIDSpace = uuid.MustParse("6f0c3e55-7d8e-4b7a-9a55-3b1f0f7f2a10")

// RequestWorkerID is the id of the worker that tenant t's CreateWorker
// with request id rid creates (a name-based UUID, so every API instance
// derives the same; request ids are per tenant).
func RequestWorkerID(t, rid string) string {
	key := "request:" + rid
	if t != tenant.Default && t != "" {
		key = "request:" + t + "/" + rid
	}
	return tenant.WorkerID(t, uuid.NewSHA1(requestIDSpace, []byte(key)))
}

// validRequestID accepts "" (no idempotency key) or 1..128 of A-Z a-z 0-9
// . _ : -.
func validRequestID(rid string) error {
	if len(rid) > 128 {
		return status.Errorf(codes.InvalidArgument, "request_id is %d characters long; at most 128", len(rid))
	}
	for i, c := range rid {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:-", c)) {
			return status.Errorf(codes.InvalidArgument, "request_id has %q at position %d; allowed: A-Z a-z 0-9 . _ : -", c, i)
		}
	}
	return nil
}
