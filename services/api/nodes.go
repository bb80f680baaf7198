package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/cluster"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/tenant"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// Placement limits of CreateWorker.
const (
	// MaxReplicas bounds a worker's replicas.
	MaxReplicas = 64
	// MaxRequireLabels bounds the labels a worker may require.
	MaxRequireLabels = 16
)

// DefaultNodeTTL is how long a node counts as alive after its last
// heartbeat unless Options.NodeTTL says otherwise: 3 x NODE_HEARTBEAT's
// default (5s).
const DefaultNodeTTL = 15 * time.Second

// workerPlacement validates CreateWorker's replicas and placement and
// returns what the worker's record keeps (nil: the cluster's defaults).
func workerPlacement(req *pb.CreateWorkerRequest) (*catalog.Placement, error) {
	var out catalog.Placement
	if req.Replicas != nil {
		r := int(req.GetReplicas())
		if r < 0 || r > MaxReplicas {
			return nil, status.Errorf(codes.InvalidArgument, "replicas %d must be 0 (every node that can run the worker) or 1..%d; unset: the cluster's PLACEMENT_REPLICAS", r, MaxReplicas)
		}
		out.Replicas = &r
	}
	req2 := req.GetPlacement().GetRequire()
	if len(req2) > MaxRequireLabels {
		return nil, status.Errorf(codes.InvalidArgument, "placement.require has %d labels; at most %d", len(req2), MaxRequireLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(req2)) {
		for _, p := range [][2]string{{"key", k}, {"value", req2[k]}} {
			if err := placement.CheckLabelPart(p[0], p[1]); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "placement.require label %q: %v", k, err)
			}
		}
	}
	if len(req2) > 0 {
		out.Require = maps.Clone(req2)
	}
	if out.Replicas == nil && out.Require == nil {
		return nil, nil
	}
	return &out, nil
}

// samePlacement reports whether two workers ask the same of placement
// (a create retried with its request id must ask what the first did).
func samePlacement(a, b *catalog.Placement) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if (a.Replicas == nil) != (b.Replicas == nil) || a.Replicas != nil && *a.Replicas != *b.Replicas {
		return false
	}
	return maps.Equal(a.Require, b.Require)
}

// placementText describes p for messages.
func placementText(p *catalog.Placement) string {
	replicas := "default"
	if p != nil && p.Replicas != nil {
		replicas = strconv.Itoa(*p.Replicas)
	}
	var req []string
	if p != nil {
		for _, k := range slices.Sorted(maps.Keys(p.Require)) {
			req = append(req, k+"="+p.Require[k])
		}
	}
	return fmt.Sprintf("replicas %s, placement.require %q", replicas, req)
}

// placementProto sets what w asks of placement on out.
func placementProto(out *pb.Worker, w catalog.Worker) {
	if w.Placement == nil {
		return
	}
	if r := w.Placement.Replicas; r != nil {
		v := int32(*r)
		out.Replicas = &v
	}
	if len(w.Placement.Require) > 0 {
		out.Placement = &pb.WorkerPlacement{Require: maps.Clone(w.Placement.Require)}
	}
}

// placementRecord reads the placement record; without one (no store, or
// none written yet, or the store failing) it is empty: a read of workers
// does not fail because the placement record could not be read (the
// failure is logged).
func (s *Server) placementRecord(ctx context.Context) placement.Record {
	if s.opts.Cluster == nil {
		return placement.Record{}
	}
	rec, err := placement.NewStore(s.opts.Cluster).Load(ctx)
	if err != nil {
		s.log.Warn("workers answered without their nodes: the placement record could not be read", "err", err)
		return placement.Record{}
	}
	return rec
}

