package auth_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/virtufin/workmanager/internal/auth"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
)

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func certDER(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", file)
	}
	return blk.Bytes
}

// A running API server picks up a rotated tokens file (the new token
// accepted, the removed one refused), a rotated server certificate (served
// to new connections) and a rotated client CA (certificates of the new CA
// accepted), without a restart; a tokens file rewritten with garbage keeps
// the tokens in use.
func TestServerReloadsRotatedCredentials(t *testing.T) {
	p1, p2 := newPKI(t), newPKI(t)
	dir := t.TempDir()
	srvCert, srvKey, caFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "client-ca.pem")
	c1, k1 := p1.issue(t, "server", pkix.Name{CommonName: "api"}, true, true)
	copyFile(t, c1, srvCert)
	copyFile(t, k1, srvKey)
	copyFile(t, filepath.Join(p1.dir, "ca.pem"), caFile)
	tokens := writeTokens(t, "sha256:"+auth.HashToken("old-token")+" reader default alice")
	var logs bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// An interval of 1ns: every call checks the files (the credfile tests
	// check the interval itself).
	opts, _, err := auth.ServerOptions(ctx, auth.Settings{TokensFile: tokens, TLSCertFile: srvCert, TLSKeyFile: srvKey,
		ClientCAFile: caFile, ReloadInterval: time.Nanosecond}, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln := serveEcho(t, opts)

	roots := x509.NewCertPool()
	roots.AddCert(p1.caCert)
	roots.AddCert(p2.caCert)
	// call dials anew (a new handshake) and returns the caller the server
	// saw and the certificate it served.
	call := func(certFile, keyFile, token string) (string, []byte, error) {
		var served []byte
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, VerifyConnection: func(cs tls.ConnectionState) error {
			served = cs.PeerCertificates[0].Raw
			return nil
		}}
		if certFile != "" {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		dopts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
		if token != "" {
			dopts = append(dopts, grpc.WithPerRPCCredentials(bearer(token)))
		}
		conn, err := grpc.NewClient(ln.Addr().String(), dopts...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		w, err := pb.NewWorkManagerServiceClient(conn).GetWorker(cctx, &pb.GetWorkerRequest{WorkerId: "x"})
		return w.GetWorkerId(), served, err
	}

	// Tokens.
	if who, _, err := call("", "", "old-token"); err != nil || who != "token:alice/reader/default" {
		t.Fatalf("old token before the rotation: %q %v", who, err)
	}
	if err := os.WriteFile(tokens, []byte("sha256:"+auth.HashToken("new-token")+" operator default bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if who, _, err := call("", "", "new-token"); err != nil || who != "token:bob/operator/default" {
		t.Fatalf("new token after the rotation: %q %v", who, err)
	}
	if _, _, err := call("", "", "old-token"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("the removed token must be refused after the rotation: %v", err)
	}
	if err := os.WriteFile(tokens, []byte("sha256:not-a-hash operat"), 0o600); err != nil {
		t.Fatal(err)
	}
	if who, _, err := call("", "", "new-token"); err != nil || who != "token:bob/operator/default" {
		t.Fatalf("a bad tokens file must keep the tokens in use: %q %v", who, err)
	}
	if !strings.Contains(logs.String(), "CREDENTIALS NOT RELOADED") || !strings.Contains(logs.String(), "API_TOKENS_FILE") {
		t.Fatalf("the bad tokens file is not logged: %s", logs.String())
	}

	// The server's certificate.
	if _, served, err := call("", "", "new-token"); err != nil || !bytes.Equal(served, certDER(t, c1)) {
		t.Fatalf("before the rotation the first certificate is served: %v", err)
	}
	c2, k2 := p2.issue(t, "server", pkix.Name{CommonName: "api"}, true, true)
	copyFile(t, c2, srvCert)
	copyFile(t, k2, srvKey)
	if _, served, err := call("", "", "new-token"); err != nil || !bytes.Equal(served, certDER(t, c2)) {
		t.Fatalf("a new connection after the rotation must be served the new certificate: %v", err)
	}

	// The client CA.
	cc, ck := p2.issue(t, "client", pkix.Name{CommonName: "ci", OrganizationalUnit: []string{"operator"}, Organization: []string{"acme"}}, false, true)
	if _, _, err := call(cc, ck, ""); err == nil {
		t.Fatal("a certificate of a CA not yet in API_CLIENT_CA_FILE got through")
	}
	copyFile(t, filepath.Join(p2.dir, "ca.pem"), caFile)
	if who, _, err := call(cc, ck, ""); err != nil || who != "mtls:ci/operator/acme" {
		t.Fatalf("a certificate of the rotated client CA: %q %v", who, err)
	}
}
