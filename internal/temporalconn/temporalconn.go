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
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
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
}

// maxFileBytes bounds every file read here: certificates, keys and API
// keys are a few KiB.
const maxFileBytes = 1 << 20

// Validate checks the settings' combinations and that every file they
// name can be read and parsed, with errors that name the setting.
func (s Settings) Validate() error {
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

// Apply sets opts' TLS and credentials from s (nothing when TLS is off).
// It validates s first.
func (s Settings) Apply(opts *client.Options) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if !s.TLS {
		return nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: s.ServerName}
	if s.CAFile != "" {
		pool, err := loadCAs(s.CAFile)
		if err != nil {
			return err
		}
		cfg.RootCAs = pool
	}
	if s.CertFile != "" {
		pair := &reloading[tls.Certificate]{files: []string{s.CertFile, s.KeyFile}, load: func() (tls.Certificate, error) { return loadKeyPair(s.CertFile, s.KeyFile) }}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := pair.get()
			return &c, err
		}
	}
	opts.ConnectionOptions.TLS = cfg
	if s.APIKeyFile != "" {
		key := &reloading[string]{files: []string{s.APIKeyFile}, load: func() (string, error) { return readAPIKey(s.APIKeyFile) }}
		opts.Credentials = client.NewAPIKeyDynamicCredentials(func(context.Context) (string, error) { return key.get() })
	}
	return nil
}

func readLimited(setting, path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", setting, path, err)
	}
	if fi.Size() > maxFileBytes {
		return nil, fmt.Errorf("%s %s: %d bytes, more than the %d a certificate or key needs", setting, path, fi.Size(), maxFileBytes)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", setting, path, err)
	}
	return b, nil
}

func loadCAs(path string) (*x509.CertPool, error) {
	b, err := readLimited("TEMPORAL_TLS_CA_FILE", path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("TEMPORAL_TLS_CA_FILE %s: no PEM certificate in it", path)
	}
	return pool, nil
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

// reloading holds what load made from files, and loads it again when one
// of the files' modification time or size changed (checked at most every
// reloadCheck). A failed reload keeps the last good value.
type reloading[T any] struct {
	files   []string
	load    func() (T, error)
	mu      sync.Mutex
	val     T
	ok      bool
	stamp   string
	checked time.Time
}

const reloadCheck = 5 * time.Second

func (r *reloading[T]) get() (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ok && time.Since(r.checked) < reloadCheck {
		return r.val, nil
	}
	r.checked = time.Now()
	var stamp strings.Builder
	for _, f := range r.files {
		if fi, err := os.Stat(f); err == nil {
			fmt.Fprintf(&stamp, "%s/%d/%d;", f, fi.ModTime().UnixNano(), fi.Size())
		}
	}
	if r.ok && stamp.String() == r.stamp {
		return r.val, nil
	}
	v, err := r.load()
	if err != nil {
		if r.ok {
			return r.val, nil
		}
		return v, err
	}
	r.val, r.ok, r.stamp = v, true, stamp.String()
	return v, nil
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
