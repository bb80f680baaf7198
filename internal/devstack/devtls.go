package devstack

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// DevTLSFiles are the files DevTLS writes under dir/tls.
type DevTLSFiles struct {
	CA                    string // the dev CA's certificate (clients trust it; the API checks client certificates against it)
	ServerCert, ServerKey string // the API's certificate, for 127.0.0.1 and localhost
	ClientCert, ClientKey string // a client certificate: CN dev, OU admin, O default
}

// Env is the API's environment for server TLS and client certificates.
func (f DevTLSFiles) Env() []string {
	return []string{"API_TLS_CERT_FILE=" + f.ServerCert, "API_TLS_KEY_FILE=" + f.ServerKey, "API_CLIENT_CA_FILE=" + f.CA}
}

// DevTLS makes (on first use; later calls keep them) a dev CA, a server
// certificate for the API on loopback and an admin client certificate of
// the default tenant under dir/tls, for `make run RUN_FLAGS=-mtls`. For a
// laptop only: the CA key sits next to the certificates.
func DevTLS(dir string) (DevTLSFiles, error) {
	d := filepath.Join(dir, "tls")
	f := DevTLSFiles{CA: filepath.Join(d, "ca.pem"), ServerCert: filepath.Join(d, "server.pem"), ServerKey: filepath.Join(d, "server-key.pem"),
		ClientCert: filepath.Join(d, "client.pem"), ClientKey: filepath.Join(d, "client-key.pem")}
	if _, err := os.Stat(f.ClientKey); err == nil {
		return f, nil
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return f, err
	}
	now := time.Now()
	caKey, caCert, err := newCert(&x509.Certificate{Subject: pkix.Name{CommonName: "WorkManager dev CA"}, IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true,
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0)}, nil, nil)
	if err != nil {
		return f, err
	}
	srvKey, srvCert, err := newCert(&x509.Certificate{Subject: pkix.Name{CommonName: "workmanager-api"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0)}, caCert, caKey)
	if err != nil {
		return f, err
	}
	cliKey, cliCert, err := newCert(&x509.Certificate{Subject: pkix.Name{CommonName: "dev", OrganizationalUnit: []string{"admin"}, Organization: []string{"default"}},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0)}, caCert, caKey)
	if err != nil {
		return f, err
	}
	// The keys last: a half-written set is made again next time.
	for _, w := range []struct {
		path string
		cert *x509.Certificate
		key  *ecdsa.PrivateKey
	}{{f.CA, caCert, nil}, {f.ServerCert, srvCert, nil}, {f.ClientCert, cliCert, nil},
		{filepath.Join(d, "ca-key.pem"), nil, caKey}, {f.ServerKey, nil, srvKey}, {f.ClientKey, nil, cliKey}} {
		var block *pem.Block
		if w.cert != nil {
			block = &pem.Block{Type: "CERTIFICATE", Bytes: w.cert.Raw}
		} else {
			der, err := x509.MarshalECPrivateKey(w.key)
			if err != nil {
				return f, err
			}
			block = &pem.Block{Type: "EC PRIVATE KEY", Bytes: der}
		}
		if err := os.WriteFile(w.path, pem.EncodeToMemory(block), 0o600); err != nil {
			return f, err
		}
	}
	return f, nil
}

// newCert makes a key and a certificate from tmpl, signed by parent (self
// signed when parent is nil).
func newCert(tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("dev certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	return key, cert, err
}
