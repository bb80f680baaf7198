package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/mocks"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/cluster"
	"github.com/virtufin/workmanager/internal/failure"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/state"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/workflows"
)

// CreateWorker refuses bad replicas and placement labels with
// INVALID_ARGUMENT naming what is wrong, before anything is stored or any
// workflow touched.
func TestCreateRefusesBadPlacement(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	tooMany := map[string]string{}
	for i := range 17 {
		tooMany[fmt.Sprintf("k%d", i)] = "v"
	}
	for name, c := range map[string]struct {
		replicas *int32
		require  map[string]string
		want     string
	}{
		"negative replicas": {replicas: proto.Int32(-1), want: "replicas -1 must be 0 (every node that can run the worker) or 1..64"},
		"too many replicas": {replicas: proto.Int32(65), want: "replicas 65 must be 0"},
		"too many labels":   {require: tooMany, want: "placement.require has 17 labels; at most 16"},
		"empty key":         {require: map[string]string{"": "a"}, want: `placement.require label "": key "" must be 1 to 63 characters long`},
		"empty value":       {require: map[string]string{"zone": ""}, want: `placement.require label "zone": value "" must be 1 to 63 characters long`},
		"long key":          {require: map[string]string{strings.Repeat("k", 64): "a"}, want: "must be 1 to 63 characters long"},
		"bad key":           {require: map[string]string{"po ol": "cpu"}, want: `placement.require label "po ol": key "po ol" has ' ' at position 2`},
		"bad value":         {require: map[string]string{"pool": "cpu=1"}, want: `placement.require label "pool": value "cpu=1" has '=' at position 3`},
	} {
		t.Run(name, func(t *testing.T) {
			s, store := newServer(t, mocks.NewClient(t))
			req := &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", Replicas: c.replicas}
			if c.require != nil {
				req.Placement = &pb.WorkerPlacement{Require: c.require}
			}
			_, err := s.CreateWorker(context.Background(), req)
			wantCode(t, err, codes.InvalidArgument, c.want)
			if keys := store.Keys(); len(keys) != 0 {
				t.Fatalf("something was stored: %v", keys)
			}
		})
	}
}

