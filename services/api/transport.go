package api

import (
	"context"
	"fmt"
	"net"
	"time"

	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// Transport bounds what clients of the API may hold on the server before
// (and after) they are authenticated (issue 32 item 8). A message is read
// whole before any interceptor runs, up to the server's one receive limit
// (gRPC-Go has no per-method one), so pre-authentication memory is bounded
// by refusing calls at their stream's headers (auth.TapHandle: no
// credentials, an unknown token, a JWT that does not verify, a method the
// caller may not call), by the message guard (Credentials: every method
// but the code-carrying ones gets MaxOtherMessageBytes, before the read,
// public health and reflection included) and by bounding connections and
// streams: at most Connections × Streams messages of up to the receive
// limit are in flight, and only from callers who may send code.
type Transport struct {
	// MaxRecvBytes is the server's receive limit: the largest message,
	// a code-carrying RPC's (API_MAX_CODE_BYTES + MaxRequestOverhead).
	MaxRecvBytes int
	// Streams bounds the concurrent calls of one connection
	// (HTTP/2 MAX_CONCURRENT_STREAMS); 0: DefaultStreams.
	Streams uint32
	// Connections bounds the open connections (0: DefaultConnections);
	// more wait in the listen backlog.
	Connections int
}

// Defaults of Transport.
const (
	DefaultStreams     = 32
	DefaultConnections = 256
	// MaxHeaderBytes bounds a call's headers (metadata).
	MaxHeaderBytes = 64 << 10
)

// codeMethods carry code inline: only they may send more than
// MaxRequestOverhead.
var codeMethods = map[string]bool{
	pb.WorkManagerService_CreateWorker_FullMethodName: true,
	pb.WorkManagerService_LoadCode_FullMethodName:     true,
}

// ServerOptions are the gRPC server options of t: the receive limit,
// concurrent streams, keepalive enforcement (a client pinging more often
// than every 10 s is disconnected; idle connections close after 5 min), a
// handshake deadline, the header limit, and MethodSizes.
func (t Transport) ServerOptions() []grpc.ServerOption {
	streams := t.Streams
	if streams == 0 {
		streams = DefaultStreams
	}
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(t.MaxRecvBytes),
		grpc.MaxConcurrentStreams(streams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 5 * time.Minute, Time: 2 * time.Minute, Timeout: 20 * time.Second}),
		grpc.ConnectionTimeout(10 * time.Second),
		grpc.MaxHeaderListSize(MaxHeaderBytes),
		grpc.ChainUnaryInterceptor(MethodSizes()),
	}
}

// Listen listens on addr and accepts at most t.Connections connections at
// a time.
func (t Transport) Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	n := t.Connections
	if n <= 0 {
		n = DefaultConnections
	}
	return netutil.LimitListener(ln, n), nil
}

// MethodSizes refuses (INVALID_ARGUMENT) a request of a method that carries
// no code when it is larger than MaxRequestOverhead: every field of those
// is bounded far below it, so only a code-carrying RPC is ever large.
func MethodSizes() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if m, ok := req.(proto.Message); ok && !codeMethods[info.FullMethod] {
			if n := proto.Size(m); n > MaxRequestOverhead {
				return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("%s: the request has %d bytes, more than %d", info.FullMethod, n, MaxRequestOverhead))
			}
		}
		return h(ctx, req)
	}
}
