// Package daprconn owns the gRPC connection to daprd: one connection shared
// by the go-sdk client and the raw streaming client, carrying daprd's API
// token (DAPR_API_TOKEN) on every call — including the raw streaming
// subscriptions, which the go-sdk does not cover —, a receive limit large
// enough for anything daprd may send (RecvLimit), and a deadline on every
// unary call that has none, so that a daprd that stops answering turns into
// an error (and a redelivery) instead of a message stuck forever.
package daprconn

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// TokenHeader is the metadata key daprd reads its API token from.
const TokenHeader = "dapr-api-token"

// Options shape the connection.
type Options struct {
	// Token is daprd's API token ("" when daprd runs without one).
	Token string
	// MaxRecvBytes, when positive, is the largest message accepted from
	// daprd (gRPC's default is 4 MiB); see RecvLimit.
	MaxRecvBytes int
	// CallTimeout bounds every unary call whose context has no deadline
	// of its own (0: DefaultCallTimeout; negative: unbounded). Streams are
	// not bounded.
	CallTimeout time.Duration
}

// DefaultCallTimeout bounds a unary call to daprd without a deadline of its
// own: far above any state or publish round trip, below the time after
// which the broker hands a message out again (processingTimeout 15s, plus
// the redelivery scan).
const DefaultCallTimeout = 20 * time.Second

// Envelope is the room RecvLimit leaves around the largest body for the
// rest of a gRPC message (a CloudEvent's attributes and extensions, a state
// item's key, ETag and metadata).
const Envelope = 1 << 20

// RecvLimit is the receive limit a node needs: whatever daprd may send it —
// up to its own max body size (daprd's --max-body-size), whether an event
// on a streaming subscription or a state item such as a code body — and
// the largest event the node accepts, each plus Envelope. Below daprd's
// limit, a larger event fails the stream's Recv (ResourceExhausted) before
// the node can dead-letter it as too large: never acked, it comes back
// every processing timeout and tears down its topic's stream each time.
func RecvLimit(maxEventBytes, daprMaxBodyBytes int) int {
	return max(maxEventBytes, daprMaxBodyBytes) + Envelope
}

// Dial connects to daprd at addr (loopback, plaintext as daprd serves it).
func Dial(addr string, o Options) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if o.MaxRecvBytes > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxRecvBytes)))
	}
	timeout := o.CallTimeout
	if timeout == 0 {
		timeout = DefaultCallTimeout
	}
	if timeout > 0 {
		opts = append(opts, grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
			if _, ok := ctx.Deadline(); !ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}))
	}
	if o.Token != "" {
		tok := o.Token
		opts = append(opts,
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
				return invoker(withToken(ctx, tok), method, req, reply, cc, callOpts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, callOpts ...grpc.CallOption) (grpc.ClientStream, error) {
				return streamer(withToken(ctx, tok), desc, cc, method, callOpts...)
			}))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dapr connection %s: %w", addr, err)
	}
	return conn, nil
}

// withToken sets the token unless the caller (the go-sdk, which reads
// DAPR_API_TOKEN itself) already did.
func withToken(ctx context.Context, tok string) context.Context {
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md.Get(TokenHeader)) > 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, TokenHeader, tok)
}
