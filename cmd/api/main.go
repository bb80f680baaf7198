// Command api serves the WorkManager control API (gRPC, with server
// reflection and the standard health service). It only wires packages
// together: the handlers live in services/api.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	dapr "github.com/dapr/go-sdk/client"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/apimetrics"
	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/daemon"
	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/ratelimit"
	"github.com/virtufin/workmanager/internal/redischeck"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tracing"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/services/api"
)

func main() {
	daemon.Main("api", loadConfig, func(c config) slog.Level { return c.LogLevel }, run)
}

func run(ctx context.Context, log *slog.Logger, cfg config) error {
	// Traces: on when OTEL_EXPORTER_OTLP_ENDPOINT is set (internal/tracing).
	tr, err := tracing.Setup(ctx, log, "workmanager-api")
	if err != nil {
		return err
	}
	defer func() {
		if err := tr.Shutdown(ctx, 5*time.Second); err != nil {
			log.Warn("traces not flushed", "err", err)
		}
	}()
	if tr.On() {
		log = slog.New(tracing.LogHandler(log.Handler()))
		log.Info("tracing on", "exporter", tr.Exporter)
	}
	temporalInterceptors, err := tr.TemporalInterceptors()
	if err != nil {
		return fmt.Errorf("temporal tracing: %w", err)
	}
	conn, err := daprconn.Dial(cfg.DaprGRPCAddress, daprconn.Options{Token: cfg.DaprAPIToken})
	if err != nil {
		return fmt.Errorf("dapr connection: %w", err)
	}
	defer conn.Close()
	daprClient := dapr.NewClientWithConnection(conn)
	store := state.NewDaprStore(daprClient, cfg.StateStore)
	cat := catalog.New(store)
	go cat.SweepLoop(ctx, log, cfg.CodeGCGrace)
	topts := client.Options{HostPort: cfg.TemporalAddress, Namespace: cfg.TemporalNamespace,
		Logger: tlog.NewStructuredLogger(log.With("component", "temporal")), Interceptors: temporalInterceptors}
	// TLS, mTLS, API key (TEMPORAL_TLS*, TEMPORAL_API_KEY_FILE), read
	// again when they change (CREDENTIALS_RELOAD_INTERVAL).
	cfg.Temporal.Log = log
	if err := cfg.Temporal.Apply(&topts); err != nil {
		return err
	}
	tc, err := client.DialContext(ctx, topts)
	if err != nil {
		return fmt.Errorf("temporal: %w", err)
	}
	defer tc.Close()

	// Pre-authentication memory: the receive limit is a code-carrying
	// RPC's; connections and streams are bounded; auth's tap refuses calls
	// without valid credentials (JWTs verified) before their message is
	// read, and the transport's guard (under TLS) closes a connection
	// whose client declares a message over its method's limit (small for
	// every method but the code-carrying ones) before gRPC reads it.
	transport := api.Transport{MaxRecvBytes: cfg.MaxCodeBytes + api.MaxRequestOverhead}
	cfg.Auth.WrapCredentials = transport.Credentials
	opts, authn, err := auth.ServerOptions(ctx, cfg.Auth, log)
	if err != nil {
		return err
	}
	// Metrics first, so that calls refused by authentication and the rate
	// limits are counted too (the tap's refusals happen before any
	// interceptor: they are not).
	am := apimetrics.New()
	opts = append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(am.UnaryInterceptor()), grpc.ChainStreamInterceptor(am.StreamInterceptor())}, opts...)
	if cfg.Auth.Off {
		log.Warn("API_AUTH=off: THE CONTROL API ACCEPTS EVERY CALL WITHOUT CREDENTIALS, AS AN ADMIN. Never in production.")
	} else {
		log.Info("api authentication", "methods", authn.Methods(), "tls", cfg.Auth.TLSCertFile != "", "public_health", cfg.Auth.PublicHealth)
	}
	limiter, readLimiter := rateLimits(cfg)
	opts = append(opts, grpc.ChainUnaryInterceptor(limiter.UnaryInterceptor(), readLimiter.UnaryInterceptor()))
	opts = append(opts, transport.ServerOptions()...)
	if tr.On() {
		// One server span per API call (health and reflection left out),
		// continuing the caller's traceparent; the Temporal calls it makes
		// are its children.
		opts = append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tr.Provider),
			otelgrpc.WithPropagators(tr.Propagator), otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
			otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
				return strings.HasPrefix(info.FullMethodName, "/"+pb.WorkManagerService_ServiceDesc.ServiceName+"/")
			}))))
	}
	srv := grpc.NewServer(opts...)
	publisher := publish.NewDapr(daprClient, cfg.PubSub)
	publisher.MaxLen = cfg.StreamMaxLen // replays: docs/scaling.md, "Stream length"
	if tr.On() {
		publisher.Propagator = tr.Propagator
	}
	pb.RegisterWorkManagerServiceServer(srv, api.New(log, tc, cat, engines.BuiltinMIMETypes(),
		api.Options{OperationTimeout: cfg.OperationTimeout, ContinueAsNewAfter: cfg.ContinueAsNewAfter, MaxCodeBytes: cfg.MaxCodeBytes, CodeURLs: cfg.CodeURLs,
			// The dead-letter TTL is recorded in each index by the nodes
			// that add them: the API needs none of its own.
			DeadLetters: deadletter.NewStore(store, 0),
			Deliveries:  delivery.NewStore(store, cfg.DeliveryRecordTTL),
			Publisher:   publisher,
			WorkerStats: store,
			Tenants:     cfg.Tenants,
			// docs/scaling.md, "Sizing and quotas".
			Quotas: cfg.Quotas, QuotaStore: store,
			// Membership, node advertisements, placement record:
			// GetWorker's nodes, ListNodes, DrainNode.
			Cluster: store, NodeTTL: 3 * cfg.NodeHeartbeat}))
	gh := grpchealth.NewServer()
	gh.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	gh.SetServingStatus(pb.WorkManagerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, gh)
	reflection.Register(srv)

	hs := health.NewEmpty()
	// Checks the server's version, then registers the search attributes the
	// worker workflows upsert (docs/scaling.md, "Temporal").
	go func() {
		checkTemporalVersion(ctx, log, tc.WorkflowService(), hs)
		registerSearchAttributes(ctx, log, tc.OperatorService(), cfg.TemporalNamespace, hs, 30*time.Second)
	}()
	// The state store's Redis: eviction or no persistence loses catalog
	// records, code blobs and delivery records (REDIS_CHECK_*;
	// docs/scaling.md, "Redis").
	go redischeck.Watch(ctx, log, cfg.RedisCheck, hs, 10*time.Minute)
	if cfg.HealthAddr != "" {
		if err := serveHealth(ctx, log, cfg, tc, store, hs, am.Handler()); err != nil {
			return err
		}
	}
	ln, err := transport.Listen(cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Addr, err)
	}
	go func() {
		<-ctx.Done()
		gh.Shutdown()
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			srv.Stop()
		}
	}()
	log.Info("api listening", "addr", ln.Addr().String())
	return srv.Serve(ln)
}

