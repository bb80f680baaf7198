package auth_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

// echoPrincipal answers GetWorker with the caller the interceptor found.
type echoPrincipal struct {
	pb.UnimplementedWorkManagerServiceServer
}

func (echoPrincipal) GetWorker(ctx context.Context, _ *pb.GetWorkerRequest) (*pb.Worker, error) {
	p, _ := auth.FromContext(ctx)
	return &pb.Worker{WorkerId: p.Via + ":" + p.Subject + "/" + p.Role.String() + "/" + p.Tenant}, nil
}

// serveEcho serves echoPrincipal with opts on a loopback port until the
// test ends.
func serveEcho(t *testing.T, opts []grpc.ServerOption) net.Listener {
	t.Helper()
	srv := grpc.NewServer(opts...)
	pb.RegisterWorkManagerServiceServer(srv, echoPrincipal{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln
}

type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	p.caKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.caCert, _ = x509.ParseCertificate(der)
	p.write(t, "ca.pem", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue makes a key pair signed by the CA (or self-signed when ca is
// false) and returns the cert and key files.
func (p *pki) issue(t *testing.T, name string, subject pkix.Name, server, byCA bool) (string, string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: subject, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	parent, signer := p.caCert, any(p.caKey)
	if !byCA {
		parent, signer = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "EC PRIVATE KEY", kder)
}

// Server TLS with client certificates (mTLS) and bearer tokens side by
// side, through a real gRPC server: the certificate's CN/OU/O make the
// principal; a caller without a certificate may use a token; a
// certificate from another CA never gets through the handshake.
func TestMutualTLSAndTokensOverARealServer(t *testing.T) {
	p := newPKI(t)
	srvCert, srvKey := p.issue(t, "server", pkix.Name{CommonName: "api"}, true, true)
	cliCert, cliKey := p.issue(t, "client", pkix.Name{CommonName: "ci", OrganizationalUnit: []string{"operator"}, Organization: []string{"acme"}}, false, true)
	badCert, badKey := p.issue(t, "rogue", pkix.Name{CommonName: "rogue", OrganizationalUnit: []string{"admin"}}, false, false)
	tokens := writeTokens(t, "sha256:"+auth.HashToken("reader-token")+" reader default alice")

	opts, _, err := auth.ServerOptions(context.Background(), auth.Settings{TokensFile: tokens, TLSCertFile: srvCert, TLSKeyFile: srvKey,
		ClientCAFile: filepath.Join(p.dir, "ca.pem")}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln := serveEcho(t, opts)

	roots := x509.NewCertPool()
	roots.AddCert(p.caCert)
	dial := func(certFile, keyFile, token string, plain bool) (*pb.Worker, error) {
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if certFile != "" {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		creds := credentials.NewTLS(tc)
		dopts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
		if plain {
			dopts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		}
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
		return pb.NewWorkManagerServiceClient(conn).GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: "x"})
	}

	if w, err := dial(cliCert, cliKey, "", false); err != nil || w.GetWorkerId() != "mtls:ci/operator/acme" {
		t.Fatalf("client certificate: %v %v", w, err)
	}
	if w, err := dial("", "", "reader-token", false); err != nil || w.GetWorkerId() != "token:alice/reader/default" {
		t.Fatalf("token over TLS: %v %v", w, err)
	}
	if _, err := dial("", "", "", false); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no credentials: %v", err)
	}
	if _, err := dial(badCert, badKey, "", false); err == nil || status.Code(err) == codes.OK {
		t.Fatalf("a certificate from another CA got through: %v", err)
	}
	if _, err := dial("", "", "reader-token", true); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext to a TLS server: %v", err)
	}
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }
