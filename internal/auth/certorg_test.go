package auth_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
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

// TestClientCertificateNeedsExactlyOneOrganization: issue 32 item 7. A
// client certificate from the trusted CA whose subject has no O or several
// O values is refused (UNAUTHENTICATED, saying why) instead of becoming
// the default tenant, which has no topic prefix; O=default is the default
// tenant, and one O is that tenant.
func TestClientCertificateNeedsExactlyOneOrganization(t *testing.T) {
	p := newPKI(t)
	srvCert, srvKey := p.issue(t, "server", pkix.Name{CommonName: "api"}, true, true)
	opts, _, err := auth.ServerOptions(context.Background(), auth.Settings{TLSCertFile: srvCert, TLSKeyFile: srvKey,
		ClientCAFile: filepath.Join(p.dir, "ca.pem")}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln := serveEcho(t, opts)
	roots := x509.NewCertPool()
	roots.AddCert(p.caCert)
	call := func(name string, subject pkix.Name) (*pb.Worker, error) {
		certFile, keyFile := p.issue(t, name, subject, false, true)
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(
			&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return pb.NewWorkManagerServiceClient(conn).GetWorker(ctx, &pb.GetWorkerRequest{WorkerId: "x"})
	}
	for name, subject := range map[string]pkix.Name{
		"no-o":      {CommonName: "nobody", OrganizationalUnit: []string{"admin"}},
		"two-o":     {CommonName: "both", OrganizationalUnit: []string{"operator"}, Organization: []string{"acme", "globex"}},
		"two-o-dup": {CommonName: "twice", OrganizationalUnit: []string{"operator"}, Organization: []string{"acme", "acme"}},
	} {
		w, err := call(name, subject)
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "exactly one O") {
			t.Errorf("%s: %v %v; want UNAUTHENTICATED (exactly one O)", name, w, err)
		}
	}
	for name, c := range map[string]struct {
		subject pkix.Name
		want    string
	}{
		"default": {pkix.Name{CommonName: "dev", OrganizationalUnit: []string{"admin"}, Organization: []string{"default"}}, "mtls:dev/admin/default"},
		"acme":    {pkix.Name{CommonName: "ci", OrganizationalUnit: []string{"reader"}, Organization: []string{"acme"}}, "mtls:ci/reader/acme"},
	} {
		if w, err := call(name, c.subject); err != nil || w.GetWorkerId() != c.want {
			t.Errorf("%s: %v %v, want %s", name, w, err, c.want)
		}
	}
}