// Replicas and required labels go into the worker's record (the workflow
// input), and are answered back as they were given; replicas 0 (every
// node) is kept apart from unset (the cluster default).
func TestCreateKeepsPlacement(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	for name, c := range map[string]struct {
		replicas *int32
		require  map[string]string
	}{
		"defaults":   {},
		"every node": {replicas: proto.Int32(0)},
		"three, cpu": {replicas: proto.Int32(3), require: map[string]string{"pool": "cpu", "k8s.io/zone": "eu-1a"}},
	} {
		t.Run(name, func(t *testing.T) {
			s, input := serverCapturingCreate(t)
			req := &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", Replicas: c.replicas}
			if c.require != nil {
				req.Placement = &pb.WorkerPlacement{Require: c.require}
			}
			if _, err := s.CreateWorker(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			w := input().State.Worker
			if c.replicas == nil && c.require == nil {
				if w.Placement != nil {
					t.Fatalf("placement %+v of a worker that asked for none", *w.Placement)
				}
			} else if w.Placement == nil || (w.Placement.Replicas == nil) != (c.replicas == nil) ||
				c.replicas != nil && *w.Placement.Replicas != int(*c.replicas) || fmt.Sprint(w.Placement.Require) != fmt.Sprint(c.require) {
				t.Fatalf("record placement %+v, want replicas %v require %v", w.Placement, c.replicas, c.require)
			}
			p := toProto(w)
			got := fmt.Sprint(replicasString(p), " ", p.GetPlacement() != nil && len(p.GetPlacement().GetRequire()) > 0, " ", p.GetPlacement().GetRequire())
			wantReplicas := "<nil>"
			if c.replicas != nil {
				wantReplicas = fmt.Sprint(*c.replicas)
			}
			if want := fmt.Sprint(wantReplicas, " ", len(c.require) > 0, " ", fmt.Sprint(c.require)); got != want {
				t.Fatalf("answered %q, want %q", got, want)
			}
		})
	}
}

func replicasString(w *pb.Worker) string {
	if w.Replicas == nil {
		return "<nil>"
	}
	return fmt.Sprint(w.GetReplicas())
}

// clusterServer is a Server with a memory store for the cluster (its
// membership, advertisements and placement record): two live nodes, a
// third named only by the record (dead, still leaving a topic), one
// drained.
func clusterServer(t *testing.T, tc *mocks.Client) (*Server, *state.MemoryStore) {
	t.Helper()
	s, store := newServer(t, tc)
	s.opts.Cluster = store
	ctx := context.Background()
	for _, id := range []string{"node-a", "node-b"} {
		if err := cluster.New(store, id, time.Minute).Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ps := placement.NewStore(store)
	started := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	if err := ps.Advertise(ctx, placement.NodeInfo{ID: "node-a", Labels: map[string]string{"zone": "a"}, Engines: []string{"native", "python"},
		MemoryBytes: 8 << 30, Workers: 3, Topics: 2, Processes: 1, StartedAt: started, UpdatedAt: started.Add(time.Minute)}, 0); err != nil {
		t.Fatal(err)
	}
	if err := ps.Advertise(ctx, placement.NodeInfo{ID: "node-b", Engines: []string{"native"}, Workers: 1, Topics: 1, StartedAt: started}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Update(ctx, func(r *placement.Record) bool {
		r.Topics = map[string]placement.TopicPlacement{
			"orders":  {Nodes: []string{"node-b", "node-a"}, Leaving: []string{"node-c"}, Replicas: 2},
			"billing": {Nodes: []string{"node-a"}, Replicas: 2, Unplaceable: map[string]string{"6203c8ee-cf77-4964-8144-e0bcaf0e2b6a": "no live node has the label pool=gpu"}},
		}
		r.Drained = []string{"node-b"}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	s.opts.NodeTTL = time.Minute
	return s, store
}

// GetWorker answers the nodes serving a running worker's topic (leaving
// ones included, sorted) and why no node can run it.
func TestGetWorkerSaysWhereItRuns(t *testing.T) {
	tc := mocks.NewClient(t)
	ids := map[string]catalog.Worker{
		"0f2f7a4c-4b7e-4b0a-8a39-0d8a3c6a1b11": {Topic: "orders", Status: catalog.StatusRunning},
		"6203c8ee-cf77-4964-8144-e0bcaf0e2b6a": {Topic: "billing", Status: catalog.StatusRunning},
		"9b1d2c3e-1111-4222-8333-944455556666": {Topic: "orders", Status: catalog.StatusStopped},
		"9b1d2c3e-2222-4222-8333-944455556666": {Topic: "unplaced", Status: catalog.StatusRunning},
	}
	for id, w := range ids {
		w.ID, w.CodeVersion = id, 1
		tc.On("QueryWorkflow", mock.Anything, workflows.WorkflowID(id), "", workflows.QueryState).Return(
			stateValue(t, workflows.WorkerState{Worker: w, Created: true}), nil)
	}
	s, _ := clusterServer(t, tc)
	for id, want := range map[string]string{
		"0f2f7a4c-4b7e-4b0a-8a39-0d8a3c6a1b11": "[node-a node-b node-c] ",
		"6203c8ee-cf77-4964-8144-e0bcaf0e2b6a": "[node-a] no live node has the label pool=gpu",
		"9b1d2c3e-1111-4222-8333-944455556666": "[] ", // stopped: served nowhere
		"9b1d2c3e-2222-4222-8333-944455556666": "[] ", // not placed yet
	} {
		w, err := s.GetWorker(context.Background(), &pb.GetWorkerRequest{WorkerId: id})
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(w.GetNodes(), " ", w.GetPlacementReason()); got != want {
			t.Errorf("worker %s (%s): nodes and reason %q, want %q", id, ids[id].Topic, got, want)
		}
	}
}

// ListWorkers adds each worker's nodes and reason, reading the placement
// record once per page, not once per worker.
func TestListWorkersSaysWhereTheyRunReadingTheRecordOnce(t *testing.T) {
	s, store := clusterServer(t, mocks.NewClient(t))
	ctx := context.Background()
	reason := "6203c8ee-cf77-4964-8144-e0bcaf0e2b6a"
	if err := s.catalog.SaveWorker(ctx, catalog.Worker{ID: reason, Topic: "billing", Status: catalog.StatusRunning}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := s.catalog.SaveWorker(ctx, catalog.Worker{ID: uuid.NewString(), Topic: "orders", Status: catalog.StatusRunning}); err != nil {
			t.Fatal(err)
		}
	}
	counting := &countingStore{Store: store}
	s.opts.Cluster = counting
	resp, err := s.ListWorkers(ctx, &pb.ListWorkersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetWorkers()) != 6 {
		t.Fatalf("%d workers, want 6", len(resp.GetWorkers()))
	}
	for _, w := range resp.GetWorkers() {
		want := "[node-a node-b node-c] "
		if w.GetWorkerId() == reason {
			want = "[node-a] no live node has the label pool=gpu"
		}
		if got := fmt.Sprint(w.GetNodes(), " ", w.GetPlacementReason()); got != want {
			t.Errorf("worker %s: %q, want %q", w.GetWorkerId(), got, want)
		}
	}
	reads := 0
	for _, k := range counting.keys {
		if k == placement.RecordKey {
			reads++
		}
	}
	if reads != 1 {
		t.Fatalf("the placement record was read %d times for one page, want once (%v)", reads, counting.keys)
	}
}

// ListNodes lists the live nodes and those the record names, with what
// they advertise and what is placed on them.
func TestListNodes(t *testing.T) {
	s, _ := clusterServer(t, mocks.NewClient(t))
	resp, err := s.ListNodes(context.Background(), &pb.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range resp.GetNodes() {
		got = append(got, fmt.Sprintf("%s alive=%v drained=%v labels=%v engines=%v mem=%d workers=%d topics=%d procs=%d placed=%v started=%v",
			n.GetId(), n.GetAlive(), n.GetDrained(), n.GetLabels(), n.GetEngines(), n.GetMemoryBytes(), n.GetWorkers(), n.GetTopics(), n.GetProcesses(),
			n.GetPlacedTopics(), n.GetStartedAt().AsTime().Format(time.TimeOnly)))
	}
	want := []string{
		"node-a alive=true drained=false labels=map[zone:a] engines=[native python] mem=8589934592 workers=3 topics=2 procs=1 placed=[billing orders] started=10:00:00",
		"node-b alive=true drained=true labels=map[] engines=[native] mem=0 workers=1 topics=1 procs=0 placed=[orders] started=10:00:00",
		"node-c alive=false drained=false labels=map[] engines=[] mem=0 workers=0 topics=0 procs=0 placed=[orders] started=00:00:00",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("nodes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if resp.GetNodes()[2].GetStartedAt() != nil {
		t.Fatal("a node without an advertisement has a start time")
	}
}

// Nodes serve every tenant: a reader of another tenant is refused; a
// reader of the default tenant and an admin of any are answered.
func TestListNodesIsForTheDefaultTenantAndAdmins(t *testing.T) {
	s, _ := clusterServer(t, mocks.NewClient(t))
	_, err := s.ListNodes(as(auth.RoleOperator, "acme"), &pb.ListNodesRequest{})
	wantCode(t, err, codes.PermissionDenied, `of tenant "acme"`)
	for _, ctx := range []context.Context{as(auth.RoleReader, "default"), as(auth.RoleAdmin, "acme")} {
		if _, err := s.ListNodes(ctx, &pb.ListNodesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = s.DrainNode(as(auth.RoleOperator, "acme"), &pb.DrainNodeRequest{NodeId: "node-a"})
	wantCode(t, err, codes.PermissionDenied, "nodes serve every tenant")
}

// Without a cluster store the node RPCs are UNIMPLEMENTED and workers are
// answered without nodes.
func TestNodesWithoutClusterStore(t *testing.T) {
	s, _ := newServer(t, mocks.NewClient(t))
	_, err := s.ListNodes(context.Background(), &pb.ListNodesRequest{})
	wantCode(t, err, codes.Unimplemented, "no cluster state store")
	_, err = s.DrainNode(context.Background(), &pb.DrainNodeRequest{NodeId: "node-a"})
	wantCode(t, err, codes.Unimplemented, "no cluster state store")
}

// DrainNode asks the placement workflow to drain (or undrain) a known
// node and answers the node as recorded; an unknown node is NOT_FOUND and
// the workflow is not asked; a failure of the workflow is UNAVAILABLE.
func TestDrainNode(t *testing.T) {
	s, store := clusterServer(t, mocks.NewClient(t))
	type call struct {
		node    string
		drained bool
	}
	var calls []call
	var fail error
	s.drain = func(ctx context.Context, node string, drained bool) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("SetDrained called without a deadline")
		}
		calls = append(calls, call{node, drained})
		if fail != nil {
			return fail
		}
		// What the placement workflow records.
		_, err := placement.NewStore(store).Update(ctx, func(r *placement.Record) bool {
			if drained {
				r.Drained = append(r.Drained, node)
			} else {
				r.Drained = nil
			}
			return true
		})
		return err
	}
	ctx := context.Background()
	resp, err := s.DrainNode(ctx, &pb.DrainNodeRequest{NodeId: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	if n := resp.GetNode(); n.GetId() != "node-a" || !n.GetDrained() || !n.GetAlive() {
		t.Fatalf("answered %v, want node-a alive and drained", n)
	}
	// A dead node the record still names can be drained or undrained.
	if resp, err = s.DrainNode(ctx, &pb.DrainNodeRequest{NodeId: "node-c", Undrain: true}); err != nil {
		t.Fatal(err)
	}
	if n := resp.GetNode(); n.GetDrained() || n.GetAlive() {
		t.Fatalf("answered %v, want node-c dead and not drained", n)
	}
	_, err = s.DrainNode(ctx, &pb.DrainNodeRequest{NodeId: "node-x"})
	wantCode(t, err, codes.NotFound, "node node-x not found")
	_, err = s.DrainNode(ctx, &pb.DrainNodeRequest{})
	wantCode(t, err, codes.InvalidArgument, "node_id is required")
	fail = errors.New("temporal: connection refused")
	_, err = s.DrainNode(ctx, &pb.DrainNodeRequest{NodeId: "node-b"})
	wantCode(t, err, codes.Unavailable, "drain node node-b: the placement workflow could not record it")
	if strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("the workflow's error reached the caller: %v", err)
	}
	// Asked but never recorded (a stuck placement workflow): not an
	// answer of success.
	fail = nil
	recorded := s.drain
	s.drain = func(ctx context.Context, node string, drained bool) error {
		calls = append(calls, call{node, drained})
		return nil
	}
	s.drainWait = 50 * time.Millisecond
	_, err = s.DrainNode(ctx, &pb.DrainNodeRequest{NodeId: "node-b"})
	wantCode(t, err, codes.DeadlineExceeded, "drain node node-b: asked, but the placement workflow has not recorded it after 50ms")
	s.drain = recorded
	if want := []call{{"node-a", true}, {"node-c", false}, {"node-b", true}, {"node-b", true}}; fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("SetDrained calls %v, want %v", calls, want)
	}
}

// A create's history entry answers the placement the worker was created
// with; entries without one (loads, older creates) answer none.
func TestHistoryEntryCarriesPlacement(t *testing.T) {
	zero := 0
	e := historyProto(catalog.HistoryEntry{Version: 1, Action: catalog.HistoryCreate,
		Placement: &catalog.Placement{Replicas: &zero, Require: map[string]string{"pool": "gpu"}}})
	if e.Replicas == nil || e.GetReplicas() != 0 || fmt.Sprint(e.GetPlacement().GetRequire()) != "map[pool:gpu]" {
		t.Fatalf("create entry %v, want replicas 0 and require pool=gpu", e)
	}
	if e := historyProto(catalog.HistoryEntry{Version: 2, Action: catalog.HistoryLoadCode}); e.Replicas != nil || e.Placement != nil {
		t.Fatalf("load entry %v carries a placement", e)
	}
}

// A request id used again with another placement is ALREADY_EXISTS, as
// with any other parameter; with the same placement it answers the worker.
func TestRequestIDRetryMustAskTheSamePlacement(t *testing.T) {
	code := &pb.CodeSource{Source: &pb.CodeSource_Content{Content: []byte("def process(e): pass")}}
	two := 2
	id := RequestWorkerID("default", "r-1")
	for name, c := range map[string]struct {
		replicas *int32
		want     codes.Code
	}{
		"same":  {proto.Int32(2), codes.OK},
		"other": {proto.Int32(3), codes.AlreadyExists},
		"unset": {nil, codes.AlreadyExists},
	} {
		t.Run(name, func(t *testing.T) {
			tc := mocks.NewClient(t)
			tc.On("NewWithStartWorkflowOperation", mock.Anything, mock.Anything, mock.Anything).Return(nil)
			tc.On("UpdateWithStartWorkflow", mock.Anything, mock.Anything).Return(nil, failure.New(failure.AlreadyExists, "worker exists"))
			tc.On("QueryWorkflow", mock.Anything, mock.Anything, "", workflows.QueryState).Return(stateValue(t, workflows.WorkerState{Created: true,
				Worker: catalog.Worker{ID: id, Topic: "t", MIMEType: engines.MIMEPython, RequestID: "r-1", Placement: &catalog.Placement{Replicas: &two}}}), nil)
			s, _ := newServer(t, tc)
			_, err := s.CreateWorker(context.Background(), &pb.CreateWorkerRequest{Code: code, MimeType: engines.MIMEPython, Topic: "t", RequestId: "r-1", Replicas: c.replicas})
			if c.want == codes.OK {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantCode(t, err, c.want, `with other parameters (topic "t", mime_type "text/x-python", group "", allowed_output_topics [], allowed_gateway_targets [], replicas 2, placement.require []`)
		})
	}
}
