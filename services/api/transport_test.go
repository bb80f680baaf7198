package api_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/services/api"
)

// blocking serves ListWorkers until release is closed, counting the calls
// in flight.
type blocking struct {
	pb.UnimplementedWorkManagerServiceServer
	release        chan struct{}
	inFlight, peak atomic.Int32
}

func (b *blocking) ListWorkers(ctx context.Context, _ *pb.ListWorkersRequest) (*pb.ListWorkersResponse, error) {
	n := b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return &pb.ListWorkersResponse{}, nil
}

func (b *blocking) GetWorker(context.Context, *pb.GetWorkerRequest) (*pb.Worker, error) {
	return &pb.Worker{}, nil
}

// TestTransportBoundsStreamsConnectionsAndSizes: issue 32 item 8. One
// connection runs at most Streams calls at once (the others wait), the
// listener holds at most Connections connections, and a request of a
// method that carries no code is refused above MaxRequestOverhead while a
// code-carrying one may be larger.
func TestTransportBoundsStreamsConnectionsAndSizes(t *testing.T) {
	tr := api.Transport{MaxRecvBytes: 1 << 20, Streams: 2, Connections: 1}
	srvImpl := &blocking{release: make(chan struct{})}
	srv := grpc.NewServer(tr.ServerOptions()...)
	pb.RegisterWorkManagerServiceServer(srv, srvImpl)
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	dial := func() pb.WorkManagerServiceClient {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return pb.NewWorkManagerServiceClient(conn)
	}
	c := dial()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Sizes.
	if _, err := c.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: strings.Repeat("x", api.MaxRequestOverhead+1)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a large GetWorker: %v", err)
	}
	if _, err := c.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: "w"}); err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateWorker(ctx, &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: make([]byte, 512<<10)}}})
	if status.Code(err) != codes.Unimplemented { // past the size check, to the (fake) handler
		t.Fatalf("a 512 KiB CreateWorker: %v", err)
	}
	if _, err := c.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: strings.Repeat("x", 2<<20)}); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a message over the receive limit: %v", err)
	}

	// Streams: 5 calls on one connection, at most 2 at a time.
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.ListWorkers(ctx, &pb.ListWorkersRequest{}); err != nil {
				t.Error(err)
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for srvImpl.inFlight.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	if p := srvImpl.peak.Load(); p != 2 {
		t.Fatalf("%d calls ran at once on one connection, want 2", p)
	}

	// Connections: a second one is not served while the first is open.
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	if _, err := dial().GetWorker(short, &pb.GetWorkerRequest{WorkerId: "w"}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a second connection was served: %v", err)
	}
	close(srvImpl.release)
	wg.Wait()
}
