package temporalconn_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"

	"github.com/virtufin/workmanager/internal/devstack"
	"github.com/virtufin/workmanager/internal/temporalconn"
)

func write(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Bad settings fail with errors that name the setting and say what to do.
func TestValidateNamesTheSetting(t *testing.T) {
	f, err := devstack.DevTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "absent.pem")
	for name, tc := range map[string]struct {
		s    temporalconn.Settings
		want string
	}{
		"key without TLS":     {temporalconn.Settings{APIKeyFile: write(t, "k", "secret")}, "TEMPORAL_API_KEY_FILE is set but TEMPORAL_TLS is not true"},
		"CA without TLS":      {temporalconn.Settings{CAFile: f.CA}, "TEMPORAL_TLS_CA_FILE is set but TEMPORAL_TLS is not true"},
		"cert without key":    {temporalconn.Settings{TLS: true, CertFile: f.ClientCert}, "TEMPORAL_TLS_CERT_FILE and TEMPORAL_TLS_KEY_FILE go together"},
		"key without cert":    {temporalconn.Settings{TLS: true, KeyFile: f.ClientKey}, "TEMPORAL_TLS_CERT_FILE and TEMPORAL_TLS_KEY_FILE go together"},
		"unreadable CA":       {temporalconn.Settings{TLS: true, CAFile: missing}, "TEMPORAL_TLS_CA_FILE " + missing},
		"CA not PEM":          {temporalconn.Settings{TLS: true, CAFile: write(t, "ca", "hello")}, "no PEM certificate"},
		"mismatched key pair": {temporalconn.Settings{TLS: true, CertFile: f.ClientCert, KeyFile: f.ServerKey}, "TEMPORAL_TLS_CERT_FILE " + f.ClientCert + " and TEMPORAL_TLS_KEY_FILE"},
		"unreadable API key":  {temporalconn.Settings{TLS: true, APIKeyFile: missing}, "TEMPORAL_API_KEY_FILE " + missing},
		"empty API key":       {temporalconn.Settings{TLS: true, APIKeyFile: write(t, "k", " \n")}, "want one API key on one line"},
	} {
		t.Run(name, func(t *testing.T) {
			var opts client.Options
			if err := tc.s.Apply(&opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	var opts client.Options
	if err := (temporalconn.Settings{}).Apply(&opts); err != nil || opts.ConnectionOptions.TLS != nil || opts.Credentials != nil {
		t.Fatalf("plain settings: %v, %+v", err, opts)
	}
}

// Apply builds a TLS configuration with the CA check, the client
// certificate and the server name, and API key credentials.
func TestApplyBuildsTLSAndCredentials(t *testing.T) {
	f, err := devstack.DevTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var opts client.Options
	s := temporalconn.Settings{TLS: true, CAFile: f.CA, CertFile: f.ClientCert, KeyFile: f.ClientKey, ServerName: "frontend.example", APIKeyFile: write(t, "key", "abc123\n")}
	if err := s.Apply(&opts); err != nil {
		t.Fatal(err)
	}
	cfg := opts.ConnectionOptions.TLS
	// The CAs are checked by VerifyConnection (they are read again when
	// the file changes), not by RootCAs.
	if cfg == nil || cfg.VerifyConnection == nil || cfg.ServerName != "frontend.example" || cfg.GetClientCertificate == nil || opts.Credentials == nil {
		t.Fatalf("options: %+v", opts)
	}
	c, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || len(c.Certificate) == 0 {
		t.Fatalf("client certificate: %v", err)
	}
	leaf, _ := x509.ParseCertificate(c.Certificate[0])
	if leaf.Subject.CommonName != "dev" {
		t.Fatalf("client certificate for %q", leaf.Subject.CommonName)
	}
}

// frontend is a fake Temporal frontend: it answers GetSystemInfo (what the
// SDK's dial calls) and keeps the authorization header it was sent.
type frontend struct {
	workflowservice.UnimplementedWorkflowServiceServer
	mu      sync.Mutex
	auth    []string
	version string
}

func (f *frontend) GetSystemInfo(ctx context.Context, _ *workflowservice.GetSystemInfoRequest) (*workflowservice.GetSystemInfoResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	f.auth = append(f.auth, md.Get("authorization")...)
	f.mu.Unlock()
	return &workflowservice.GetSystemInfoResponse{ServerVersion: f.version}, nil
}

// A client made with Apply dials a frontend that requires TLS and a client
// certificate from the CA, and sends the API key as a bearer token.
func TestDialTLSFrontendWithClientCertificateAndAPIKey(t *testing.T) {
	f, err := devstack.DevTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	serverPair, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(f.CA)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{serverPair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})))
	fe := &frontend{}
	workflowservice.RegisterWorkflowServiceServer(srv, fe)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	dial := func(s temporalconn.Settings) error {
		opts := client.Options{HostPort: ln.Addr().String(), Namespace: "default"}
		if err := s.Apply(&opts); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := client.DialContext(ctx, opts)
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(temporalconn.Settings{TLS: true, CAFile: f.CA, ServerName: "localhost", CertFile: f.ClientCert, KeyFile: f.ClientKey,
		APIKeyFile: write(t, "key", "abc123")}); err != nil {
		t.Fatalf("dial with mTLS and an API key: %v", err)
	}
	fe.mu.Lock()
	got := append([]string(nil), fe.auth...)
	fe.mu.Unlock()
	if len(got) == 0 || got[0] != "Bearer abc123" {
		t.Fatalf("authorization headers %q, want Bearer abc123", got)
	}
	// Without the client certificate the frontend refuses the handshake.
	if err := dial(temporalconn.Settings{TLS: true, CAFile: f.CA, ServerName: "localhost"}); err == nil {
		t.Fatal("dial without a client certificate succeeded")
	}
}

// operator is a fake operator service holding one namespace's attributes.
type operator struct {
	operatorservice.OperatorServiceClient
	attrs  map[string]enumspb.IndexedValueType
	adds   int
	addErr error
}

func (o *operator) ListSearchAttributes(context.Context, *operatorservice.ListSearchAttributesRequest, ...grpc.CallOption) (*operatorservice.ListSearchAttributesResponse, error) {
	return &operatorservice.ListSearchAttributesResponse{CustomAttributes: o.attrs}, nil
}

func (o *operator) AddSearchAttributes(_ context.Context, req *operatorservice.AddSearchAttributesRequest, _ ...grpc.CallOption) (*operatorservice.AddSearchAttributesResponse, error) {
	o.adds++
	if o.addErr != nil {
		return nil, o.addErr
	}
	for k, v := range req.GetSearchAttributes() {
		o.attrs[k] = v
	}
	return &operatorservice.AddSearchAttributesResponse{}, nil
}

// EnsureSearchAttributes adds the missing ones, does nothing the second
// time, and reports a refusal or a wrong type with what to do.
func TestEnsureSearchAttributes(t *testing.T) {
	ctx := context.Background()
	op := &operator{attrs: map[string]enumspb.IndexedValueType{"WorkerId": enumspb.INDEXED_VALUE_TYPE_KEYWORD}}
	for i := 0; i < 2; i++ {
		if err := temporalconn.EnsureSearchAttributes(ctx, op, "wm"); err != nil {
			t.Fatal(err)
		}
	}
	if op.adds != 1 || len(op.attrs) != len(temporalconn.SearchAttributes) {
		t.Fatalf("%d adds, attributes %v", op.adds, op.attrs)
	}
	refused := &operator{attrs: map[string]enumspb.IndexedValueType{}, addErr: errors.New("PermissionDenied")}
	if err := temporalconn.EnsureSearchAttributes(ctx, refused, "wm"); err == nil || !strings.Contains(err.Error(), "WorkerGroup, WorkerId, WorkerStatus, WorkerTenant, WorkerTopic") ||
		!strings.Contains(err.Error(), "register them yourself") {
		t.Fatalf("refused: %v", err)
	}
	wrong := &operator{attrs: map[string]enumspb.IndexedValueType{"WorkerTopic": enumspb.INDEXED_VALUE_TYPE_TEXT}}
	if err := temporalconn.EnsureSearchAttributes(ctx, wrong, "wm"); err == nil || !strings.Contains(err.Error(), "WorkerTopic is Text") {
		t.Fatalf("wrong type: %v", err)
	}
}

// versioned is a workflow service client that reports a server version.
type versioned struct {
	workflowservice.WorkflowServiceClient
	version string
}

func (v versioned) GetSystemInfo(context.Context, *workflowservice.GetSystemInfoRequest, ...grpc.CallOption) (*workflowservice.GetSystemInfoResponse, error) {
	return &workflowservice.GetSystemInfoResponse{ServerVersion: v.version}, nil
}

// A server older than MinServerVersion is refused with what to do; one
// that reports no readable version passes.
func TestCheckServerVersion(t *testing.T) {
	for v, want := range map[string]string{
		"1.29.1": "", "1.27.0": "", "v1.30.0-rc.1": "", "": "", "cloud": "",
		"1.26.2": "Temporal server 1.26.2 is older than 1.27.0", "1.9.10": "older than 1.27.0",
	} {
		err := temporalconn.CheckServerVersion(context.Background(), versioned{version: v})
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("%q: got %v, want %q", v, err, want)
		}
	}
}

// payloads is a gRPC server stats handler that records the requests'
// sizes as received: compressed and not.
type payloads struct {
	mu  sync.Mutex
	got []*stats.InPayload
}

func (p *payloads) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context   { return ctx }
func (p *payloads) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (p *payloads) HandleConn(context.Context, stats.ConnStats)                       {}
func (p *payloads) HandleRPC(_ context.Context, s stats.RPCStats) {
	if in, ok := s.(*stats.InPayload); ok {
		p.mu.Lock()
		p.got = append(p.got, in)
		p.mu.Unlock()
	}
}

// TEMPORAL_GRPC_COMPRESSION: requests go uncompressed by default (the
// SDK's own default is gzip), gzip when asked; anything else is refused
// naming the setting.
func TestCompressionSetting(t *testing.T) {
	var opts client.Options
	if err := (temporalconn.Settings{Compression: "zstd"}).Apply(&opts); err == nil || !strings.Contains(err.Error(), "TEMPORAL_GRPC_COMPRESSION") {
		t.Fatalf("compression zstd: %v, want an error naming TEMPORAL_GRPC_COMPRESSION", err)
	}
	for _, tc := range []struct {
		setting    string
		compressed bool
	}{{"", false}, {temporalconn.CompressionNone, false}, {temporalconn.CompressionGzip, true}} {
		t.Run("compression="+tc.setting, func(t *testing.T) {
			rec := &payloads{}
			srv := grpc.NewServer(grpc.StatsHandler(rec))
			workflowservice.RegisterWorkflowServiceServer(srv, &frontend{})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = srv.Serve(ln) }()
			defer srv.Stop()
			opts := client.Options{HostPort: ln.Addr().String(), Namespace: "default"}
			if err := (temporalconn.Settings{Compression: tc.setting}).Apply(&opts); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := client.DialContext(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			// A request with a body (the fake answers Unimplemented).
			_, _ = c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: "default"})
			c.Close()
			rec.mu.Lock()
			defer rec.mu.Unlock()
			bodies := 0
			for _, in := range rec.got {
				if in.Length == 0 {
					continue // gRPC sends an empty body as it is
				}
				bodies++
				if compressed := in.CompressedLength != in.Length; compressed != tc.compressed {
					t.Fatalf("a request of %d bytes arrived as %d: compressed %v, want %v", in.Length, in.CompressedLength, compressed, tc.compressed)
				}
			}
			if bodies == 0 {
				t.Fatal("no request with a body reached the frontend")
			}
		})
	}
}
