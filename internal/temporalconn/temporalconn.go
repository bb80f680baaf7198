// Package temporalconn owns how the node and the API reach a Temporal
// frontend beyond the dev server: TLS (a private CA, a server name), mTLS
// client certificates and API keys (Temporal Cloud), read from files that
// are read again when they change (a rotated Secret takes effect without a
// restart), and the idempotent registration of WorkManager's search
// attributes that both the API's start-up and the dev stack run.
package temporalconn

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/virtufin/workmanager/internal/credfile"
)

// Settings are the TEMPORAL_TLS* and TEMPORAL_API_KEY_FILE settings
// (docs/configuration.md, "Temporal"). The zero value is plain gRPC, as
// the dev server speaks.
type Settings struct {
	TLS        bool   // TEMPORAL_TLS: TLS to the frontend (Temporal Cloud, a cluster with TLS)
	CAFile     string // TEMPORAL_TLS_CA_FILE: PEM CAs the frontend's certificate is checked against (empty: the system's)
	CertFile   string // TEMPORAL_TLS_CERT_FILE: PEM client certificate (mTLS), with TEMPORAL_TLS_KEY_FILE
	KeyFile    string // TEMPORAL_TLS_KEY_FILE: its PEM private key
	ServerName string // TEMPORAL_TLS_SERVER_NAME: the name the frontend's certificate must carry (empty: the host of TEMPORAL_ADDRESS)
	APIKeyFile string // TEMPORAL_API_KEY_FILE: a file holding an API key, sent as a bearer token (needs TEMPORAL_TLS)
	// Compression is TEMPORAL_GRPC_COMPRESSION: "none" (the default, ""
	// too) or "gzip", how requests to the frontend are compressed (its
	// answers follow). The SDK's own default is gzip, which costs both
	// sides CPU on every call and poll to save bandwidth WorkManager's
	// small payloads do not need on a cluster network; gzip is for a
	// frontend across a slow link.
	Compression string
	// ReloadInterval is how often the files above are checked for a
	// change and read again (CREDENTIALS_RELOAD_INTERVAL, set by each
	// binary's configuration; 0: read once).
	ReloadInterval time.Duration
	// Log receives the reloads and the changed files that do not load
	// (nil: slog.Default()).
	Log *slog.Logger
}

// Validate checks the settings' combinations and that every file they
// name can be read and parsed, with errors that name the setting.
func (s Settings) Validate() error {
	switch s.Compression {
	case "", CompressionNone, CompressionGzip:
	default:
		return fmt.Errorf("TEMPORAL_GRPC_COMPRESSION must be %q or %q, got %q", CompressionNone, CompressionGzip, s.Compression)
	}
	if !s.TLS {
		for _, f := range []struct{ name, v string }{
			{"TEMPORAL_TLS_CA_FILE", s.CAFile}, {"TEMPORAL_TLS_CERT_FILE", s.CertFile}, {"TEMPORAL_TLS_KEY_FILE", s.KeyFile},
			{"TEMPORAL_TLS_SERVER_NAME", s.ServerName}, {"TEMPORAL_API_KEY_FILE", s.APIKeyFile},
		} {
			if f.v != "" {
				return fmt.Errorf("%s is set but TEMPORAL_TLS is not true: set TEMPORAL_TLS=true (an API key or a client certificate needs TLS to the Temporal frontend)", f.name)
			}
		}
		return nil
	}
	if (s.CertFile == "") != (s.KeyFile == "") {
		return errors.New("TEMPORAL_TLS_CERT_FILE and TEMPORAL_TLS_KEY_FILE go together (mTLS): set both or neither")
	}
	if s.CAFile != "" {
		if _, err := loadCAs(s.CAFile); err != nil {
			return err
		}
	}
	if s.CertFile != "" {
		if _, err := loadKeyPair(s.CertFile, s.KeyFile); err != nil {
			return err
		}
	}
	if s.APIKeyFile != "" {
		if _, err := readAPIKey(s.APIKeyFile); err != nil {
			return err
		}
	}
	return nil
}

// The values of Settings.Compression.
const (
	CompressionNone = "none"
	CompressionGzip = "gzip"
)

// Apply sets opts' compression, TLS and credentials from s (no TLS when
// TLS is off).
// It validates s first. The CA bundle, the client certificate and key and
// the API key are read again when their files change (checked at most
// every s.ReloadInterval, at the next handshake or call): a rotated Secret
// takes effect on new connections and calls without a restart, and a
// changed file that does not load keeps the last good credentials (logged
// as an error).
func (s Settings) Apply(opts *client.Options) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if s.Compression == CompressionGzip {
		opts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionGzip{}
	} else {
		opts.ConnectionOptions.GrpcCompression = &client.GrpcCompressionNone{}
	}
	if !s.TLS {
		return nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.ServerName}
	if s.CAFile != "" {
		cas, err := credfile.CertPool("TEMPORAL_TLS_CA_FILE", s.CAFile, s.ReloadInterval, s.Log)
		if err != nil {
			return err
		}
		// The frontend's chain is verified here against the CAs the file
		// holds now (what crypto/tls would do with RootCAs, which cannot
		// change after the dial).
		name := s.ServerName
		if name == "" {
			name = hostOf(opts.HostPort)
		}
		cfg.InsecureSkipVerify = true //nolint:gosec // verified by VerifyConnection below
		cfg.VerifyConnection = func(cs tls.ConnectionState) error { return verifyServer(cs, cas.Get(), name) }
	}
	if s.CertFile != "" {
		pair, err := credfile.KeyPair("TEMPORAL_TLS_CERT_FILE", s.CertFile, s.KeyFile, s.ReloadInterval, s.Log)
		if err != nil {
			return err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := pair.Get()
			return &c, nil
		}
	}
	opts.ConnectionOptions.TLS = cfg
	if s.APIKeyFile != "" {
		key, err := credfile.New("TEMPORAL_API_KEY_FILE", []string{s.APIKeyFile}, s.ReloadInterval, s.Log, func() (string, error) { return readAPIKey(s.APIKeyFile) })
		if err != nil {
			return err
		}
		opts.Credentials = client.NewAPIKeyDynamicCredentials(func(context.Context) (string, error) { return key.Get(), nil })
	}
	return nil
}

