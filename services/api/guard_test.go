package api_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/services/api"
)

// inPayloads counts the request messages the server read.
type inPayloads struct{ n atomic.Int32 }

func (p *inPayloads) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (p *inPayloads) HandleRPC(_ context.Context, s stats.RPCStats) {
	if _, ok := s.(*stats.InPayload); ok {
		p.n.Add(1)
	}
}
func (p *inPayloads) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (p *inPayloads) HandleConn(context.Context, stats.ConnStats)                       {}

// bytesIn counts the bytes the server reads from its connections.
type bytesIn struct {
	net.Listener
	n atomic.Int64
}

func (l *bytesIn) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countedConn{Conn: c, n: &l.n}, nil
}

type countedConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type token string

func (b token) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (token) RequireTransportSecurity() bool { return false }

// selfSigned writes a certificate and key for 127.0.0.1.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "api"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	c, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(c)
	return certFile, keyFile, pool
}

// TestSmallReceiveLimitBeforeTheRead: issue 42 item 7 (c). With
// API_PUBLIC_HEALTH, anybody may call health and reflection; those, and
// every other method that carries no code, get a small receive limit
// (MaxOtherMessageBytes) enforced before gRPC reads the message, for
// unary and streaming calls, over plaintext and TLS: a larger message, or
// a compressed one (a gzip bomb), closes its connection and the server
// reads none of it, while a
// code-carrying RPC may still send up to the server's receive limit, a
// request a little over MaxRequestOverhead still gets INVALID_ARGUMENT,
// and ordinary calls (many on one connection, with headers HPACK indexes)
// are served.
func TestSmallReceiveLimitBeforeTheRead(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) { testSmallReceiveLimit(t, useTLS) })
	}
}

func testSmallReceiveLimit(t *testing.T, useTLS bool) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("sha256:"+auth.HashToken("op-token")+" operator acme alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := api.Transport{MaxRecvBytes: 1 << 20}
	settings := auth.Settings{TokensFile: tokens, PublicHealth: true, WrapCredentials: tr.Credentials}
	clientCreds := insecure.NewCredentials()
	if useTLS {
		cert, key, pool := selfSigned(t)
		settings.TLSCertFile, settings.TLSKeyFile = cert, key
		clientCreds = credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	}
	opts, _, err := auth.ServerOptions(context.Background(), settings, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	read := &inPayloads{}
	srv := grpc.NewServer(append(append(opts, tr.ServerOptions()...), grpc.StatsHandler(read))...)
	pb.RegisterWorkManagerServiceServer(srv, &blocking{release: make(chan struct{})})
	gh := grpchealth.NewServer()
	healthpb.RegisterHealthServer(srv, gh)
	reflection.Register(srv)
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counted := &bytesIn{Listener: ln}
	go srv.Serve(counted)
	defer srv.Stop()
	dial := func(tok string) *grpc.ClientConn {
		dopts := []grpc.DialOption{grpc.WithTransportCredentials(clientCreds)}
		if tok != "" {
			dopts = append(dopts, grpc.WithPerRPCCredentials(token(tok)))
		}
		conn, err := grpc.NewClient(ln.Addr().String(), dopts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	big := strings.Repeat("x", 512<<10) // far over MaxOtherMessageBytes, under the server's limit

	refused := func(name string, f func(*grpc.ClientConn) error) {
		t.Helper()
		before, payloadsBefore := counted.n.Load(), read.n.Load()
		err := f(dial(""))
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want the connection closed (UNAVAILABLE)", name, err)
		}
		if n := counted.n.Load() - before; n > 3*api.MaxOtherMessageBytes/2 {
			t.Errorf("%s: the server read %d bytes of a %d-byte message", name, n, len(big))
		}
		if n := read.n.Load() - payloadsBefore; n != 0 {
			t.Errorf("%s: the server read %d messages", name, n)
		}
	}
	refused("health Check", func(c *grpc.ClientConn) error {
		_, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{Service: big})
		return err
	})
	refused("a gzip bomb to health Check", func(c *grpc.ClientConn) error {
		_, err := healthpb.NewHealthClient(c).Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("x", 3<<20)},
			grpc.UseCompressor(gzip.Name))
		return err
	})
	refused("health Watch", func(c *grpc.ClientConn) error {
		w, err := healthpb.NewHealthClient(c).Watch(ctx, &healthpb.HealthCheckRequest{Service: big})
		if err != nil {
			return err
		}
		_, err = w.Recv()
		return err
	})
	refused("reflection", func(c *grpc.ClientConn) error {
		s, err := reflectionpb.NewServerReflectionClient(c).ServerReflectionInfo(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&reflectionpb.ServerReflectionRequest{Host: big}); err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	})

	// An operator: code-carrying RPCs may be large, others may not.
	op := dial("op-token")
	c := pb.NewWorkManagerServiceClient(op)
	_, err = c.CreateWorker(ctx, &pb.CreateWorkerRequest{Code: &pb.CodeSource{Source: &pb.CodeSource_Content{Content: make([]byte, 768<<10)}}})
	if status.Code(err) != codes.Unimplemented { // past every limit, to the (fake) handler
		t.Fatalf("a 768 KiB CreateWorker: %v", err)
	}
	if _, err := c.GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: strings.Repeat("x", api.MaxRequestOverhead+1)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a GetWorker just over MaxRequestOverhead: %v", err)
	}
	// Many calls on one connection with varying headers: the guard's HPACK
	// state follows the client's.
	for i := range 50 {
		md := metadata.Pairs("x-request", fmt.Sprint("r-", i%7), "x-big", strings.Repeat("h", 100*(i%5)))
		if _, err := c.GetWorker(metadata.NewOutgoingContext(ctx, md), &pb.GetWorkerRequest{WorkerId: "w"}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if _, err := healthpb.NewHealthClient(op).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("health %d: %v", i, err)
		}
	}
	refused("an operator's large GetWorker", func(*grpc.ClientConn) error {
		_, err := pb.NewWorkManagerServiceClient(dial("op-token")).GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: big})
		return err
	})
	if _, err := healthpb.NewHealthClient(dial("")).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("an anonymous health check: %v", err)
	}
}
