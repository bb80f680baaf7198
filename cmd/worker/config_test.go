package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/virtufin/workmanager/internal/daprconn"
)

func TestConfigDefaultsAndBadValues(t *testing.T) {
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkerTimeout != 30*time.Second || c.MaxConcurrency != 8 || !c.RecoveryOnStart || c.BrokerProbe != 2*time.Second || c.BrokerReadyGrace != 15*time.Second || c.ReconcileParallel != 4 ||
		c.PythonSpares != 4 || c.DotnetSpares != 4 || c.DotnetSpareCompilers != 2 || c.DotnetKeptCompilers != 2 || c.NativeSpareChecks != 3 {
		t.Fatalf("defaults: %+v", c)
	}
	// Peers reach the node at its HTTP address unless it listens on a
	// wildcard; WORKMANAGER_ADVERTISE_ADDR names it then.
	for _, a := range []struct{ http, advertise, want string }{
		{"127.0.0.1:8080", "", "127.0.0.1:8080"},
		{"0.0.0.0:8080", "", ""},
		{":8080", "", ""},
		{"0.0.0.0:8080", "10.0.0.7:8081", "10.0.0.7:8081"},
		{"0.0.0.0:8080", "10.0.0.7", "10.0.0.7:8080"}, // a pod's IP
		{"0.0.0.0:8080", "fd00::7", "[fd00::7]:8080"},
	} {
		c.HTTPAddr, c.AdvertiseAddr = a.http, a.advertise
		if got := c.advertiseAddr(); got != a.want {
			t.Errorf("HTTP %q, advertised %q: peers reach %q, want %q", a.http, a.advertise, got, a.want)
		}
	}
	for name, tc := range map[string]struct{ env, value, want string }{
		"unparsable":                {"BROKER_PROBE_INTERVAL", "often", `BROKER_PROBE_INTERVAL="often"`},
		"zero probe":                {"BROKER_PROBE_INTERVAL", "0s", "BROKER_PROBE_INTERVAL must be positive"},
		"negative":                  {"BROKER_READY_GRACE", "-1s", "BROKER_READY_GRACE must not be negative"},
		"bad bool":                  {"WORKER_RECOVERY_ON_START", "maybe", `WORKER_RECOVERY_ON_START="maybe"`},
		"no reconcile parallelism":  {"RECONCILE_PARALLELISM", "0", "RECONCILE_PARALLELISM must be 1 to 64, got 0"},
		"stream cap too small":      {"STREAM_MAX_LEN", "500", "STREAM_MAX_LEN must be 0 (the pub/sub component's maxLenApprox applies) or at least 10000 entries, got 500"},
		"temporal cert without tls": {"TEMPORAL_TLS_CERT_FILE", "/c.pem", "TEMPORAL_TLS_CERT_FILE is set but TEMPORAL_TLS is not true"},
		"too many spare runners":    {"PYTHON_SPARE_RUNNERS", "99", "PYTHON_SPARE_RUNNERS must be 0 (none) to 16, got 99"},
		"negative spare hosts":      {"DOTNET_SPARE_HOSTS", "-1", "DOTNET_SPARE_HOSTS must be 0 (none) to 16, got -1"},
		"too many spare compilers":  {"DOTNET_SPARE_COMPILERS", "17", "DOTNET_SPARE_COMPILERS must be 0 (none) to 16, got 17"},
		"negative kept compilers":   {"DOTNET_KEPT_COMPILERS", "-1", "DOTNET_KEPT_COMPILERS must be 0 (none) to 16, got -1"},
		"negative spare checks":     {"NATIVE_SPARE_CHECK_HOSTS", "-2", "NATIVE_SPARE_CHECK_HOSTS must be 0 (none) to 16, got -2"},
		"wildcard advertised":       {"WORKMANAGER_ADVERTISE_ADDR", "0.0.0.0", "WORKMANAGER_ADVERTISE_ADDR: the host of 0.0.0.0:8080 is a wildcard"},
		"advertised empty port":     {"WORKMANAGER_ADVERTISE_ADDR", "node-1:", `WORKMANAGER_ADVERTISE_ADDR: "node-1:" has no port`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// Issue 30, item 7: a call must not outlive its group lock. The default
// lock max age (60 s) is above the default WORKER_TIMEOUT (30 s), and a
// node whose WORKER_TIMEOUT is not below GROUP_LOCK_MAX_AGE_MS refuses to
// start, naming both settings.
func TestWorkerTimeoutMustBeBelowLockMaxAge(t *testing.T) {
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.LockMaxAge != 60*time.Second || c.WorkerTimeout >= c.LockMaxAge {
		t.Fatalf("defaults: GROUP_LOCK_MAX_AGE_MS %v, WORKER_TIMEOUT %v", c.LockMaxAge, c.WorkerTimeout)
	}
	for name, tc := range map[string]struct {
		timeout, maxAgeMs string
		ok                bool
	}{
		"equal":               {"30s", "30000", false},
		"longer":              {"90s", "", false},
		"old default max age": {"", "30000", false},
		"shorter":             {"2s", "3000", true},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.timeout != "" {
				t.Setenv("WORKER_TIMEOUT", tc.timeout)
			}
			if tc.maxAgeMs != "" {
				t.Setenv("GROUP_LOCK_MAX_AGE_MS", tc.maxAgeMs)
			}
			_, err := loadConfig()
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "WORKER_TIMEOUT") || !strings.Contains(err.Error(), "GROUP_LOCK_MAX_AGE_MS") {
				t.Fatalf("got %v, want an error naming WORKER_TIMEOUT and GROUP_LOCK_MAX_AGE_MS", err)
			}
		})
	}
}