// hostOf is the host of a host:port (the whole of it without a port).
func hostOf(hostPort string) string {
	if h, _, err := net.SplitHostPort(hostPort); err == nil {
		return h
	}
	return hostPort
}

// verifyServer checks the frontend's certificate chain against roots and
// name, as crypto/tls does for a client with RootCAs and ServerName.
func verifyServer(cs tls.ConnectionState, roots *x509.CertPool, name string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("temporal frontend: no certificate presented")
	}
	if cs.ServerName != "" {
		name = cs.ServerName
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: name}); err != nil {
		return fmt.Errorf("temporal frontend certificate (checked against TEMPORAL_TLS_CA_FILE): %w", err)
	}
	return nil
}

func readLimited(setting, path string) ([]byte, error) { return credfile.ReadLimited(setting, path) }

func loadCAs(path string) (*x509.CertPool, error) {
	return credfile.LoadCertPool("TEMPORAL_TLS_CA_FILE", path)
}

func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := readLimited("TEMPORAL_TLS_CERT_FILE", certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := readLimited("TEMPORAL_TLS_KEY_FILE", keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("TEMPORAL_TLS_CERT_FILE %s and TEMPORAL_TLS_KEY_FILE %s: %w", certFile, keyFile, err)
	}
	return pair, nil
}

func readAPIKey(path string) (string, error) {
	b, err := readLimited("TEMPORAL_API_KEY_FILE", path)
	if err != nil {
		return "", err
	}
	key := string(bytes.TrimSpace(b))
	if key == "" || strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("TEMPORAL_API_KEY_FILE %s: want one API key on one line", path)
	}
	return key, nil
}

// SearchAttributes are the custom search attributes WorkManager's worker
// workflows upsert (workflows/worker.go), all Keyword.
var SearchAttributes = []string{"WorkerId", "WorkerTopic", "WorkerGroup", "WorkerStatus", "WorkerTenant"}

// EnsureSearchAttributes registers in namespace the SearchAttributes it
// lacks, through the operator service, and does nothing when all are
// there: safe to run at every start. An attribute registered with another
// type, or a frontend that refuses the registration (Temporal Cloud
// registers them through tcld or its UI, not the operator service), is an
// error that says which attributes are missing and how to add them.
func EnsureSearchAttributes(ctx context.Context, op operatorservice.OperatorServiceClient, namespace string) error {
	list, err := op.ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("listing the search attributes of Temporal namespace %q: %w", namespace, err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	for _, name := range SearchAttributes {
		typ, ok := list.GetCustomAttributes()[name]
		switch {
		case !ok:
			missing[name] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
		case typ != enumspb.INDEXED_VALUE_TYPE_KEYWORD:
			return fmt.Errorf("Temporal namespace %q: search attribute %s is %s, WorkManager needs Keyword: remove it and let the API register it again", namespace, name, typ)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	names := make([]string, 0, len(missing))
	for n := range missing {
		names = append(names, n)
	}
	sort.Strings(names)
	if _, err := op.AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{Namespace: namespace, SearchAttributes: missing}); err != nil {
		// Another API replica may have added them meanwhile.
		if again, lerr := op.ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace}); lerr == nil && hasAll(again.GetCustomAttributes(), names) {
			return nil
		}
		return fmt.Errorf("registering the search attributes %s (Keyword) in Temporal namespace %q: %w; register them yourself (temporal operator search-attribute create --name NAME --type Keyword, or tcld on Temporal Cloud), docs/scaling.md, \"Temporal\"",
			strings.Join(names, ", "), namespace, err)
	}
	return nil
}

func hasAll(attrs map[string]enumspb.IndexedValueType, names []string) bool {
	for _, n := range names {
		if attrs[n] != enumspb.INDEXED_VALUE_TYPE_KEYWORD {
			return false
		}
	}
	return true
}

// MinServerVersion is the oldest Temporal server WorkManager supports:
// the API creates workers with Update-With-Start and changes them with
// workflow Updates, both on by default from 1.27 (checked in 1.27.3's
// dynamic config; 1.25 ships Update-With-Start switched off).
const MinServerVersion = "1.27.0"

// CheckServerVersion asks the frontend its version (GetSystemInfo) and
// returns an error when it is older than MinServerVersion. A version it
// cannot read (empty, not x.y.z) passes: Temporal Cloud need not report one.
func CheckServerVersion(ctx context.Context, ws workflowservice.WorkflowServiceClient) error {
	info, err := ws.GetSystemInfo(ctx, &workflowservice.GetSystemInfoRequest{})
	if err != nil {
		return fmt.Errorf("asking the Temporal frontend its version: %w", err)
	}
	v := info.GetServerVersion()
	got, ok := parseVersion(v)
	oldest, _ := parseVersion(MinServerVersion)
	if ok && compareVersions(got, oldest) < 0 {
		return fmt.Errorf("Temporal server %s is older than %s, the oldest WorkManager supports (Update-With-Start and workflow Updates): upgrade the server (docs/scaling.md, \"Temporal\")", v, MinServerVersion)
	}
	return nil
}

func parseVersion(v string) ([3]int, bool) {
	var out [3]int
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return out, false
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, false
		}
		out[i] = n
	}
	return out, true
}

func compareVersions(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}
