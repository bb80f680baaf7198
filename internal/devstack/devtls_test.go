package devstack

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
)

// The dev certificates chain to the dev CA, the server's is valid for
// 127.0.0.1, the client's says admin of the default tenant, and a second
// call keeps them.
func TestDevTLS(t *testing.T) {
	dir := t.TempDir()
	f, err := DevTLS(dir)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate")
	}
	srv, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1"}); err != nil {
		t.Fatalf("server certificate: %v", err)
	}
	cli, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("client certificate: %v", err)
	}
	if s := cli.Leaf.Subject; s.CommonName != "dev" || s.OrganizationalUnit[0] != "admin" || s.Organization[0] != "default" {
		t.Fatalf("client subject %v", s)
	}
	again, err := DevTLS(dir)
	if err != nil || again != f {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f.CA); string(b) != string(caPEM) {
		t.Fatal("a second call made new certificates")
	}
}