func TestSecretValues(t *testing.T) {
	got := secretValues([]string{"DAPR_API_TOKEN=tok-123456", "DB_PASSWORD=hunter22", "AWS_SECRET_ACCESS_KEY=abcdefgh", "SHORT_KEY=abc", "HOME=/root", "PATH=/usr/bin"})
	if strings.Join(got, ",") != "tok-123456,hunter22,abcdefgh" {
		t.Fatalf("secretValues = %v", got)
	}
}

// Issue 30, item 3: the node's connection to daprd takes anything daprd
// may send (up to its max body size, 16 MiB by default), not only what
// MAX_EVENT_BYTES accepts: a 3 MiB event must reach the hot path (to be
// dead-lettered as too_large) and a 3 MiB code body must be readable.
func TestDaprConnectionReceivesDaprdMaxBody(t *testing.T) {
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c.DaprMaxBodyBytes != 16<<20 {
		t.Fatalf("DAPR_MAX_BODY_BYTES default %d", c.DaprMaxBodyBytes)
	}
	big := bytes.Repeat([]byte("x"), 3<<20)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxSendMsgSize(64<<20), grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		if err := st.RecvMsg(&emptypb.Empty{}); err != nil {
			return err
		}
		return st.SendMsg(wrapperspb.Bytes(big))
	}))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := daprconn.Dial(ln.Addr().String(), daprOptions(c))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A bound for a hang, not a timing: under -race on a starved machine a
	// 3 MiB message took over 10 s (CI-like run 31).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got wrapperspb.BytesValue
	if err := conn.Invoke(ctx, "/test.Svc/Big", &emptypb.Empty{}, &got); err != nil {
		t.Fatalf("a 3 MiB message from daprd: %v", err)
	}
	if len(got.Value) != len(big) {
		t.Fatalf("got %d bytes", len(got.Value))
	}
	t.Setenv("DAPR_MAX_BODY_BYTES", "100")
	if _, err := loadConfig(); err == nil || !strings.Contains(err.Error(), "DAPR_MAX_BODY_BYTES") {
		t.Fatalf("DAPR_MAX_BODY_BYTES=100: %v", err)
	}
}
