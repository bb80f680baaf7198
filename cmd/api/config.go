package main

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/codesource"
	"github.com/virtufin/workmanager/internal/credfile"
	"github.com/virtufin/workmanager/internal/envconfig"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/ratelimit"
	"github.com/virtufin/workmanager/internal/tenant"
	"github.com/virtufin/workmanager/services/api"
)

// config is the API's typed configuration, read from the environment.
type config struct {
	NodeHeartbeat time.Duration // NODE_HEARTBEAT: the nodes' (a node silent for 3 counts as gone: ListNodes)
	envconfig.Services
	Addr             string        // WORKMANAGER_API_ADDR
	OperationTimeout time.Duration // WORKMANAGER_OPERATION_TIMEOUT
	// ContinueAsNewAfter: WORKMANAGER_CONTINUE_AS_NEW_AFTER (0: when the server suggests).
	ContinueAsNewAfter int
	// PubSub is the Dapr pub/sub component replayed dead letters are
	// published to: DAPR_PUBSUB (the nodes' variable and default).
	PubSub string
	// StreamMaxLen caps the stream of every topic the API publishes to
	// (replays) at about this many entries: STREAM_MAX_LEN, the nodes'
	// variable and default (0: the component's maxLenApprox).
	StreamMaxLen int
	// DeliveryRecordTTL is how long delivery records are kept (a replay
	// resets one, and writes it with this TTL): DELIVERY_RECORD_TTL, the
	// nodes' variable; set it to the nodes' value.
	DeliveryRecordTTL time.Duration
	LogLevel          slog.Level // LOG_LEVEL

	// Auth is who may call (internal/auth; docs/api.md, "Authentication"):
	// API_AUTH, API_TOKENS_FILE, API_JWT_*, API_TLS_*, API_CLIENT_CA_FILE,
	// API_PUBLIC_HEALTH; CREDENTIALS_RELOAD_INTERVAL, which the Temporal
	// client's files follow too.
	Auth auth.Settings
	// Tenants maps tenants to their workers' topic prefix:
	// TENANT_TOPIC_PREFIXES ("acme=acme.,globex=globex/"; unmapped
	// tenants get "<tenant>.", the default tenant none).
	Tenants tenant.Prefixes
	// RateLimit and RateBurst bound each caller's changing calls
	// (API_RATE_LIMIT per second, 0 off; API_RATE_BURST).
	RateLimit float64
	RateBurst int
	// ReadRateLimit and ReadRateBurst bound each caller's reading calls
	// (API_READ_RATE_LIMIT per second, 0 off; API_READ_RATE_BURST).
	ReadRateLimit float64
	ReadRateBurst int
	// MaxCodeBytes bounds inline code (API_MAX_CODE_BYTES); the gRPC
	// server takes messages that size plus MaxRequestOverhead.
	MaxCodeBytes int
	// HealthAddr serves GET /health (JSON, as the node's: the API's
	// authentication mode and its dependencies) when set:
	// WORKMANAGER_API_HEALTH_ADDR.
	HealthAddr string
	// CodeURLs are the rules URL code sources are checked against at
	// CreateWorker and LoadCode (CODE_URL_*, as on the nodes).
	CodeURLs codesource.Policy
	// CodeGCGrace is how long a code blob no worker references any more
	// is kept (a rollback or a create of the same code within it finds it)
	// before the API collects it: CODE_GC_GRACE, 0 never.
	CodeGCGrace time.Duration
	// Quotas bound the workers CreateWorker admits, per tenant and in
	// all (0: unlimited): QUOTA_WORKERS_PER_TENANT, QUOTA_WORKERS_TOTAL,
	// QUOTA_MEMORY_PER_TENANT_BYTES, QUOTA_MEMORY_TOTAL_BYTES, with the
	// per-engine estimates of QUOTA_WORKER_MEMORY ("mime=bytes,...",
	// over api.DefaultWorkerMemory).
	Quotas api.Quotas
}

