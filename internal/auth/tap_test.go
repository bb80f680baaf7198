package auth_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// payloads counts the request messages the server read.
type payloads struct{ n atomic.Int32 }

func (p *payloads) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (p *payloads) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InPayload); ok {
		p.n.Add(1)
	}
}
func (p *payloads) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (p *payloads) HandleConn(context.Context, stats.ConnStats)                       {}

// TestRefusedBeforeTheMessageIsRead: issue 32 item 8. A call without
// credentials, with an unknown token, to a method nobody may call, or by a
// caller whose role does not allow the method is refused when its stream
// opens: the server never reads its (3 MiB) message. A good call is read
// and served.
func TestRefusedBeforeTheMessageIsRead(t *testing.T) {
	tokens := writeTokens(t, "sha256:"+auth.HashToken("reader-token")+" reader acme alice")
	opts, _, err := auth.ServerOptions(context.Background(), auth.Settings{TokensFile: tokens}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	read := &payloads{}
	srv := grpc.NewServer(append(opts, grpc.StatsHandler(read), grpc.MaxRecvMsgSize(8<<20))...)
	pb.RegisterWorkManagerServiceServer(srv, echoPrincipal{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	call := func(token, method string) error {
		dopts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if token != "" {
			dopts = append(dopts, grpc.WithPerRPCCredentials(bearer(token)))
		}
		conn, err := grpc.NewClient(ln.Addr().String(), dopts...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		big := &pb.GetWorkerRequest{WorkerId: strings.Repeat("x", 3<<20)}
		return conn.Invoke(ctx, method, big, &pb.Worker{})
	}
	const get, create = "/workmanager.v1.WorkManagerService/GetWorker", "/workmanager.v1.WorkManagerService/CreateWorker"
	for _, c := range []struct {
		token, method string
		code          codes.Code
	}{
		{"", get, codes.Unauthenticated},
		{"not-a-token", get, codes.Unauthenticated},
		{"not.a.jwt", get, codes.Unauthenticated}, // no JWT verifier: a token like any other
		{"reader-token", create, codes.PermissionDenied},
		{"reader-token", "/workmanager.v1.WorkManagerService/NoSuchMethod", codes.PermissionDenied},
	} {
		if err := call(c.token, c.method); status.Code(err) != c.code {
			t.Errorf("%q %s: %v, want %s", c.token, c.method, err, c.code)
		}
	}
	if n := read.n.Load(); n != 0 {
		t.Fatalf("the server read %d messages of refused calls", n)
	}
	if err := call("reader-token", get); err != nil {
		t.Fatalf("a reader's GetWorker: %v", err)
	}
	if n := read.n.Load(); n != 1 {
		t.Fatalf("the server read %d messages, want 1", n)
	}
}
