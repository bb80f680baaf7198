package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

const goodToken = "good-token"

var fixedTime = timestamppb.New(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC))

// fakeAPI is an in-memory WorkManagerService that checks the bearer token
// and can be told to fail.
type fakeAPI struct {
	pb.UnimplementedWorkManagerServiceServer
	addr string

	mu      sync.Mutex
	workers []*pb.Worker
	creates []*pb.CreateWorkerRequest
	loads   []*pb.LoadCodeRequest
	replays []*pb.ReplayDeadLettersRequest
	// deadLetters, when set, answers ListDeadLetters (onList runs first,
	// with the lock held, and may change them); nil: one fixed dead letter.
	deadLetters []*pb.DeadLetter
	onList      func(f *fakeAPI)
	nodes       []*pb.Node
	drains      []*pb.DrainNodeRequest
	pageSize    int   // >0: ListWorkers pages of this size at most
	fail        error // every call fails with it
	calls       int
}

// startFake serves a fakeAPI on a loopback port (with TLS when creds is
// set).
func startFake(t *testing.T, creds credentials.TransportCredentials) *fakeAPI {
	t.Helper()
	f := &fakeAPI{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts := []grpc.ServerOption{grpc.UnaryInterceptor(f.auth)}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	s := grpc.NewServer(opts...)
	pb.RegisterWorkManagerServiceServer(s, f)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	f.addr = lis.Addr().String()
	return f
}

func (f *fakeAPI) auth(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if got := md.Get("authorization"); len(got) != 1 || got[0] != "Bearer "+goodToken {
		return nil, status.Error(codes.Unauthenticated, "missing or unknown credentials")
	}
	f.mu.Lock()
	f.calls++
	fail := f.fail
	f.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	return h(ctx, req)
}

func (f *fakeAPI) add(w *pb.Worker) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.workers = append(f.workers, w)
}

