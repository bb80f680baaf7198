package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Page sizes of the dead-letter RPCs.
const (
	defaultDeadLetterLimit = 100
	maxDeadLetterLimit     = 1000
)

// ListDeadLetters implements pb.WorkManagerServiceServer.
func (s *Server) ListDeadLetters(ctx context.Context, req *pb.ListDeadLettersRequest) (*pb.ListDeadLettersResponse, error) {
	if err := s.deadLettersConfigured(); err != nil {
		return nil, err
	}
	id, display, err := deadLetterWorkerID(ctx, req.GetWorkerId())
	if err != nil {
		return nil, err
	}
	limit, err := deadLetterLimit(req.GetLimit())
	if err != nil {
		return nil, err
	}
	if err := validReason(req.GetReason()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.catalogWorker(ctx, id); err != nil {
		return nil, named(err, display)
	}
	es, err := s.opts.DeadLetters.List(ctx, id, deadletter.Filter{Reason: req.GetReason()}, limit)
	if err != nil {
		return nil, storeStatus(err, "list dead letters")
	}
	out := &pb.ListDeadLettersResponse{DeadLetters: make([]*pb.DeadLetter, 0, len(es))}
	for _, e := range es {
		out.DeadLetters = append(out.DeadLetters, &pb.DeadLetter{WorkerId: e.Worker, Topic: e.Topic, Reason: e.Reason,
			Attempts: int32(e.Attempts), Error: e.Error, Traceback: e.Traceback, EventId: e.EventID, Source: e.Source, At: timestamppb.New(time.UnixMilli(e.AtMS))})
	}
	return out, nil
}

// ReplayDeadLetters implements pb.WorkManagerServiceServer. For each
// matching dead letter (by topic: the workers on it in creation order; each
// worker's oldest first), it (1) resets the worker's delivery
// record of the message, so that its attempts start over, (2) republishes
// the original event to its topic with the ReplayExtension naming the
// worker, so that no other worker on the topic runs it again, and (3)
// removes the dead letter. A failure stops the call with the entry at hand
// still stored; since the publish comes before the removal, an entry whose
// removal failed is replayed again by a later call (at least once).
// Dead letters without their event (undecodable) cannot be replayed: they
// are skipped and not counted.
func (s *Server) ReplayDeadLetters(ctx context.Context, req *pb.ReplayDeadLettersRequest) (*pb.ReplayDeadLettersResponse, error) {
	if err := s.deadLettersConfigured(); err != nil {
		return nil, err
	}
	id, topic := req.GetWorkerId(), req.GetTopic()
	display := id
	switch {
	case id != "" && topic != "":
		return nil, status.Error(codes.InvalidArgument, "set exactly one of worker_id and topic, not both")
	case id == "" && topic == "":
		return nil, status.Error(codes.InvalidArgument, "set exactly one of worker_id and topic (one worker, or every worker on the topic)")
	case id != "":
		var err error
		if id, display, err = deadLetterWorkerID(ctx, id); err != nil {
			return nil, err
		}
	default:
		if err := catalog.ValidateTopic(topic); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	limit, err := deadLetterLimit(req.GetLimit())
	if err != nil {
		return nil, err
	}
	if len(req.GetEventIds()) > maxDeadLetterLimit {
		return nil, status.Errorf(codes.InvalidArgument, "event_ids has %d ids, at most %d are allowed", len(req.GetEventIds()), maxDeadLetterLimit)
	}
	for i, eid := range req.GetEventIds() {
		if eid == "" || len(eid) > maxEventIDLen {
			return nil, status.Errorf(codes.InvalidArgument, "event_ids[%d] must be 1 to %d characters", i, maxEventIDLen)
		}
	}
	if err := validReason(req.GetReason()); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()

	var workers []catalog.Worker
	if id != "" {
		w, err := s.catalogWorker(ctx, id)
		if err != nil {
			return nil, named(err, display)
		}
		workers = []catalog.Worker{w}
	} else {
		// The caller's tenant's workers only (an admin's: every tenant's).
		p := caller(ctx)
		var all []catalog.Worker
		var err error
		if p.Role >= auth.RoleAdmin {
			all, err = s.catalog.ListWorkers(ctx)
		} else {
			var ids []string
			if ids, err = s.catalog.TenantWorkerIDs(ctx, p.Tenant); err == nil {
				all, err = s.catalog.GetWorkers(ctx, ids)
			}
		}
		if err != nil {
			return nil, storeStatus(err, "list workers")
		}
		for _, w := range all {
			if w.Topic == topic && mayAccess(p, w.ID) {
				workers = append(workers, w)
			}
		}
		if len(workers) == 0 {
			return nil, status.Errorf(codes.NotFound, "no worker in the catalog subscribes to topic %q", topic)
		}
	}

	f := deadletter.Filter{Reason: req.GetReason(), EventIDs: req.GetEventIds(), Replayable: true}
	out := &pb.ReplayDeadLettersResponse{}
	fail := func(err error) error {
		st := status.Convert(err)
		return status.Errorf(st.Code(), "%s (%d dead letters were replayed before)", st.Message(), out.Replayed)
	}
	for _, w := range workers {
		budget := limit - int(out.Replayed)
		if budget <= 0 {
			break
		}
		es, err := s.opts.DeadLetters.List(ctx, w.ID, f, budget)
		if err != nil {
			return nil, fail(storeStatus(err, "list dead letters of worker "+w.ID))
		}
		for _, e := range es {
			ok, err := s.replay(ctx, w, e)
			if err != nil {
				return nil, fail(err)
			}
			if ok {
				out.Replayed++
				out.EventIds = append(out.EventIds, e.EventID)
			}
		}
	}
	for _, w := range workers {
		n, err := s.opts.DeadLetters.Count(ctx, w.ID, f)
		if err != nil {
			return nil, fail(storeStatus(err, "count dead letters of worker "+w.ID))
		}
		out.Remaining += int32(n)
	}
	s.log.Info("dead letters replayed", "worker_id", id, "topic", topic, "reason", req.GetReason(),
		"replayed", out.Replayed, "remaining", out.Remaining)
	return out, nil
}

// replay republishes one dead letter for worker w (see ReplayDeadLetters);
// false: it cannot be replayed and was left as it is.
func (s *Server) replay(ctx context.Context, w catalog.Worker, e deadletter.Entry) (bool, error) {
	var ev event.Event
	if err := json.Unmarshal(e.Event, &ev); err != nil {
		s.log.Warn("dead letter not replayable: its event does not decode", "worker_id", w.ID, "event_id", e.EventID, "err", err)
		return false, nil
	}
	ev.SetExtension(deadletter.ReplayExtension, w.ID)
	if err := ev.Validate(); err != nil {
		s.log.Warn("dead letter not replayable: invalid event", "worker_id", w.ID, "event_id", e.EventID, "err", err)
		return false, nil
	}
	topic := e.Topic
	if topic == "" {
		topic = w.Topic
	}
	// Signed for this event, worker and topic: a node honours only a
	// marker the replay path signed (a producer cannot forge one).
	sig, err := s.opts.DeadLetters.SignReplay(ctx, ev.Source(), ev.ID(), w.ID, topic)
	if err != nil {
		return false, storeStatus(err, "read the replay key")
	}
	ev.SetExtension(deadletter.ReplaySignatureExtension, sig)
	if err := s.opts.Deliveries.Reset(ctx, delivery.Key(e.Source, e.EventID), w.ID); err != nil {
		return false, storeStatus(err, fmt.Sprintf("reset delivery record of event %s", e.EventID))
	}
	if err := s.opts.Publisher.Publish(ctx, topic, &ev); err != nil {
		return false, storeStatus(err, fmt.Sprintf("republish event %s to %s", e.EventID, topic))
	}
	if err := s.opts.DeadLetters.Remove(ctx, w.ID, e); err != nil {
		return false, storeStatus(err, fmt.Sprintf("event %s was republished, but removing its dead letter failed (a later replay republishes it again)", e.EventID))
	}
	return true, nil
}

func (s *Server) deadLettersConfigured() error {
	if s.opts.DeadLetters == nil || s.opts.Deliveries == nil || s.opts.Publisher == nil {
		return status.Error(codes.Unimplemented, "dead letters are not configured on this API server")
	}
	return nil
}

// catalogWorker reads a worker from the catalog: NOT_FOUND when it does not
// exist (any more).
func (s *Server) catalogWorker(ctx context.Context, id string) (catalog.Worker, error) {
	w, err := s.catalog.GetWorker(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) {
		return w, status.Errorf(codes.NotFound, "worker %s not found", id)
	}
	if err != nil {
		return w, storeStatus(err, "read worker "+id)
	}
	return w, nil
}

// validDeadLetterWorkerID: unlike the lifecycle RPCs (where a malformed id
// is simply not found), a malformed id here is a wrong request.
// deadLetterWorkerID resolves the worker_id of a dead-letter request (a
// worker id or a worker name); what is neither is INVALID_ARGUMENT here.
func deadLetterWorkerID(ctx context.Context, ref string) (id, display string, err error) {
	id, display, err = resolve(ctx, ref)
	if status.Code(err) == codes.NotFound {
		return "", "", status.Errorf(codes.InvalidArgument, "worker_id %q is neither a worker id (a UUID) nor a worker name", ref)
	}
	return id, display, err
}

// maxEventIDLen bounds an event id in a request.
const maxEventIDLen = 512

// validReason accepts "" (any) or a dead-letter reason's shape: 1..64 of
// a-z and _.
func validReason(r string) error {
	if len(r) > 64 || strings.Trim(r, "abcdefghijklmnopqrstuvwxyz_") != "" {
		return status.Errorf(codes.InvalidArgument, "reason %q is not a dead-letter reason (worker_failed, timeout, lock_contention, …: 1 to 64 of a-z and _)", r)
	}
	return nil
}

func deadLetterLimit(limit int32) (int, error) {
	switch {
	case limit == 0:
		return defaultDeadLetterLimit, nil
	case limit < 0 || limit > maxDeadLetterLimit:
		return 0, status.Errorf(codes.InvalidArgument, "limit %d must be 0 (default %d) or 1..%d", limit, defaultDeadLetterLimit, maxDeadLetterLimit)
	}
	return int(limit), nil
}

// storeStatus maps a failure of the state store or the broker: a deadline
// or a cancellation as such, anything else UNAVAILABLE (retry later).
func storeStatus(err error, what string) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return status.Errorf(codes.DeadlineExceeded, "%s: did not finish in time: %v", what, err)
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%s: %v", what, err)
	}
	return status.Errorf(codes.Unavailable, "%s: %v", what, err)
}