func loadConfig() (config, error) {
	r := envconfig.New()
	c := config{
		Services:           r.Services(),
		Addr:               r.String("WORKMANAGER_API_ADDR", "127.0.0.1:50051"),
		OperationTimeout:   r.Duration("WORKMANAGER_OPERATION_TIMEOUT", 60*time.Second),
		ContinueAsNewAfter: r.Int("WORKMANAGER_CONTINUE_AS_NEW_AFTER", 0),
		PubSub:             r.String("DAPR_PUBSUB", "pubsub"),
		StreamMaxLen:       r.Int("STREAM_MAX_LEN", publish.DefaultStreamMaxLen),
		DeliveryRecordTTL:  r.Duration("DELIVERY_RECORD_TTL", 24*time.Hour),
		CodeGCGrace:        r.Duration("CODE_GC_GRACE", 24*time.Hour),
		NodeHeartbeat:      r.Duration("NODE_HEARTBEAT", 5*time.Second),
		LogLevel:           r.LogLevel("LOG_LEVEL"),
		RateLimit:          r.Float("API_RATE_LIMIT", 50),
		RateBurst:          r.Int("API_RATE_BURST", 100),
		ReadRateLimit:      r.Float("API_READ_RATE_LIMIT", 200),
		ReadRateBurst:      r.Int("API_READ_RATE_BURST", 400),
		MaxCodeBytes:       r.Int("API_MAX_CODE_BYTES", api.DefaultMaxCodeBytes),
		HealthAddr:         r.String("WORKMANAGER_API_HEALTH_ADDR", ""),
		CodeURLs:           r.CodeURLs(),
		Quotas: api.Quotas{
			WorkersPerTenant: r.Int("QUOTA_WORKERS_PER_TENANT", 0),
			WorkersTotal:     r.Int("QUOTA_WORKERS_TOTAL", 0),
			MemoryPerTenant:  int64(r.Int("QUOTA_MEMORY_PER_TENANT_BYTES", 0)),
			MemoryTotal:      int64(r.Int("QUOTA_MEMORY_TOTAL_BYTES", 0)),
		},
		Auth: auth.Settings{
			TokensFile: r.String("API_TOKENS_FILE", ""),
			JWT: auth.JWTConfig{JWKSURL: r.String("API_JWT_JWKS_URL", ""), PublicKeyFile: r.String("API_JWT_PUBLIC_KEY_FILE", ""),
				Issuer: r.String("API_JWT_ISSUER", ""), Audience: r.String("API_JWT_AUDIENCE", "")},
			TLSCertFile:  r.String("API_TLS_CERT_FILE", ""),
			TLSKeyFile:   r.String("API_TLS_KEY_FILE", ""),
			ClientCAFile: r.String("API_CLIENT_CA_FILE", ""),
			PublicHealth: r.Bool("API_PUBLIC_HEALTH", false),
			// The tokens file, the TLS files and the Temporal client's
			// files are read again when they change (docs/scaling.md,
			// "Rotating certificates and tokens").
			ReloadInterval: r.Duration("CREDENTIALS_RELOAD_INTERVAL", credfile.DefaultInterval),
		},
	}
	c.Temporal.ReloadInterval = c.Auth.ReloadInterval
	switch mode := strings.ToLower(r.String("API_AUTH", "on")); mode {
	case "on":
	case "off":
		c.Auth.Off = true
	default:
		return c, fmt.Errorf(`API_AUTH must be "on" or "off", got %q`, mode)
	}
	if err := r.Err(); err != nil {
		return c, err
	}
	var err error
	if c.Tenants, err = tenant.ParsePrefixes(r.String("TENANT_TOPIC_PREFIXES", "")); err != nil {
		return c, err
	}
	if c.Quotas.WorkerMemory, err = api.ParseWorkerMemory(r.String("QUOTA_WORKER_MEMORY", "")); err != nil {
		return c, err
	}
	return c, c.validate()
}

func (c config) validate() error {
	switch {
	case c.Addr == "" || c.TemporalAddress == "" || c.DaprGRPCAddress == "" || c.StateStore == "":
		return fmt.Errorf("WORKMANAGER_API_ADDR, TEMPORAL_ADDRESS, DAPR_GRPC_ADDRESS and DAPR_STATESTORE must not be empty")
	case c.ContinueAsNewAfter < 0:
		return fmt.Errorf("WORKMANAGER_CONTINUE_AS_NEW_AFTER must not be negative, got %d", c.ContinueAsNewAfter)
	case c.OperationTimeout <= 0:
		return fmt.Errorf("WORKMANAGER_OPERATION_TIMEOUT must be positive, got %s", c.OperationTimeout)
	case c.PubSub == "":
		return fmt.Errorf("DAPR_PUBSUB must not be empty")
	case c.CodeGCGrace < 0:
		return fmt.Errorf("CODE_GC_GRACE must be 0 (never collect) or positive, got %s", c.CodeGCGrace)
	case c.DeliveryRecordTTL < time.Minute:
		return fmt.Errorf("DELIVERY_RECORD_TTL must be at least 1m (as on the nodes), got %s", c.DeliveryRecordTTL)
	case c.MaxCodeBytes < 1 || c.MaxCodeBytes > codesource.MaxSize:
		return fmt.Errorf("API_MAX_CODE_BYTES must be 1..%d, got %d", codesource.MaxSize, c.MaxCodeBytes)
	}
	if err := c.CodeURLs.Validate(); err != nil {
		return fmt.Errorf("CODE_URL_*: %w", err)
	}
	if err := publish.ValidateStreamMaxLen(c.StreamMaxLen); err != nil {
		return err
	}
	if err := c.Temporal.Validate(); err != nil {
		return err
	}
	if err := c.Quotas.Validate(); err != nil {
		return err
	}
	if err := (ratelimit.Config{PerSecond: c.RateLimit, Burst: c.RateBurst}).Validate(); err != nil {
		return err
	}
	if c.ReadRateLimit < 0 || c.ReadRateLimit > 0 && c.ReadRateBurst < 1 {
		return fmt.Errorf("API_READ_RATE_LIMIT must not be negative (0: no limit) and API_READ_RATE_BURST at least 1, got %g and %d", c.ReadRateLimit, c.ReadRateBurst)
	}
	return c.Auth.Validate()
}
