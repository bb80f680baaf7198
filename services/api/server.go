// Package api owns the gRPC control API (workmanager.v1.WorkManagerService).
// It is a Temporal client: each lifecycle RPC is an Update of the worker's
// entity workflow (create is Update-With-Start), GetWorker is a Query, and
// RecoverWorkers runs the recovery workflow. It reads the catalog for lists
// and history, and stages uploaded code there so that code bodies never enter
// workflow history. The dead-letter RPCs read the catalog and the stored dead
// letters and republish through the broker; they never touch Temporal.
// Errors are mapped to gRPC status codes here.
package api

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/codesource"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tenant"
	"github.com/virtufin/workmanager/internal/workerpolicy"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// Limits of requests.
const (
	// DefaultMaxCodeBytes bounds inline code unless configured: what
	// daprd's default request limit (4 MiB) lets through to the state store.
	DefaultMaxCodeBytes = 4<<20 - MaxRequestOverhead
	// MaxRequestOverhead is what a request may carry besides its code.
	MaxRequestOverhead = 64 << 10
)

// Server implements pb.WorkManagerServiceServer.
type Server struct {
	pb.UnimplementedWorkManagerServiceServer
	log       *slog.Logger
	temporal  client.Client
	catalog   *catalog.Catalog
	mimeTypes []string
	// advertised caches the MIME types live nodes advertise
	// (acceptedMIMETypes).
	advertised advertisedMIMETypes
	opts       Options
	timeout    time.Duration
	quota      quotaState
	// drain drains (drained true) or undrains a node through the
	// placement workflow: workflows.SetDrained on the Temporal client
	// unless a test replaces it.
	drain func(ctx context.Context, node string, drained bool) error
	// drainWait bounds how long DrainNode waits for the drain to be
	// recorded (0: drainRecordWait).
	drainWait time.Duration
}

// Options tune the API.
type Options struct {
	// OperationTimeout bounds one lifecycle operation.
	OperationTimeout time.Duration
	// ContinueAsNewAfter makes new worker workflows continue as new after
	// this many updates per run (0: when the server suggests it).
	ContinueAsNewAfter int
	// DeadLetters, Deliveries and Publisher serve ListDeadLetters and
	// ReplayDeadLetters (the stored dead letters, the delivery records whose
	// attempts a replay resets, and the broker it republishes to); without
	// them those RPCs answer UNIMPLEMENTED.
	DeadLetters *deadletter.Store
	Deliveries  *delivery.Store
	Publisher   publish.Publisher
	// WorkerStats is the store the nodes write each worker's message counts
	// to (internal/workerstats), which GetWorker adds as Worker.stats; nil:
	// left out.
	WorkerStats state.Store
	// CodeURLs are the rules URL code sources must pass (the nodes apply
	// them again, with DNS, when they fetch).
	CodeURLs codesource.Policy
	// MaxCodeBytes bounds inline code (API_MAX_CODE_BYTES); 0:
	// DefaultMaxCodeBytes.
	MaxCodeBytes int
	// Tenants maps tenants to the topic prefix their workers are confined
	// to (TENANT_TOPIC_PREFIXES; unmapped: "<tenant>.", none for the
	// default tenant).
	Tenants tenant.Prefixes
	// Quotas bound the workers CreateWorker admits (QUOTA_*; none when
	// zero); QuotaStore holds their reservations (the state store),
	// without it the quotas are off.
	Quotas     Quotas
	QuotaStore state.Store
	// Cluster is the state store holding the node membership, the nodes'
	// advertisements and the placement record (internal/cluster,
	// internal/placement): GetWorker and ListWorkers add the nodes serving
	// each worker from it, ListNodes and DrainNode need it (without it
	// they answer UNIMPLEMENTED and workers are listed without nodes).
	Cluster state.Store
	// NodeTTL is how long a node counts as alive after its last heartbeat
	// (3 x the nodes' NODE_HEARTBEAT); 0: DefaultNodeTTL.
	NodeTTL time.Duration
}