// addPlacement sets on out the nodes serving worker w's topic (a running
// worker's only: a stopped one is served nowhere) and why no node can run
// it, from rec.
func addPlacement(out *pb.Worker, w catalog.Worker, rec placement.Record) {
	tp, ok := rec.Topics[w.Topic]
	if !ok {
		return
	}
	if w.Status == catalog.StatusRunning {
		out.Nodes = tp.Serving()
	}
	out.PlacementReason = tp.Unplaceable[w.ID]
}

// ListNodes implements pb.WorkManagerServiceServer: every node alive or
// named by the placement record, by id.
func (s *Server) ListNodes(ctx context.Context, _ *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	if err := s.clusterReader(ctx); err != nil {
		return nil, err
	}
	v, err := s.readNodes(ctx)
	if err != nil {
		return nil, err
	}
	out := &pb.ListNodesResponse{Nodes: make([]*pb.Node, 0, len(v.ids))}
	for _, id := range v.ids {
		out.Nodes = append(out.Nodes, v.node(id))
	}
	return out, nil
}

// drainRecordWait bounds how long DrainNode waits for the placement
// workflow to record the drain before it answers.
const drainRecordWait = 10 * time.Second

// DrainNode implements pb.WorkManagerServiceServer: it drains or undrains
// a known node through the placement workflow and answers the node as it
// is once the change is recorded.
func (s *Server) DrainNode(ctx context.Context, req *pb.DrainNodeRequest) (*pb.DrainNodeResponse, error) {
	if err := s.clusterReader(ctx); err != nil {
		return nil, err
	}
	id := req.GetNodeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "node_id is required")
	}
	v, err := s.readNodes(ctx)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(v.ids, id) {
		return nil, status.Errorf(codes.NotFound, "node %s not found (neither alive nor in the placement record; wmctl nodes lists them)", id)
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.drain(ctx, id, !req.GetUndrain()); err != nil {
		return nil, s.drainStatus(err, id, req.GetUndrain())
	}
	// The workflow has the request; it records it in the placement record
	// at once (its next step): answer once it is there, so that the answer
	// (and a wmctl nodes right after) shows it.
	want := !req.GetUndrain()
	limit := s.drainWait
	if limit <= 0 {
		limit = drainRecordWait
	}
	until := time.Now().Add(limit)
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		if v, err = s.readNodes(ctx); err != nil {
			return nil, err
		}
		if slices.Contains(v.rec.Drained, id) == want {
			return &pb.DrainNodeResponse{Node: v.node(id)}, nil
		}
		if ctx.Err() != nil || time.Now().After(until) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	// Asked (the signal is durable) but not recorded: an answer of
	// success here would tell the caller the node is drained when the
	// placement workflow may be stuck (a failed workflow task) or gone.
	what := "drain"
	if !want {
		what = "undrain"
	}
	s.log.Warn("node drain asked but not recorded in time", "node_id", id, "undrain", !want, "waited", limit)
	return nil, status.Errorf(codes.DeadlineExceeded,
		"%s node %s: asked, but the placement workflow has not recorded it after %s; it keeps the request and records it when it runs (wmctl nodes shows when), and if it does not, the Temporal UI shows workflow %s",
		what, id, limit, workflows.PlacementWorkflowID)
}

// clusterReader refuses the node RPCs when the API has no cluster store,
// and to callers who may not see the whole cluster: nodes serve every
// tenant's topics, so only the default tenant's callers and admins.
func (s *Server) clusterReader(ctx context.Context) error {
	if s.opts.Cluster == nil {
		return status.Error(codes.Unimplemented, "nodes are not available: this API has no cluster state store")
	}
	if p := caller(ctx); p.Role < auth.RoleAdmin && p.Tenant != tenant.Default {
		return status.Errorf(codes.PermissionDenied, "nodes serve every tenant: only callers of the default tenant and admins see them (%s %q is of tenant %q)", p.Via, p.Subject, p.Tenant)
	}
	return nil
}

