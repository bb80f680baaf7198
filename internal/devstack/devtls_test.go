package devstack

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
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

// DevToken keeps the token across calls and the lines a user added to the
// tokens file, replacing only its own.
func TestDevTokenKeepsAddedLines(t *testing.T) {
	dir := t.TempDir()
	tok, file, err := DevToken(dir)
	if err != nil {
		t.Fatal(err)
	}
	extra := "sha256:" + strings.Repeat("ab", 32) + " operator acme alice"
	b, _ := os.ReadFile(file)
	if err := os.WriteFile(file, append(b, []byte(extra+"\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	tok2, _, err := DevToken(dir)
	if err != nil || tok2 != tok {
		t.Fatalf("token changed: %v", err)
	}
	b, _ = os.ReadFile(file)
	if got := string(b); !strings.Contains(got, extra) || strings.Count(got, " admin default dev") != 1 {
		t.Fatalf("tokens file:\n%s", got)
	}
}