// New returns a Server; mimeTypes are the supported worker MIME types.
func New(log *slog.Logger, tc client.Client, cat *catalog.Catalog, mimeTypes []string, opts Options) *Server {
	s := &Server{log: log, temporal: tc, catalog: cat, mimeTypes: mimeTypes, opts: opts, timeout: opts.OperationTimeout}
	s.drain = func(ctx context.Context, node string, drained bool) error {
		return workflows.SetDrained(ctx, s.temporal, node, drained)
	}
	return s
}

// CreateWorker implements pb.WorkManagerServiceServer.
func (s *Server) CreateWorker(ctx context.Context, req *pb.CreateWorkerRequest) (*pb.CreateWorkerResponse, error) {
	if err := catalog.ValidateSpec(req.GetMimeType(), req.GetTopic(), req.GetGroup(), s.acceptedMIMETypes(ctx)); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := catalog.ValidateGroupKey(req.GetGroup(), req.GetGroupKey()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	rp := req.GetRetryPolicy()
	if err := catalog.ValidateRetryPolicy(int(rp.GetMaxAttempts()), rp.GetBackoffMs()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := workerpolicy.Validate(req.GetAllowedOutputTopics(), req.GetAllowedGatewayTargets()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	pl, err := workerPlacement(req)
	if err != nil {
		return nil, err
	}
	maxConc, maxProcs, err := workerConcurrency(req)
	if err != nil {
		return nil, err
	}
	timeoutMS, err := workerTimeout(req)
	if err != nil {
		return nil, err
	}
	p := caller(ctx)
	prefix := s.opts.Tenants.Of(p.Tenant)
	if err := tenantTopics(prefix, req.GetTopic(), req.GetAllowedOutputTopics()); err != nil {
		return nil, err
	}
	rid, name := req.GetRequestId(), req.GetName()
	if err := validRequestID(rid); err != nil {
		return nil, err
	}
	if name != "" {
		if err := validName(name); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ref, err := s.stage(ctx, req.GetCode())
	if err != nil {
		return nil, err
	}
	ref.Actor = p.Subject
	w := catalog.Worker{ID: tenant.WorkerID(p.Tenant, uuid.New()), Tenant: p.Tenant, TopicPrefix: prefix, MIMEType: req.GetMimeType(), Topic: req.GetTopic(), Group: req.GetGroup(), Status: catalog.StatusStopped,
		MaxAttempts: int(rp.GetMaxAttempts()), RetryBackoff: time.Duration(rp.GetBackoffMs()) * time.Millisecond,
		Name: name, RequestID: rid, AllowedOutputs: req.GetAllowedOutputTopics(), GatewayTargets: req.GetAllowedGatewayTargets(),
		Placement: pl, MaxConcurrency: maxConc, MaxProcesses: maxProcs, GroupKey: req.GetGroupKey(), TimeoutMS: timeoutMS}
	switch {
	case name != "":
		w.ID = NameWorkerID(p.Tenant, name)
	case rid != "":
		w.ID = RequestWorkerID(p.Tenant, rid)
	}
	// A create tried again in a new run stages the body again: the first
	// run's PrepareCode dropped it when it refused the code, and a twin or
	// another request with the same body may have too.
	restage := func(ctx context.Context) error {
		_, err := s.stage(ctx, req.GetCode())
		return err
	}
	// The quotas (QUOTA_*): a slot reserved until the worker is in the
	// catalog, released when the create fails.
	release, err := s.reserveQuota(ctx, w)
	if err != nil {
		return nil, err
	}
	var resp *pb.CreateWorkerResponse
	switch {
	case rid != "":
		resp, err = s.createOnce(ctx, w, ref, rid, restage)
	case name != "":
		resp, err = s.createNamed(ctx, w, ref, restage)
	default:
		if _, err = s.create(ctx, w, ref, "", 0); err != nil {
			err = s.status(err, w.ID)
		} else {
			resp = &pb.CreateWorkerResponse{WorkerId: w.ID}
		}
	}
	if err != nil {
		release()
		return nil, err
	}
	return resp, nil
}

// StartWorker implements pb.WorkManagerServiceServer.
func (s *Server) StartWorker(ctx context.Context, req *pb.StartWorkerRequest) (*pb.Worker, error) {
	id, _, err := resolve(ctx, req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	if err := s.liftQuarantine(ctx, id); err != nil {
		return nil, err
	}
	return s.update(ctx, req.GetWorkerId(), workflows.UpdateStart)
}

// StopWorker implements pb.WorkManagerServiceServer.
func (s *Server) StopWorker(ctx context.Context, req *pb.StopWorkerRequest) (*pb.Worker, error) {
	return s.update(ctx, req.GetWorkerId(), workflows.UpdateStop)
}

// LoadCode implements pb.WorkManagerServiceServer.
func (s *Server) LoadCode(ctx context.Context, req *pb.LoadCodeRequest) (*pb.Worker, error) {
	id, display, err := resolve(ctx, req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	st, err := s.state(ctx, id)
	if err != nil {
		return nil, named(err, display)
	}
	if req.GroupKey != nil {
		if err := catalog.ValidateGroupKey(st.Worker.Group, req.GetGroupKey()); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	ref, err := s.stage(ctx, req.GetCode())
	if err != nil {
		return nil, err
	}
	if err := s.liftQuarantine(ctx, id); err != nil {
		return nil, err
	}
	ref.Actor = caller(ctx).Subject
	ref.GroupKey = req.GroupKey
	return s.update(ctx, id, workflows.UpdateLoadCode, ref)
}

// RollbackWorker implements pb.WorkManagerServiceServer: it loads the code
// of an earlier history version again, as a new version (a LoadCode whose
// code comes from the content-addressed store).
func (s *Server) RollbackWorker(ctx context.Context, req *pb.RollbackWorkerRequest) (*pb.Worker, error) {
	id, display, err := resolve(ctx, req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	if req.GetVersion() <= 0 {
		return nil, status.Errorf(codes.InvalidArgument, "version must be a history version (1 or more), got %d", req.GetVersion())
	}
	if _, err := s.state(ctx, id); err != nil {
		return nil, named(err, display)
	}
	e, found, err := s.catalog.HistoryVersion(ctx, id, req.GetVersion())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reading the history of %s: %v", display, err)
	}
	if !found {
		return nil, s.noSuchVersion(ctx, id, display, req.GetVersion())
	}
	if err := s.liftQuarantine(ctx, id); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.update(ctx, id, workflows.UpdateLoadCode, catalog.CodeRef{SHA256: e.SHA256, SourceKind: e.SourceKind, URL: e.URL,
		RollbackTo: e.Version, Actor: caller(ctx).Subject})
}

// DeleteWorker implements pb.WorkManagerServiceServer.
func (s *Server) DeleteWorker(ctx context.Context, req *pb.DeleteWorkerRequest) (*pb.DeleteWorkerResponse, error) {
	id, display, err := resolve(ctx, req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err = s.sendUpdate(ctx, client.UpdateWorkflowOptions{
		WorkflowID: workflows.WorkflowID(id), UpdateName: workflows.UpdateDelete,
		WaitForStage: client.WorkflowUpdateStageCompleted,
	}, nil)
	if err != nil {
		return nil, s.status(err, display)
	}
	s.releaseQuota(ctx, id)
	return &pb.DeleteWorkerResponse{}, nil
}

// GetWorker implements pb.WorkManagerServiceServer. The worker's workflow
// answers (its state, also in the middle of a change). When its query
// cannot be answered (the workflow task it needs failed or timed out, as
// Temporal's "query timed out before a worker could process it", or
// Temporal is unavailable), the persisted record answers instead, as
// ListWorkers does: a read does not fail because one workflow task did.
func (s *Server) GetWorker(ctx context.Context, req *pb.GetWorkerRequest) (*pb.Worker, error) {
	id, display, err := resolve(ctx, req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	st, err := s.state(ctx, id)
	if err == nil {
		out := toProto(st.Worker)
		out.StatusReason = addStatusReason(addStatusReason(out.StatusReason, s.notRecoveredReason(ctx, id)), s.quarantineReason(ctx, id))
		out.Stats = s.workerStats(ctx, id)
		addPlacement(out, st.Worker, s.placementRecord(ctx))
		return out, nil
	}
	if c := status.Code(err); c == codes.DeadlineExceeded || c == codes.Unavailable {
		if w, cerr := s.catalog.GetWorker(ctx, id); cerr == nil {
			s.log.Warn("GetWorker answered from the catalog: the workflow's query failed", "worker_id", id, "err", err)
			out := toProto(w)
			out.StatusReason = addStatusReason(addStatusReason(out.StatusReason, s.notRecoveredReason(ctx, id)), s.quarantineReason(ctx, id))
			out.Stats = s.workerStats(ctx, id)
			addPlacement(out, w, s.placementRecord(ctx))
			return out, nil
		}
	}
	return nil, named(err, display)
}

// ListWorkers implements pb.WorkManagerServiceServer.
// Workers are listed by id, in pages of at most maxPageSize; the page
// token is the last id of the previous page.
func (s *Server) ListWorkers(ctx context.Context, req *pb.ListWorkersRequest) (*pb.ListWorkersResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size == 0:
		size = maxPageSize
	case size < 0 || size > maxPageSize:
		return nil, status.Errorf(codes.InvalidArgument, "page_size %d must be 0 (default %d) or 1..%d", size, maxPageSize, maxPageSize)
	}
	after := ""
	if tok := req.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || len(b) == 0 || len(b) > 200 {
			return nil, status.Error(codes.InvalidArgument, "page_token is not a token this API returned (pass next_page_token as it came)")
		}
		after = string(b)
	}
	// A call costs what it returns: the caller's tenant's index and the
	// page's records (an admin's, who sees every tenant: the global index).
	p := caller(ctx)
	var ws []catalog.Worker
	var more bool
	var err error
	if p.Role >= auth.RoleAdmin {
		ws, more, err = s.catalog.ListWorkersAfter(ctx, after, size)
	} else {
		ws, more, err = s.catalog.ListTenantWorkers(ctx, p.Tenant, after, size)
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "list workers: %v", err)
	}
	out := &pb.ListWorkersResponse{Workers: make([]*pb.Worker, 0, len(ws))}
	var rec placement.Record
	if len(ws) > 0 {
		rec = s.placementRecord(ctx) // once per page
	}
	for _, w := range ws {
		if mayAccess(p, w.ID) {
			pw := toProto(w)
			addPlacement(pw, w, rec)
			out.Workers = append(out.Workers, pw)
		}
	}
	if more && len(ws) > 0 {
		out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(ws[len(ws)-1].ID))
	}
	return out, nil
}

// maxPageSize bounds a page of ListWorkers.
const maxPageSize = 1000

// RecoverWorkers implements pb.WorkManagerServiceServer.
func (s *Server) RecoverWorkers(ctx context.Context, _ *pb.RecoverWorkersRequest) (*pb.RecoverWorkersResponse, error) {
	res, err := workflows.RunRecoveryWith(ctx, s.temporal, workflows.RecoveryInput{ContinueAsNewAfter: s.opts.ContinueAsNewAfter})
	if err != nil {
		return nil, s.status(err, "")
	}
	return &pb.RecoverWorkersResponse{Recovered: int32(res.Recovered), Failed: int32(res.Failed)}, nil
}

// stage validates a code source and, for inline content, puts the body in
// the catalog's staging area; only the reference goes into the workflow.
func (s *Server) stage(ctx context.Context, src *pb.CodeSource) (catalog.CodeRef, error) {
	switch c := src.GetSource().(type) {
	case *pb.CodeSource_Content:
		if len(c.Content) == 0 {
			return catalog.CodeRef{}, status.Error(codes.InvalidArgument, "code.content is empty")
		}
		if max := cmp.Or(s.opts.MaxCodeBytes, DefaultMaxCodeBytes); len(c.Content) > max {
			return catalog.CodeRef{}, status.Errorf(codes.InvalidArgument, "code.content has %d bytes, more than API_MAX_CODE_BYTES %d", len(c.Content), max)
		}
		sha, err := s.catalog.StageCode(ctx, c.Content)
		if err != nil {
			return catalog.CodeRef{}, status.Errorf(codes.Unavailable, "stage code: %v", err)
		}
		return catalog.CodeRef{SHA256: sha, SourceKind: "content"}, nil
	case *pb.CodeSource_Url:
		if err := s.opts.CodeURLs.ValidateURL(c.Url.GetUrl(), c.Url.GetSha256()); err != nil {
			if errors.Is(err, codesource.ErrForbidden) {
				s.log.Warn("code URL refused", "rule", ruleOf(err), "err", err)
				return catalog.CodeRef{}, status.Error(codes.PermissionDenied, err.Error())
			}
			return catalog.CodeRef{}, status.Error(codes.InvalidArgument, err.Error())
		}
		return catalog.CodeRef{SHA256: c.Url.GetSha256(), SourceKind: "url", URL: c.Url.GetUrl()}, nil
	default:
		return catalog.CodeRef{}, status.Error(codes.InvalidArgument, "code is required: set code.content or code.url")
	}
}

// update sends the update name to the workflow of the worker ref (an id or
// a name) and answers the worker as it left it.
func (s *Server) update(ctx context.Context, ref, name string, args ...any) (*pb.Worker, error) {
	id, display, err := resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var w catalog.Worker
	if err := s.sendUpdate(ctx, client.UpdateWorkflowOptions{
		WorkflowID: workflows.WorkflowID(id), UpdateName: name, Args: args,
		WaitForStage: client.WorkflowUpdateStageCompleted,
	}, &w); err != nil {
		return nil, s.status(err, display)
	}
	return toProto(w), nil
}

// sendUpdate sends an update and waits for its outcome (into out, when
// set). A run that is due to continue as new refuses new updates with
// workflows.ContinueAsNewDue until its updates in flight have finished
// and it continued as new; Temporal refuses them with WorkflowNotReady
// while the run's workflow task has failed (a node stopped, or too slow,
// holding it). Either way the update is sent again (by workflow id, so
// to the current run), backing off, until it is taken or ctx ends. A
// refused update left no trace in the workflow, so sending it again is
// safe.
func (s *Server) sendUpdate(ctx context.Context, o client.UpdateWorkflowOptions, out any) error {
	for wait := 20 * time.Millisecond; ; {
		h, err := s.temporal.UpdateWorkflow(ctx, o)
		if err == nil {
			err = h.Get(ctx, out)
		}
		if failure.Kind(err) != workflows.ContinueAsNewDue && !isServiceError[*serviceerror.WorkflowNotReady](err) {
			return err
		}
		if !backOff(ctx, &wait, time.Second) {
			return ctx.Err()
		}
	}
}

// backOff waits *wait before a refused call is sent again, then doubles
// *wait, up to most; false when ctx ended first.
func backOff(ctx context.Context, wait *time.Duration, most time.Duration) bool {
	t := time.NewTimer(*wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	*wait = min(2**wait, most)
	return true
}

// state queries a worker's workflow (queryState); a deleted or
// never-created worker is NOT_FOUND.
func (s *Server) state(ctx context.Context, id string) (workflows.WorkerState, error) {
	v, err := s.queryState(ctx, id)
	if err != nil {
		return workflows.WorkerState{}, s.status(err, id)
	}
	var st workflows.WorkerState
	if err := v.Get(&st); err != nil {
		return st, status.Errorf(codes.Internal, "decode worker state: %v", err)
	}
	if !st.Created || st.Deleted {
		return st, status.Errorf(codes.NotFound, "worker %s not found", id)
	}
	return st, nil
}

// queryState sends worker id's workflow the state query. A query Temporal
// gave up on while the caller still has time (its query task expired
// before a node answered it: seen under load as "query task not found, or
// already expired", a closed run being replayed for it) is asked once
// more: a read, so asking again changes nothing.
func (s *Server) queryState(ctx context.Context, id string) (converter.EncodedValue, error) {
	v, err := s.temporal.QueryWorkflow(ctx, workflows.WorkflowID(id), "", workflows.QueryState)
	if err != nil && timedOut(err) && ctx.Err() == nil {
		s.log.Warn("worker state query timed out in Temporal; asking once more", "worker_id", id, "err", err)
		v, err = s.temporal.QueryWorkflow(ctx, workflows.WorkflowID(id), "", workflows.QueryState)
	}
	return v, err
}

// named restates a NOT_FOUND from state for the worker as the request named
// it (its name, when it gave one).
func named(err error, display string) error {
	if status.Code(err) == codes.NotFound {
		return status.Errorf(codes.NotFound, "worker %s not found", display)
	}
	return err
}

// ruleOf is the rule of a code source refusal.
func ruleOf(err error) string {
	var r *codesource.Refusal
	if errors.As(err, &r) {
		return r.Rule
	}
	return ""
}

// tenantTopics holds a new worker's topic and output patterns to its
// tenant's prefix: PERMISSION_DENIED outside it.
func tenantTopics(prefix, topic string, outputs []string) error {
	if prefix == "" {
		return nil
	}
	if err := tenant.CheckTopic(prefix, "topic", topic); err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	for _, o := range outputs {
		// A pattern whose literal start is the prefix matches only topics
		// under it (the prefix has no pattern characters).
		if err := tenant.CheckTopic(prefix, "allowed_output_topics entry", o); err != nil {
			return status.Error(codes.PermissionDenied, err.Error())
		}
	}
	return nil
}

// status maps Temporal errors to gRPC status codes. What a client can act
// on gets its own code: DEADLINE_EXCEEDED when the operation outlasted the
// call (Temporal's timeout errors do not wrap context.DeadlineExceeded),
// UNAVAILABLE when Temporal or a backing service an activity needs failed
// (try again), with a message of ours: Temporal's and the activities'
// texts (addresses, store keys, stack traces) go to the log only.
func (s *Server) status(err error, id string) error {
	var notFound *serviceerror.NotFound
	var activityErr *temporal.ActivityError
	switch kind := failure.Kind(err); {
	case kind == failure.InvalidArgument:
		return status.Error(codes.InvalidArgument, failure.Message(err))
	case kind == failure.PermissionDenied:
		return status.Error(codes.PermissionDenied, failure.Message(err))
	case kind == failure.NotFound, errors.As(err, &notFound):
		return status.Errorf(codes.NotFound, "worker %s not found", id)
	case kind == failure.AlreadyExists:
		return status.Errorf(codes.AlreadyExists, "worker %s already exists", id)
	case kind == workflows.NotApplied:
		// Our own message: which node, and that the change is persisted.
		return status.Error(codes.Unavailable, failure.Message(err))
	case timedOut(err):
		s.log.Warn("lifecycle operation did not finish in time", "worker_id", id, "err", err)
		return status.Errorf(codes.DeadlineExceeded, "worker %s: operation did not finish in time (it may still complete: GetWorker shows the outcome)", id)
	case errors.Is(err, context.Canceled), isServiceError[*serviceerror.Canceled](err):
		return status.Errorf(codes.Canceled, "worker %s: operation canceled", id)
	case isServiceError[*serviceerror.Unavailable](err), grpcCode(err) == codes.Unavailable:
		s.log.Error("Temporal unavailable", "worker_id", id, "err", err)
		return status.Errorf(codes.Unavailable, "worker %s: Temporal is unavailable; try again", id)
	case noPoller(err):
		// Matching's errNoRecentPoller: no node polls the worker's task
		// queue (nodes down or restarting, or Temporal just restarted).
		s.log.Warn("no node polls the lifecycle task queue", "worker_id", id, "err", err)
		return status.Errorf(codes.Unavailable, "worker %s: no node is serving lifecycle operations right now (nodes down or restarting); try again", id)
	case isServiceError[*serviceerror.WorkflowNotReady](err):
		s.log.Warn("the worker's workflow task failed before it took the operation", "worker_id", id, "err", err)
		return status.Errorf(codes.Unavailable, "worker %s: its workflow could not take the operation now (a node holding it stopped or was too slow); try again", id)
	case isServiceError[*serviceerror.ResourceExhausted](err):
		s.log.Warn("Temporal is busy", "worker_id", id, "err", err)
		return status.Errorf(codes.ResourceExhausted, "worker %s: Temporal is busy; try again", id)
	case errors.As(err, &activityErr):
		s.log.Error("lifecycle operation failed in an activity", "worker_id", id, "err", err)
		return status.Errorf(codes.Unavailable, "worker %s: the operation failed in a backing service (state store, broker or engine); try again (details in the API log)", id)
	}
	s.log.Error("lifecycle operation failed", "worker_id", id, "err", err)
	return status.Error(codes.Internal, err.Error())
}

// timedOut reports whether err is an operation that outlasted its deadline,
// however Temporal's client reports it.
func timedOut(err error) bool {
	var updateTimeout *client.WorkflowUpdateServiceTimeoutOrCanceledError
	if errors.As(err, &updateTimeout) && !errors.Is(err, context.Canceled) && !isServiceError[*serviceerror.Canceled](err) {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || isServiceError[*serviceerror.DeadlineExceeded](err) || grpcCode(err) == codes.DeadlineExceeded
}

// noPoller reports Temporal's FailedPrecondition "no poller seen for task
// queue recently" (the matching service's errNoRecentPoller).
func noPoller(err error) bool {
	return (isServiceError[*serviceerror.FailedPrecondition](err) || grpcCode(err) == codes.FailedPrecondition) &&
		strings.Contains(err.Error(), "no poller seen for task queue")
}

// isServiceError reports whether err's chain holds a T.
func isServiceError[T error](err error) bool {
	var target T
	return errors.As(err, &target)
}

// grpcCode is the code of a gRPC status in err's chain (Unknown when none).
func grpcCode(err error) codes.Code {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code()
	}
	return codes.Unknown
}

func toProto(w catalog.Worker) *pb.Worker {
	st := pb.WorkerStatus_WORKER_STATUS_STOPPED
	if w.Status == catalog.StatusRunning {
		st = pb.WorkerStatus_WORKER_STATUS_RUNNING
	}
	out := &pb.Worker{WorkerId: w.ID, Name: w.Name, MimeType: w.MIMEType, Topic: w.Topic, Group: w.Group, Status: st,
		CodeVersion: w.CodeVersion, CodeSha256: w.CodeSHA256,
		CreatedAt: timestamppb.New(w.CreatedAt), UpdatedAt: timestamppb.New(w.UpdatedAt),
		AllowedOutputTopics: w.AllowedOutputs, AllowedGatewayTargets: w.GatewayTargets, Tenant: w.TenantName()}
	if w.MaxAttempts != 0 || w.RetryBackoff != 0 {
		out.RetryPolicy = &pb.RetryPolicy{MaxAttempts: int32(w.MaxAttempts), BackoffMs: w.RetryBackoff.Milliseconds()}
	}
	placementProto(out, w)
	out.MaxConcurrency, out.MaxProcesses = optionalInt32(w.MaxConcurrency), optionalInt32(w.MaxProcesses)
	out.TimeoutMs = optionalInt64(w.TimeoutMS)
	out.GroupKey = w.GroupKey
	return out
}