func (f *fakeAPI) find(ref string) (*pb.Worker, error) {
	for _, w := range f.workers {
		if w.WorkerId == ref || (w.Name != "" && w.Name == ref) {
			return w, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "worker %q not found", ref)
}

func (f *fakeAPI) CreateWorker(_ context.Context, r *pb.CreateWorkerRequest) (*pb.CreateWorkerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Topic == "" {
		return nil, status.Error(codes.InvalidArgument, "topic is required")
	}
	f.creates = append(f.creates, proto.Clone(r).(*pb.CreateWorkerRequest))
	id := fmt.Sprintf("w-%d", len(f.workers)+1)
	f.workers = append(f.workers, &pb.Worker{WorkerId: id, Name: r.Name, Topic: r.Topic, Group: r.Group, MimeType: r.MimeType,
		Status: pb.WorkerStatus_WORKER_STATUS_RUNNING, CodeVersion: 1, CreatedAt: fixedTime, UpdatedAt: fixedTime})
	return &pb.CreateWorkerResponse{WorkerId: id}, nil
}

func (f *fakeAPI) GetWorker(_ context.Context, r *pb.GetWorkerRequest) (*pb.Worker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.find(r.WorkerId)
}

func (f *fakeAPI) ListWorkers(_ context.Context, r *pb.ListWorkersRequest) (*pb.ListWorkersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	start := 0
	if r.PageToken != "" {
		start, _ = strconv.Atoi(r.PageToken)
	}
	n := len(f.workers) - start
	if f.pageSize > 0 && n > f.pageSize {
		n = f.pageSize
	}
	resp := &pb.ListWorkersResponse{Workers: f.workers[start : start+n]}
	if start+n < len(f.workers) {
		resp.NextPageToken = strconv.Itoa(start + n)
	}
	return resp, nil
}

func (f *fakeAPI) setStatus(ref string, s pb.WorkerStatus) (*pb.Worker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, err := f.find(ref)
	if err != nil {
		return nil, err
	}
	w.Status = s
	return w, nil
}

func (f *fakeAPI) StartWorker(_ context.Context, r *pb.StartWorkerRequest) (*pb.Worker, error) {
	return f.setStatus(r.WorkerId, pb.WorkerStatus_WORKER_STATUS_RUNNING)
}

func (f *fakeAPI) StopWorker(_ context.Context, r *pb.StopWorkerRequest) (*pb.Worker, error) {
	return f.setStatus(r.WorkerId, pb.WorkerStatus_WORKER_STATUS_STOPPED)
}

func (f *fakeAPI) DeleteWorker(_ context.Context, r *pb.DeleteWorkerRequest) (*pb.DeleteWorkerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, w := range f.workers {
		if w.WorkerId == r.WorkerId || w.Name == r.WorkerId {
			f.workers = append(f.workers[:i], f.workers[i+1:]...)
			return &pb.DeleteWorkerResponse{}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "worker %q not found", r.WorkerId)
}

func (f *fakeAPI) LoadCode(_ context.Context, r *pb.LoadCodeRequest) (*pb.Worker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w, err := f.find(r.WorkerId)
	if err != nil {
		return nil, err
	}
	f.loads = append(f.loads, proto.Clone(r).(*pb.LoadCodeRequest))
	w.CodeVersion++
	return w, nil
}

func (f *fakeAPI) GetWorkerHistory(_ context.Context, r *pb.GetWorkerHistoryRequest) (*pb.GetWorkerHistoryResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.find(r.WorkerId); err != nil {
		return nil, err
	}
	all := []*pb.HistoryEntry{
		{Version: 1, Sha256: strings.Repeat("a", 64), SourceKind: "content", CreatedAt: fixedTime, Actor: "dev", Action: "create"},
		{Version: 2, Sha256: strings.Repeat("b", 64), SourceKind: "content", CreatedAt: fixedTime, Actor: "dev", Action: "rollback", RollbackTo: 1},
	}
	// Pages of f.pageSize entries, like ListWorkers.
	start := 0
	if r.PageToken != "" {
		start, _ = strconv.Atoi(r.PageToken)
	}
	n := len(all) - start
	if f.pageSize > 0 && n > f.pageSize {
		n = f.pageSize
	}
	resp := &pb.GetWorkerHistoryResponse{Entries: all[start : start+n]}
	if start+n < len(all) {
		resp.NextPageToken = strconv.Itoa(start + n)
	}
	return resp, nil
}

func (f *fakeAPI) ListDeadLetters(_ context.Context, r *pb.ListDeadLettersRequest) (*pb.ListDeadLettersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.onList != nil {
		f.onList(f)
	}
	if f.deadLetters != nil {
		return &pb.ListDeadLettersResponse{DeadLetters: f.deadLetters}, nil
	}
	return &pb.ListDeadLettersResponse{DeadLetters: []*pb.DeadLetter{
		{WorkerId: r.WorkerId, Topic: "orders", Reason: "worker_failed", Attempts: 3, Error: "ValueError: boom", EventId: "o-1", Source: "shop", At: fixedTime},
	}}, nil
}

func (f *fakeAPI) ReplayDeadLetters(_ context.Context, r *pb.ReplayDeadLettersRequest) (*pb.ReplayDeadLettersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replays = append(f.replays, proto.Clone(r).(*pb.ReplayDeadLettersRequest))
	return &pb.ReplayDeadLettersResponse{Replayed: 1, EventIds: []string{"o-1"}, Remaining: 2}, nil
}

func (f *fakeAPI) RecoverWorkers(context.Context, *pb.RecoverWorkersRequest) (*pb.RecoverWorkersResponse, error) {
	return &pb.RecoverWorkersResponse{Recovered: 4, Failed: 1}, nil
}

// result is one wmctl run.
type result struct {
	out, err string
	code     int
}

// run runs wmctl in workDir with only env as its environment (no config
// file unless env names one).
func run(t *testing.T, env map[string]string, workDir string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	if workDir == "" {
		workDir = t.TempDir()
	}
	getenv := func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		if k == "HOME" || k == "XDG_CONFIG_HOME" {
			return workDir // no user config leaks into tests
		}
		return ""
	}
	code := Main(context.Background(), args, Options{IO: IO{In: strings.NewReader(""), Out: &out, Err: &errb}, Getenv: getenv, WorkDir: workDir})
	return result{out.String(), errb.String(), code}
}

// runOK runs wmctl against f with the good token and wants exit 0.
func (f *fakeAPI) runOK(t *testing.T, args ...string) string {
	t.Helper()
	r := run(t, map[string]string{"WMCTL_TOKEN": goodToken, "WMCTL_ADDR": f.addr}, "", args...)
	if r.code != 0 {
		t.Fatalf("wmctl %v: exit %d, stderr %q", args, r.code, r.err)
	}
	return r.out
}

func (f *fakeAPI) ListNodes(context.Context, *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &pb.ListNodesResponse{Nodes: f.nodes}, nil
}

func (f *fakeAPI) DrainNode(_ context.Context, r *pb.DrainNodeRequest) (*pb.DrainNodeResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.drains = append(f.drains, proto.Clone(r).(*pb.DrainNodeRequest))
	for _, n := range f.nodes {
		if n.Id == r.NodeId {
			n.Drained = !r.Undrain
			return &pb.DrainNodeResponse{Node: n}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "node %s not found", r.NodeId)
}
