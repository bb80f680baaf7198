package api

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/virtufin/workmanager/internal/workerstats"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// workerStats is what the nodes counted of worker id's messages
// (internal/workerstats: summed over the nodes, a few seconds late), for
// GetWorker; nil when no node has reported it or the counts cannot be read
// (logged: GetWorker answers without them). ListWorkers leaves them out: a
// page of 1,000 workers would read 1,000 keys of up to MaxNodes entries.
func (s *Server) workerStats(ctx context.Context, id string) *pb.WorkerStats {
	if s.opts.WorkerStats == nil {
		return nil
	}
	t, ok, err := workerstats.Read(ctx, s.opts.WorkerStats, id)
	if err != nil {
		s.log.Warn("GetWorker: the worker's message counts could not be read", "worker_id", id, "err", err)
		return nil
	}
	if !ok {
		return nil
	}
	out := &pb.WorkerStats{Processed: t.Processed, Failed: t.Failed, DeadLettered: t.DeadLettered,
		LastError: t.Last.Text, LastErrorEventId: t.Last.EventID}
	if t.Last.AtMS > 0 {
		out.LastErrorAt = timestamppb.New(time.UnixMilli(t.Last.AtMS))
	}
	return out
}
