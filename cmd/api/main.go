// Command api serves the WorkManager control API (gRPC, with server
// reflection and the standard health service). It only wires packages
// together: the handlers live in services/api.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	dapr "github.com/dapr/go-sdk/client"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/internal/auth"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/daemon"
	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/state"
	pb "github.com/virtufin/workmanager/proto/workmanager/v1"
	"github.com/virtufin/workmanager/services/api"
)

func main() {
	daemon.Main("api", loadConfig, func(c config) slog.Level { return c.LogLevel }, run)
}

func run(ctx context.Context, log *slog.Logger, cfg config) error {
	conn, err := daprconn.Dial(cfg.DaprGRPCAddress, daprconn.Options{Token: cfg.DaprAPIToken})
	if err != nil {
		return fmt.Errorf("dapr connection: %w", err)
	}
	defer conn.Close()
	daprClient := dapr.NewClientWithConnection(conn)
	store := state.NewDaprStore(daprClient, cfg.StateStore)
	cat := catalog.New(store)
	tc, err := client.DialContext(ctx, client.Options{HostPort: cfg.TemporalAddress, Namespace: cfg.TemporalNamespace,
		Logger: tlog.NewStructuredLogger(log.With("component", "temporal"))})
	if err != nil {
		return fmt.Errorf("temporal: %w", err)
	}
	defer tc.Close()

	opts, authn, err := auth.ServerOptions(ctx, cfg.Auth, log)
	if err != nil {
		return err
	}
	if cfg.Auth.Off {
		log.Warn("API_AUTH=off: THE CONTROL API ACCEPTS EVERY CALL WITHOUT CREDENTIALS, AS AN ADMIN. Never in production.")
	} else {
		log.Info("api authentication", "methods", authn.Methods(), "tls", cfg.Auth.TLSCertFile != "", "public_health", cfg.Auth.PublicHealth)
	}
	srv := grpc.NewServer(opts...)
	pb.RegisterWorkManagerServiceServer(srv, api.New(log, tc, cat, engines.BuiltinMIMETypes(),
		api.Options{OperationTimeout: cfg.OperationTimeout, ContinueAsNewAfter: cfg.ContinueAsNewAfter,
			// The dead-letter TTL is recorded in each index by the nodes
			// that add them: the API needs none of its own.
			DeadLetters: deadletter.NewStore(store, 0),
			Deliveries:  delivery.NewStore(store, cfg.DeliveryRecordTTL),
			Publisher:   publish.NewDapr(daprClient, cfg.PubSub),
			Tenants:     cfg.Tenants}))
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(pb.WorkManagerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Addr, err)
	}
	go func() {
		<-ctx.Done()
		hs.Shutdown()
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
