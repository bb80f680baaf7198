package temporalconn_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/temporalconn"
)

func cp(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// One client made with Apply follows a rotation of its CA bundle, client
// certificate and API key on its next connections and calls, without a new
// Apply; the CA bundle is really checked (a frontend certificate of a CA
// no longer in it is refused), and an API key file rewritten with nothing
// keeps the last good key.
func TestClientFollowsRotatedFiles(t *testing.T) {
	pki1, err := devstack.DevTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pki2, err := devstack.DevTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The frontend accepts client certificates of both CAs and serves the
	// certificate of the CA in use.
	clientCAs := x509.NewCertPool()
	for _, f := range []string{pki1.CA, pki2.CA} {
		b, _ := os.ReadFile(f)
		clientCAs.AppendCertsFromPEM(b)
	}
	var serving atomic.Pointer[tls.Certificate]
	use := func(f devstack.DevTLSFiles) {
		pair, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
		if err != nil {
			t.Fatal(err)
		}
		serving.Store(&pair)
	}
	use(pki1)
	var mu sync.Mutex
	var clientIssuers []string
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serving.Load(), nil },
		VerifyConnection: func(cs tls.ConnectionState) error {
			mu.Lock()
			clientIssuers = append(clientIssuers, string(cs.PeerCertificates[0].RawIssuer))
			mu.Unlock()
			return nil
		}})))
	fe := &frontend{}
	workflowservice.RegisterWorkflowServiceServer(srv, fe)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	dir := t.TempDir()
	s := temporalconn.Settings{TLS: true, CAFile: dir + "/ca.pem", CertFile: dir + "/tls.crt", KeyFile: dir + "/tls.key",
		ServerName: "localhost", APIKeyFile: dir + "/api-key", ReloadInterval: time.Nanosecond}
	cp(t, pki1.CA, s.CAFile)
	cp(t, pki1.ClientCert, s.CertFile)
	cp(t, pki1.ClientKey, s.KeyFile)
	if err := os.WriteFile(s.APIKeyFile, []byte("key-one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := client.Options{HostPort: ln.Addr().String(), Namespace: "default"}
	if err := s.Apply(&opts); err != nil {
		t.Fatal(err)
	}
	// dial makes a new connection with the same options and returns the
	// authorization header and the client certificate's issuer it sent.
	dial := func() (string, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := client.DialContext(ctx, opts)
		if err != nil {
			return "", "", err
		}
		c.Close()
		mu.Lock()
		defer mu.Unlock()
		fe.mu.Lock()
		defer fe.mu.Unlock()
		return fe.auth[len(fe.auth)-1], clientIssuers[len(clientIssuers)-1], nil
	}
	issuer := func(f devstack.DevTLSFiles) string {
		pair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		leaf, _ := x509.ParseCertificate(pair.Certificate[0])
		return string(leaf.RawIssuer)
	}

	if auth, iss, err := dial(); err != nil || auth != "Bearer key-one" || iss != issuer(pki1) {
		t.Fatalf("before the rotation: %q %v", auth, err)
	}
	// The frontend moves to the second CA before the client knows it.
	use(pki2)
	if _, _, err := dial(); err == nil {
		t.Fatal("a frontend certificate of a CA not in TEMPORAL_TLS_CA_FILE was accepted")
	}
	cp(t, pki2.CA, s.CAFile)
	cp(t, pki2.ClientCert, s.CertFile)
	cp(t, pki2.ClientKey, s.KeyFile)
	if err := os.WriteFile(s.APIKeyFile, []byte("key-two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if auth, iss, err := dial(); err != nil || auth != "Bearer key-two" || iss != issuer(pki2) {
		t.Fatalf("after the rotation: %q %v (client certificate of the new CA: %v)", auth, err, iss == issuer(pki2))
	}
	if err := os.WriteFile(s.APIKeyFile, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if auth, _, err := dial(); err != nil || auth != "Bearer key-two" {
		t.Fatalf("after a bad rotation: %q %v, want the last good key", auth, err)
	}
}
