package api

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// quarantineReason is "quarantined: crashed the node N times (last event
// …); reload or start it to try again" while worker id is quarantined (""
// when it is not, or when the record cannot be read: a read does not fail
// for it).
func (s *Server) quarantineReason(ctx context.Context, id string) string {
	q, ok, err := s.catalog.GetQuarantine(ctx, id)
	if err != nil {
		s.log.Warn("GetWorker: the worker's quarantine could not be read", "worker_id", id, "err", err)
		return ""
	}
	if !ok {
		return ""
	}
	return q.Reason()
}

// liftQuarantine clears worker id's quarantine (id resolved) before a LoadCode, a
// rollback or a StartWorker: the caller asks it to run again, so every
// node loads its code at the change (or, for a StartWorker of a running
// worker, at its next reconcile).
func (s *Server) liftQuarantine(ctx context.Context, id string) error {
	cleared, err := s.catalog.ClearQuarantine(ctx, id)
	if err != nil {
		return status.Errorf(codes.Unavailable, "%v; try again", err)
	}
	if cleared {
		s.log.Info("worker quarantine lifted by the caller", "worker_id", id, "by", caller(ctx).Subject)
	}
	return nil
}