// rateLimits are the per-caller limits of changing calls (API_RATE_*) and
// of reading calls (API_READ_RATE_*: a list or a dead-letter listing costs
// state reads too).
func rateLimits(cfg config) (changing, reading *ratelimit.Limiter) {
	return ratelimit.New(ratelimit.Config{PerSecond: cfg.RateLimit, Burst: cfg.RateBurst,
			Methods: auth.ChangingMethods(), Caller: auth.CallerKey}),
		ratelimit.New(ratelimit.Config{PerSecond: cfg.ReadRateLimit, Burst: cfg.ReadRateBurst,
			Methods: auth.ReadingMethods(), Caller: auth.CallerKey,
			What: "reading calls (API_READ_RATE_LIMIT, API_READ_RATE_BURST)"})
}

// serveHealth serves GET /health (and /metrics, apimetrics) on
// cfg.HealthAddr: the authentication mode
// (Degraded, loudly, when it is off) and whether Temporal and the state
// store answer, refreshed every few seconds, and what else reports into hs
// (the search attributes).
func serveHealth(ctx context.Context, log *slog.Logger, cfg config, tc client.Client, store state.Store, hs *health.State, metricsHandler http.Handler) error {
	if cfg.Auth.Off {
		hs.Set("auth", health.Degraded, "API_AUTH=off: every caller is an admin, without credentials. Never in production.")
	} else {
		hs.Set("auth", health.Healthy, "on")
	}
	check := func() {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if _, err := tc.CheckHealth(c, &client.CheckHealthRequest{}); err != nil {
			hs.Set("temporal", health.Unhealthy, err.Error())
		} else {
			hs.Set("temporal", health.Healthy, "")
		}
		if _, err := store.Get(c, "workmanager/health-probe"); err != nil && !errors.Is(err, state.ErrNotFound) {
			hs.Set("state", health.Unhealthy, err.Error())
		} else {
			hs.Set("state", health.Healthy, "")
		}
	}
	check()
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				check()
			}
		}
	}()
	ln, err := net.Listen("tcp", cfg.HealthAddr)
	if err != nil {
		return fmt.Errorf("WORKMANAGER_API_HEALTH_ADDR %s: %w", cfg.HealthAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsHandler)
	mux.Handle("/", hs.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("api health server", "err", err)
		}
	}()
	log.Info("api health listening", "addr", ln.Addr().String())
	return nil
}