// drainStatus maps a failed SetDrained to a gRPC status.
func (s *Server) drainStatus(err error, id string, undrain bool) error {
	what := "drain"
	if undrain {
		what = "undrain"
	}
	switch kind := failure.Kind(err); {
	case kind == failure.InvalidArgument:
		return status.Errorf(codes.InvalidArgument, "%s node %s: %s", what, id, failure.Message(err))
	case kind == failure.NotFound:
		return status.Errorf(codes.NotFound, "%s node %s: %s", what, id, failure.Message(err))
	case errors.Is(err, context.Canceled):
		return status.Errorf(codes.Canceled, "%s node %s: canceled", what, id)
	case timedOut(err):
		s.log.Warn("node drain did not finish in time", "node_id", id, "undrain", undrain, "err", err)
		return status.Errorf(codes.DeadlineExceeded, "%s node %s: the placement workflow did not record it in time (it may still: wmctl nodes shows the outcome)", what, id)
	}
	s.log.Error("node drain failed", "node_id", id, "undrain", undrain, "err", err)
	return status.Errorf(codes.Unavailable, "%s node %s: the placement workflow could not record it; try again (details in the API log)", what, id)
}

// nodesView is one read of the membership, the placement record and the
// nodes' advertisements.
type nodesView struct {
	ids   []string // alive or named by the record, sorted
	alive map[string]bool
	info  map[string]placement.NodeInfo
	rec   placement.Record
}

// readNodes reads the membership, the placement record and the
// advertisements of the nodes either names.
func (s *Server) readNodes(ctx context.Context) (nodesView, error) {
	ttl := s.opts.NodeTTL
	if ttl <= 0 {
		ttl = DefaultNodeTTL
	}
	alive, err := cluster.New(s.opts.Cluster, "", ttl).Alive(ctx)
	if err != nil {
		return nodesView{}, status.Errorf(codes.Unavailable, "list nodes: %v", err)
	}
	ps := placement.NewStore(s.opts.Cluster)
	rec, err := ps.Load(ctx)
	if err != nil {
		return nodesView{}, status.Errorf(codes.Unavailable, "list nodes: %v", err)
	}
	v := nodesView{alive: map[string]bool{}, info: map[string]placement.NodeInfo{}, rec: rec}
	known := map[string]bool{}
	for _, id := range alive {
		v.alive[id], known[id] = true, true
	}
	for _, tp := range rec.Topics {
		for _, id := range tp.Nodes {
			known[id] = true
		}
		for _, id := range tp.Leaving {
			known[id] = true
		}
	}
	for _, id := range rec.Drained {
		known[id] = true
	}
	v.ids = slices.Sorted(maps.Keys(known))
	infos, err := ps.Nodes(ctx, v.ids)
	if err != nil {
		return nodesView{}, status.Errorf(codes.Unavailable, "list nodes: %v", err)
	}
	for _, n := range infos {
		v.info[n.ID] = n
	}
	return v, nil
}

// node is node id as v sees it.
func (v nodesView) node(id string) *pb.Node {
	n := &pb.Node{Id: id, Alive: v.alive[id], Drained: slices.Contains(v.rec.Drained, id)}
	if in, ok := v.info[id]; ok {
		n.Labels, n.Engines, n.MemoryBytes = maps.Clone(in.Labels), slices.Clone(in.Engines), in.MemoryBytes
		n.Workers, n.Topics, n.Processes = int32(in.Workers), int32(in.Topics), int32(in.Processes)
		if !in.StartedAt.IsZero() {
			n.StartedAt = timestamppb.New(in.StartedAt)
		}
		if !in.UpdatedAt.IsZero() {
			n.UpdatedAt = timestamppb.New(in.UpdatedAt)
		}
	}
	for topic, tp := range v.rec.Topics {
		if slices.Contains(tp.Nodes, id) || slices.Contains(tp.Leaving, id) {
			n.PlacedTopics = append(n.PlacedTopics, topic)
		}
	}
	slices.Sort(n.PlacedTopics)
	return n
}
