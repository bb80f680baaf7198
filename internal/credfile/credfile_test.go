package credfile

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func loadWord(p string) func() (string, error) {
	return func() (string, error) {
		b, err := ReadLimited("TEST_FILE", p)
		if err != nil {
			return "", err
		}
		s := strings.TrimSpace(string(b))
		if s == "" || strings.ContainsAny(s, " \n") {
			return "", errors.New("want one word")
		}
		return s, nil
	}
}

// A rotated file is in use at the first Get one interval later, not
// before; a file that no longer loads keeps the last good value, says why
// (Err, an error log line), and a fixed file is picked up again.
func TestRotationWithinOneIntervalAndBadFilesKeepTheOld(t *testing.T) {
	p := filepath.Join(t.TempDir(), "word")
	writeFile(t, p, "first\n")
	var logs bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	w, err := New("TEST_FILE", []string{p}, 30*time.Second, slog.New(slog.NewTextHandler(&logs, nil)), loadWord(p))
	if err != nil {
		t.Fatal(err)
	}
	w.now = c.now
	w.checked = c.now()
	w.checkedAt.Store(w.checked.UnixNano())
	if got := w.Get(); got != "first" {
		t.Fatalf("Get = %q", got)
	}
	writeFile(t, p, "second\n")
	c.add(29 * time.Second)
	if got := w.Get(); got != "first" {
		t.Fatalf("before one interval: Get = %q, want the old value", got)
	}
	c.add(time.Second)
	if got := w.Get(); got != "second" {
		t.Fatalf("one interval after the rotation: Get = %q, want second", got)
	}
	if w.Reloads() != 1 || !strings.Contains(logs.String(), "credentials reloaded") {
		t.Fatalf("reloads %d, logs %q", w.Reloads(), logs.String())
	}

	writeFile(t, p, "half writ") // a half-written file
	c.add(30 * time.Second)
	if got := w.Get(); got != "second" {
		t.Fatalf("after a bad rotation: Get = %q, want the last good value", got)
	}
	if w.Err() == nil || !strings.Contains(logs.String(), "CREDENTIALS NOT RELOADED") {
		t.Fatalf("a bad file must be reported: err %v, logs %q", w.Err(), logs.String())
	}
	// Logged once, not at every check.
	c.add(30 * time.Second)
	w.Get()
	if n := strings.Count(logs.String(), "CREDENTIALS NOT RELOADED"); n != 1 {
		t.Fatalf("logged %d times, want once", n)
	}
	// A removed file too.
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if changed, err := w.Check(); changed || err == nil || w.Get() != "second" {
		t.Fatalf("removed file: changed %v err %v value %q", changed, err, w.Get())
	}
	writeFile(t, p, "third")
	if changed, err := w.Check(); !changed || err != nil || w.Get() != "third" || w.Err() != nil {
		t.Fatalf("fixed file: changed %v err %v value %q", changed, err, w.Get())
	}
}

// Interval 0 reads the files once; a first load that fails is an error.
func TestNoIntervalAndBadStart(t *testing.T) {
	p := filepath.Join(t.TempDir(), "word")
	writeFile(t, p, "first")
	w, err := New("TEST_FILE", []string{p}, 0, nil, loadWord(p))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, p, "second")
	if got := w.Get(); got != "first" {
		t.Fatalf("reloading off: Get = %q", got)
	}
	writeFile(t, p, "two words")
	if _, err := New("TEST_FILE", []string{p}, time.Second, nil, loadWord(p)); err == nil {
		t.Fatal("a bad file at start must be an error")
	}
	if _, err := New("TEST_FILE", []string{filepath.Join(t.TempDir(), "absent")}, time.Second, nil, loadWord(p)); err == nil || !strings.Contains(err.Error(), "TEST_FILE") {
		t.Fatalf("a missing file at start: %v", err)
	}
	if _, err := New("TEST_FILE", []string{p}, -time.Second, nil, loadWord(p)); err == nil {
		t.Fatal("a negative interval must be an error")
	}
}

// selfSigned writes a certificate for "localhost" with common name cn and
// its key, and returns the certificate's DER.
func selfSigned(t *testing.T, dir, cn string) (certFile, keyFile string, der []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		DNSNames: []string{"localhost"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, cn+".crt"), filepath.Join(dir, cn+".key")
	writeFile(t, certFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, keyFile, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
	return certFile, keyFile, der
}

// A server whose GetCertificate reads a watched key pair serves a rotated
// certificate to new handshakes; a certificate whose key does not match
// (the certificate written, the key not yet) keeps the old one served.
func TestRotatedCertificateServedToNewHandshakes(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, oldDER := selfSigned(t, dir, "old")
	w, err := KeyPair("API_TLS_CERT_FILE", certFile, keyFile, time.Nanosecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		c := w.Get()
		return &c, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) { _ = c.(*tls.Conn).Handshake(); c.Close() }(c)
		}
	}()
	served := func() []byte {
		t.Helper()
		c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test reads which certificate is served
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Raw
	}
	if !bytes.Equal(served(), oldDER) {
		t.Fatal("the first certificate is not served")
	}
	newCert, newKey, newDER := selfSigned(t, dir, "new")
	b, _ := os.ReadFile(newCert)
	writeFile(t, certFile, string(b)) // the certificate first: it does not match the old key
	if !bytes.Equal(served(), oldDER) || w.Err() == nil {
		t.Fatalf("a half-rotated pair must keep the old certificate served (err %v)", w.Err())
	}
	b, _ = os.ReadFile(newKey)
	writeFile(t, keyFile, string(b))
	if !bytes.Equal(served(), newDER) {
		t.Fatal("the rotated certificate is not served to a new handshake")
	}
}
