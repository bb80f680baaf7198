// Command worker runs a WorkManager node: the Temporal worker for lifecycle
// workflows and activities, the Dapr subscriptions of the hot path, the
// engines, and the health endpoints. It only wires packages together.
package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/pprof"

	dapr "github.com/dapr/go-sdk/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/virtufin/workmanager/engines/native"
	"github.com/virtufin/workmanager/internal/daemon"
	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/startstop"
)

func main() {
	daemon.Main("worker node", loadConfig, func(c config) slog.Level { return c.LogLevel }, run)
}

func run(ctx context.Context, log *slog.Logger, cfg config) error {
	p := &parts{cfg: cfg, log: log}
	g := startstop.NewGroup(log, services(p)...)
	if err := g.Start(ctx); err != nil {
		return err
	}
	p.log.Info("node started", "node_id", cfg.NodeID, "http", cfg.HTTPAddr, "temporal", cfg.TemporalAddress, "dapr", cfg.DaprGRPCAddress)
	<-ctx.Done()
	g.Stop()
	p.log.Info("node stopping", "drained", p.drained)
	return nil
}

// services is what runs in the node, in start order; it stops in reverse
// order once the shutdown signal arrives (services.go says what each one
// does).
func services(p *parts) []startstop.Service {
	return []startstop.Service{
		p.crashJournal(),   // first: what a crash of the node before this one left in flight; closed last
		p.inheritedFiles(), // nothing the node's parent left open reaches worker processes
		p.gcPacing(),       // the heap grows by NODE_GC_HEADROOM_BYTES between collections
		p.tracing(),        // flushed after everything that traces stopped
		p.daprConnection(),
		p.nodeCore(), // engines, hot path, node; stop: shut down, engines closed, hot path cut off
		p.redisCheck(),
		p.brokerProbe(),
		p.httpServer(),
		p.temporalMetricsHandler(),
		p.temporalClient(),
		p.temporalWorker(),
		p.temporalNodeWorker(),
		p.membership(),   // detached: the node leaves only after it shut down (next)
		p.nodeShutdown(), // every worker detached and its group locks released
		p.infraEmitter(), // detached: stops with the hot path
		p.statsWriter(),  // detached: the last interval's counts written before the node shuts down
		p.hotPath(),      // stop: drain in-flight messages, then cut the hot path off
		p.memberGate(),
		p.advertisement(),     // what this node can run, for placement
		p.placementFollower(), // this node follows the placement record
		p.placementWorkflow(), // the cluster's placement workflow runs (started, woken)
		p.recovery(),
		p.reconciler(),
		p.temporalLease(),
	}
}

// daprOptions shape the node's one connection to daprd. Its receive limit
// covers whatever daprd may send (daprconn.RecvLimit): an event larger than
// MAX_EVENT_BYTES must reach the node to be dead-lettered as too_large, and
// state reads of code bodies must not fail on size.
func daprOptions(cfg config) daprconn.Options {
	return daprconn.Options{Token: cfg.DaprAPIToken, MaxRecvBytes: daprconn.RecvLimit(cfg.MaxEventBytes, cfg.DaprMaxBodyBytes)}
}

// httpHandler serves the node's health endpoints (/health, /healthz,
// /readyz), its metrics (/metrics, Prometheus text format) and, with
// DEBUG_PPROF, Go's profiles (/debug/pprof/: heap, goroutine, CPU).
func httpHandler(h *health.State, reg *prometheus.Registry, log *slog.Logger, debugPprof bool, locks, forward http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST "+grouplock.YieldPath, locks) // peers asking for a group lock this node only lingers on
	mux.Handle("POST "+grouplock.FreedPath, locks) // peers saying a group lock this node waits for is free
	if forward != nil {
		mux.Handle("POST "+dispatch.ForwardPath, forward) // peers' turns of a group this node holds (signed)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.With("component", "metrics").Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError, // a failing collector costs its metrics, not the scrape
	}))
	if debugPprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index) // heap, goroutine, allocs… by name
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/", h.Handler())
	return mux
}

// heartbeat is the data of a node's heartbeat infrastructure event.
type heartbeat struct {
	Node         string   `json:"node"`
	Alive        []string `json:"alive"`
	Healthy      bool     `json:"healthy"`
	Workers      int      `json:"workers"`
	Topics       int      `json:"topics"`
	Processed    int64    `json:"processed"`
	DeadLettered int64    `json:"dead_lettered"`
}

// nativeIsolation maps NATIVE_ISOLATION ("always" is "process").
func nativeIsolation(s string) native.Isolation {
	if s == "always" {
		return native.IsolationProcess
	}
	return native.Isolation(s)
}

// newPublisher is the node's one Dapr publisher: outputs, dead letters
// and lifecycle events go through it, each publish capping its stream at
// cfg.StreamMaxLen entries (the infra and probe topics use smaller caps
// through Capped and Probe).
func newPublisher(client dapr.Client, cfg config) *publish.Dapr {
	p := publish.NewDapr(client, cfg.PubSub)
	p.MaxLen = cfg.StreamMaxLen
	return p
}
