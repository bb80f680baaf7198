package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

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
func (s *Server) create(ctx context.Context, w catalog.Worker, ref catalog.CodeRef, rid string, attempt int) (catalog.Worker, error) {
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
			workflows.SAWorkerTenant.ValueSet(w.TenantName())),
		Memo: memo(w),
	}, workflows.WorkerWorkflow, workflows.WorkerInput{State: workflows.WorkerState{Worker: w}, ContinueAsNewAfter: s.opts.ContinueAsNewAfter})
	h, err := s.temporal.UpdateWithStartWorkflow(ctx, client.UpdateWithStartWorkflowOptions{
		StartWorkflowOperation: start,
		UpdateOptions: client.UpdateWorkflowOptions{
			WorkflowID: workflows.WorkflowID(w.ID), UpdateID: updateID, UpdateName: workflows.UpdateCreate,
			Args: []any{workflows.CreateRequest{Ref: ref}}, WaitForStage: client.WorkflowUpdateStageCompleted,
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
// as new), so the worker as it is now decides:
//   - created with the same topic, MIME type and group: this request's
//     worker, answered again;
//   - created with other parameters, or deleted: ALREADY_EXISTS;
//   - an earlier create with this id failed: once its run has closed, the
//     request is tried again in a new run (so a corrected request succeeds
//     and a repeated bad one fails with its own error).
func (s *Server) createOnce(ctx context.Context, w catalog.Worker, ref catalog.CodeRef, rid string) (*pb.CreateWorkerResponse, error) {
	for attempt := 1; ; attempt++ {
		_, err := s.create(ctx, w, ref, rid, attempt)
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		if errors.As(err, &started) {
			return nil, gone(w, rid)
		}
		if k := failure.Kind(err); (k == failure.InvalidArgument || k == failure.PermissionDenied) && attempt == 1 {
			// Possibly the remembered failure of an earlier request with
			// this id: wait until that run has closed, then try once more.
			_ = s.temporal.GetWorkflow(ctx, workflows.WorkflowID(w.ID), "").Get(ctx, nil)
			continue
		}
		if err != nil && failure.Kind(err) != failure.AlreadyExists {
			return nil, s.status(err, w.ID)
		}
		st, err := s.state(ctx, w.ID)
		if status.Code(err) == codes.NotFound {
			return nil, gone(w, rid)
		}
		if err != nil {
			return nil, err
		}
		if c := st.Worker; w.Name != "" && c.RequestID != rid {
			return nil, status.Errorf(codes.AlreadyExists, "name %q is taken by worker %s (created by another request)", w.Name, w.ID)
		}
		if c := st.Worker; c.Topic != w.Topic || c.MIMEType != w.MIMEType || c.Group != w.Group ||
			!slices.Equal(c.AllowedOutputs, w.AllowedOutputs) || !slices.Equal(c.GatewayTargets, w.GatewayTargets) {
			return nil, status.Errorf(codes.AlreadyExists, "request_id %q was used for worker %s with other parameters (topic %q, mime_type %q, group %q, allowed_output_topics %q, allowed_gateway_targets %q)",
				rid, w.ID, c.Topic, c.MIMEType, c.Group, c.AllowedOutputs, c.GatewayTargets)
		}
		return &pb.CreateWorkerResponse{WorkerId: w.ID}, nil
	}
}

// createNamed is CreateWorker of a named worker without a request id. A
// name whose earlier create failed is free again once that run has closed:
// when the name's workflow answers no worker, wait for it to close and try
// once more.
func (s *Server) createNamed(ctx context.Context, w catalog.Worker, ref catalog.CodeRef) (*pb.CreateWorkerResponse, error) {
	for try := 0; ; try++ {
		_, err := s.create(ctx, w, ref, "", 0)
		if err == nil {
			return &pb.CreateWorkerResponse{WorkerId: w.ID}, nil
		}
		var started *serviceerror.WorkflowExecutionAlreadyStarted
		if !errors.As(err, &started) && failure.Kind(err) != failure.AlreadyExists {
			return nil, s.status(err, w.ID)
		}
		if _, serr := s.state(ctx, w.ID); try == 0 && status.Code(serr) == codes.NotFound {
			_ = s.temporal.GetWorkflow(ctx, workflows.WorkflowID(w.ID), "").Get(ctx, nil)
			continue
		}
		return nil, status.Errorf(codes.AlreadyExists, "name %q is taken by worker %s (names are unique and never reused)", w.Name, w.ID)
	}
}

// gone is the answer to a create whose worker id belongs to a deleted
// worker.
func gone(w catalog.Worker, rid string) error {
	if w.Name != "" {
		return status.Errorf(codes.AlreadyExists, "name %q was used by worker %s, which has been deleted (names are not reused)", w.Name, w.ID)
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
