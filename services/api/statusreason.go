package api

import (
	"context"
	"strings"
)

// addStatusReason appends reason to w's status_reason, after what another
// source put there ("; " between): several notes (not recovered,
// quarantined, …) may explain one worker's state.
func addStatusReason(cur, reason string) string {
	switch {
	case reason == "":
		return cur
	case cur == "":
		return reason
	case strings.Contains(cur, reason):
		return cur
	}
	return cur + "; " + reason
}

// notRecoveredReason is "not recovered: <why>" when the last recovery
// could not bring worker id back and it has not loaded since ("" when it
// loaded, or when the note cannot be read: a read does not fail for it).
func (s *Server) notRecoveredReason(ctx context.Context, id string) string {
	n, ok, err := s.catalog.GetNotRecovered(ctx, id)
	if err != nil {
		s.log.Warn("GetWorker: why the worker was not recovered could not be read", "worker_id", id, "err", err)
		return ""
	}
	if !ok {
		return ""
	}
	return "not recovered: " + n.Reason
}
