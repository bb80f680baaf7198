package daprconn

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// recorder is a gRPC server that answers every call Unimplemented after
// recording the token headers it got.
type recorder struct {
	mu   sync.Mutex
	seen [][]string
}

func (r *recorder) start(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		md, _ := metadata.FromIncomingContext(st.Context())
		r.mu.Lock()
		r.seen = append(r.seen, md.Get(TokenHeader))
		r.mu.Unlock()
		return status.Error(codes.Unimplemented, "recorded")
	}))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func (r *recorder) last() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		return nil
	}
	return r.seen[len(r.seen)-1]
}

func call(t *testing.T, conn *grpc.ClientConn, ctx context.Context, stream bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !stream {
		err := conn.Invoke(ctx, "/test.Svc/Unary", &emptypb.Empty{}, &emptypb.Empty{})
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("unary: %v", err)
		}
		return
	}
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, "/test.Svc/Stream")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RecvMsg(&emptypb.Empty{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("stream: %v", err)
	}
}

// The token goes on unary calls and on streams (the raw streaming
// subscriptions), once, and not at all when none is configured.
func TestTokenOnEveryCall(t *testing.T) {
	r := &recorder{}
	addr := r.start(t)
	conn, err := Dial(addr, Options{Token: "s3cret", MaxRecvBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, stream := range []bool{false, true} {
		call(t, conn, context.Background(), stream)
		if got := r.last(); len(got) != 1 || got[0] != "s3cret" {
			t.Fatalf("stream=%v: token headers %v", stream, got)
		}
	}
	// A caller that set it already (the go-sdk does when DAPR_API_TOKEN is
	// set) does not get it twice.
	call(t, conn, metadata.AppendToOutgoingContext(context.Background(), TokenHeader, "s3cret"), false)
	if got := r.last(); len(got) != 1 {
		t.Fatalf("token headers %v, want one", got)
	}

	plain, err := Dial(addr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	call(t, plain, context.Background(), true)
	if got := r.last(); len(got) != 0 {
		t.Fatalf("token sent without one configured: %v", got)
	}
}

// hanging starts a gRPC server that never answers a call and reports, for
// each call, the deadline the server saw (zero: none).
func hanging(t *testing.T) (string, <-chan time.Duration) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan time.Duration, 10)
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		var left time.Duration
		if dl, ok := st.Context().Deadline(); ok {
			left = time.Until(dl)
		}
		seen <- left
		<-st.Context().Done()
		return st.Context().Err()
	}))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), seen
}

// A unary call without a deadline gets CallTimeout, one with its own keeps
// it, and a negative CallTimeout leaves calls unbounded.
func TestCallTimeout(t *testing.T) {
	addr, seen := hanging(t)
	conn, err := Dial(addr, Options{CallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	err = conn.Invoke(context.Background(), "/test.Svc/Unary", &emptypb.Empty{}, &emptypb.Empty{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call without a deadline against a daprd that never answers: %v, want DeadlineExceeded", err)
	}
	if d := <-seen; d <= 0 || d > 200*time.Millisecond {
		t.Fatalf("server saw deadline %v, want at most CallTimeout", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	go func() { _ = conn.Invoke(ctx, "/test.Svc/Unary", &emptypb.Empty{}, &emptypb.Empty{}) }()
	if d := <-seen; d < 50*time.Minute {
		t.Fatalf("server saw deadline %v, want the caller's own hour", d)
	}

	unbounded, err := Dial(addr, Options{CallTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer unbounded.Close()
	noDeadline, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = unbounded.Invoke(noDeadline, "/test.Svc/Unary", &emptypb.Empty{}, &emptypb.Empty{}) }()
	if d := <-seen; d != 0 {
		t.Fatalf("negative CallTimeout: server saw deadline %v", d)
	}
	if dflt, err := Dial(addr, Options{}); err != nil {
		t.Fatal(err)
	} else {
		defer dflt.Close()
		go func() { _ = dflt.Invoke(context.Background(), "/test.Svc/Unary", &emptypb.Empty{}, &emptypb.Empty{}) }()
		if d := <-seen; d <= DefaultCallTimeout-5*time.Second || d > DefaultCallTimeout {
			t.Fatalf("default: server saw deadline %v, want about %v", d, DefaultCallTimeout)
		}
	}
}
