// Command worker runs a WorkManager node: the Temporal worker for lifecycle
// workflows and activities, the Dapr subscriptions of the hot path, the
// engines, and the health endpoints. It only wires packages together.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	dapr "github.com/dapr/go-sdk/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/engines/builtin"
	"github.com/virtufin/workmanager/engines/dotnet"
	"github.com/virtufin/workmanager/engines/native"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/cluster"
	"github.com/virtufin/workmanager/internal/codesource"
	"github.com/virtufin/workmanager/internal/daemon"
	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/gateway"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/infraevents"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/metrics"
	"github.com/virtufin/workmanager/internal/metrics/temporalmetrics"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/redischeck"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tracing"
	"github.com/virtufin/workmanager/internal/workerstats"
	devkit "github.com/virtufin/workmanager/sdk/python"
	"github.com/virtufin/workmanager/services/reconcile"
	"github.com/virtufin/workmanager/workflows"
)

func main() {
	daemon.Main("worker node", loadConfig, func(c config) slog.Level { return c.LogLevel }, run)
}

func run(ctx context.Context, log *slog.Logger, cfg config) error {
	// First: what a crash of the node before this one left in flight.
	journal, crashes := openCrashJournal(log, cfg)
	defer journal.Close() // last: a normal stop is not a crash
	// What the node's parent left open must not reach worker processes.
	if err := sandbox.MarkInheritedCloseOnExec(); err != nil {
		return err
	}
	// Traces: on when OTEL_EXPORTER_OTLP_ENDPOINT is set (internal/tracing).
	tr, err := tracing.Setup(ctx, log, "workmanager-node", attribute.String("service.instance.id", cfg.NodeID))
	if err != nil {
		return err
	}
	defer func() {
		if err := tr.Shutdown(ctx, 5*time.Second); err != nil {
			log.Warn("traces not flushed", "err", err)
		}
	}()
	var tp trace.TracerProvider // nil: the hot path does not trace
	var prop propagation.TextMapPropagator
	if tr.On() {
		tp, prop = tr.Provider, tr.Propagator
		log = slog.New(tracing.LogHandler(log.Handler()))
		log.Info("tracing on", "exporter", tr.Exporter)
	}
	temporalInterceptors, err := tr.TemporalInterceptors()
	if err != nil {
		return fmt.Errorf("temporal tracing: %w", err)
	}

	conn, err := daprconn.Dial(cfg.DaprGRPCAddress, daprOptions(cfg))
	if err != nil {
		return err
	}
	defer conn.Close()
	daprClient := dapr.NewClientWithConnection(conn)
	gw := gateway.NewDapr(daprClient, cfg.GatewayTimeout)
	gw.Propagator = prop

	// One registry for everything /metrics serves: the Go runtime and the
	// process, the node's workmanager_ metrics, the Temporal SDK's.
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	met := metrics.New(promReg)

	mode, _ := sandbox.ParseMode(cfg.Sandbox) // validated
	sb, err := sandbox.New(ctx, sandbox.Config{Mode: mode, Limits: cfg.SandboxLimits, Writable: cfg.SandboxWritable, Exec: cfg.SandboxExec,
		TmpBytes: cfg.SandboxTmpBytes, ScratchBytes: cfg.SandboxScratchBytes, Log: log})
	if err != nil {
		return err
	}
	devkitDir, err := devkit.Install(cfg.PythonDevKitDir)
	if err != nil {
		return fmt.Errorf("PYTHON_DEVKIT_DIR: %w", err)
	}
	reg, err := builtin.Registry(builtin.Config{Logger: log, PythonProcesses: cfg.PythonProcesses, PythonDevKitDir: devkitDir,
		Sandbox: sb, PythonAllowedPackages: cfg.PythonAllowed, WorkerEnv: cfg.WorkerEnv, NativeMaxExtractedBytes: int64(cfg.NativeMaxExtracted),
		DefaultTimeout: cfg.WorkerTimeout, PythonSpinWait: cfg.PythonSpinWait, PythonMaxBatch: cfg.PythonMaxBatch,
		Gateway:         gw,
		NativeIsolation: nativeIsolation(cfg.NativeIsolation), NativeHostPath: cfg.NativeHostPath, NativeTempDir: cfg.NativeTempDir,
		NativeMaxAbandonedCalls: cfg.NativeMaxAbandoned, OnProcessRestart: met.EngineRestart, NativeJournal: journal,
		MaxOutputs: cfg.MaxOutputs, MaxOutputBytes: cfg.MaxOutputBytes, // the engines' reply limit while reading
		Dotnet: dotnet.Config{Processes: cfg.DotnetProcesses, CacheDir: cfg.DotnetCacheDir, Mono: cfg.DotnetMono,
			Compiler: cfg.DotnetCompiler, NoLockdown: !cfg.DotnetLockdown}})
	if err != nil {
		return err
	}
	h := health.New()
	h.Set("python_devkit", health.Healthy, "virtufin_worker "+devkit.Version()+" at "+devkitDir)
	builtin.Warm(ctx, reg, func(engine, runtime string, err error) {
		if err != nil {
			log.Warn("engine runtime unavailable: its workers will fail to load", "engine", engine, "error", err)
			h.Set(engine, health.Degraded, err.Error())
			return
		}
		h.Set(engine, health.Healthy, runtime)
	})
	if sb.Complete() {
		h.Set("sandbox", health.Healthy, sb.Summary())
	} else {
		h.Set("sandbox", health.Degraded, sb.Summary())
	}
	broker := health.NewBrokerWatch(h)
	h.GateReadiness(health.Broker, cfg.BrokerReadyGrace)
	// The state store's Redis: eviction or no persistence loses delivery
	// records and catalog records (REDIS_CHECK_*; docs/scaling.md, "Redis").
	go redischeck.Watch(ctx, log, cfg.RedisCheck, h, 10*time.Minute)
	var catStore state.Store = state.NewDaprStore(daprClient, cfg.StateStore)
	if cfg.TestStateFaultFile != "" {
		catStore = state.WithFaultFile(catStore, cfg.TestStateFaultFile)
	}
	if cfg.TestStateHoldFile != "" {
		log.Error("WM_TEST_STATE_HOLD_FILE is set: catalog writes to the keys it lists wait (a test hook; never in production)")
		catStore = state.WithHoldFile(catStore, cfg.TestStateHoldFile)
	}
	cat := catalog.New(catStore)
	if cfg.TestNoFencing {
		log.Error("WM_TEST_UNSAFE_NO_FENCING is set: outputs of grouped calls are published without the fencing-token check (a test hook; never in production)")
	}
	// Outputs, dead letters and lifecycle events: every stream capped at
	// STREAM_MAX_LEN entries (docs/scaling.md, "Stream length").
	daprPub := newPublisher(daprClient, cfg)
	daprPub.Propagator = prop
	pub := publish.Observed(daprPub, broker.Published)
	events := lifecycleevents.NewEmitter(pub)
	// The hot path lives on its own context: SIGTERM first drains it (in-flight
	// messages finish and are acked), and only then is it cut off.
	hotCtx, cutOff := context.WithCancel(context.WithoutCancel(ctx))
	defer cutOff()
	infra := infraevents.NewEmitter(log, publish.Observed(daprPub.Capped(infraevents.MaxLen), broker.Published), cfg.NodeID, 4096)
	go infra.Run(hotCtx)
	store := state.NewDaprStore(daprClient, cfg.StateStore)
	members := cluster.New(store, cfg.NodeID, 3*cfg.NodeHeartbeat)
	members.LapseMargin = cfg.NodeHeartbeat // as SelfAlive and the gate below
	// Set once the node exists, before anything can attach a worker.
	var gate *reconcile.MemberGate
	locks := grouplock.New(store, grouplock.Config{RetryBase: cfg.LockRetryBase, MaxRetries: cfg.LockMaxRetries, MaxAge: cfg.LockMaxAge, Node: cfg.NodeID,
		HolderAlive: func(holder string) bool { node, _, _ := strings.Cut(holder, "/"); return members.SeenAlive(node) },
		// That view is as old as this node's last heartbeat: read the
		// membership again before taking a lock from a node counted gone.
		ConfirmGone: func(ctx context.Context, holder string) (bool, error) {
			node, _, _ := strings.Cut(holder, "/")
			alive, err := members.AliveNow(ctx, node)
			return !alive, err
		},
		// Peers take the locks of a node they count as gone: past two
		// missed heartbeats, and for two heartbeats after a lapse ends
		// (until every peer has seen it back), Check reads the store
		// before every output.
		SelfAlive: func() bool { return members.Settled(cfg.NodeHeartbeat, 2*cfg.NodeHeartbeat) },
		// A Check's store answer that arrives after a lapse (the node
		// paused with it unread) is not acted on.
		AliveSince: func(t time.Time) bool { return members.MemberSince(cfg.NodeHeartbeat, t) },
		OnEvent: func(e grouplock.Event) {
			met.GroupLockEvent(e)
			infra.Emit(infraevents.GroupLockTopic, "grouplock."+e.Kind, e)
		}})
	// Each worker's counts for GetWorker, written every few seconds off the
	// message path (internal/workerstats).
	stats := workerstats.NewRecorder(state.NewBatching(store, 0), cfg.NodeID, log)
	statsDone := make(chan struct{})
	go func() { defer close(statsDone); stats.Run(hotCtx, workerstats.Interval) }()
	disp := dispatch.New(hotCtx, log, dispatch.Deps{Sub: dispatch.DaprSubscriber{Client: runtimev1.NewDaprClient(conn)}, Pub: pub, Events: events,
		Records: delivery.NewStore(state.NewBatching(store, 0), cfg.DeliveryRecordTTL), Locks: locks, DeadLetters: deadletter.NewStore(store, cfg.DeadLetterTTL),
		Metrics: met, TracerProvider: tp, Propagator: prop, WorkerStats: stats},
		dispatch.Config{PubSub: cfg.PubSub, NodeID: cfg.NodeID, MaxConcurrency: cfg.MaxConcurrency, QueueDepth: cfg.QueueDepth, QueueWait: cfg.QueueWait,
			MaxAttempts: cfg.MaxAttempts, RetryBackoff: cfg.RetryBackoff, NotRunnableGrace: cfg.NotRunnableGrace,
			MaxEventBytes: cfg.MaxEventBytes, MaxOutputs: cfg.MaxOutputs, MaxOutputBytes: cfg.MaxOutputBytes, Secrets: secretValues(os.Environ()), PanicOn: cfg.TestPanicExtension, UnsafeNoFencing: cfg.TestNoFencing, OnSubscription: broker.Subscribed,
			Suspect: suspect(journal),
			// A node that is not a cluster member serves nothing (issue 33 item 5).
			Serving: func() bool { return gate.Serving() }})
	go broker.Probe(ctx, cfg.BrokerProbe, min(cfg.BrokerProbe, 5*time.Second), func(ctx context.Context) error {
		return daprPub.Probe(ctx, cfg.NodeID)
	})
	n := node.New(log, cat, reg, disp, cfg.WorkerTimeout)
	n.SetLogBudget(cfg.LogLinesPerSecond)
	n.SetReconcileParallelism(cfg.ReconcileParallel)
	quarantineCrashed(ctx, log, crashes, journal, n, cat, events, cfg.NodeID)
	gate = reconcile.NewMemberGate(log, members, cfg.NodeHeartbeat, n, h)
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		n.Shutdown(sctx)
		if err := builtin.Close(reg); err != nil {
			log.Warn("closing the engines", "err", err)
		}
	}()

	srv := &http.Server{Addr: cfg.HTTPAddr, Handler: httpHandler(h, promReg, log, cfg.DebugPprof), ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("health listener: %w", err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	temporalMetrics, stopTemporalMetrics, err := temporalmetrics.Handler(promReg, log)
	if err != nil {
		return fmt.Errorf("temporal metrics: %w", err)
	}
	defer func() { _ = stopTemporalMetrics(context.WithoutCancel(ctx)) }()
	topts := client.Options{HostPort: cfg.TemporalAddress, Namespace: cfg.TemporalNamespace,
		Logger: tlog.NewStructuredLogger(log.With("component", "temporal")), MetricsHandler: temporalMetrics,
		Interceptors: temporalInterceptors}
	// TLS, mTLS, API key (TEMPORAL_TLS*, TEMPORAL_API_KEY_FILE).
	if err := cfg.Temporal.Apply(&topts); err != nil {
		return err
	}
	tc, err := client.DialContext(ctx, topts)
	if err != nil {
		return fmt.Errorf("temporal: %w", err)
	}
	defer tc.Close()
	// A record whose workflow completed (a deleted worker written back) is
	// not served (issue 43 item 1).
	n.SetWorkflowCheck(reconcile.WorkflowDeleted(tc))
	acts := &activities.Activities{Catalog: cat, Node: n, Events: events, Members: members,
		Fetcher: codesource.Fetcher{Policy: cfg.CodeURLs}}
	w := worker.New(tc, workflows.TaskQueue, worker.Options{})
	w.RegisterWorkflow(workflows.WorkerWorkflow)
	w.RegisterWorkflow(workflows.RecoveryWorkflow)
	w.RegisterActivity(acts)
	if err := w.Start(); err != nil {
		return fmt.Errorf("temporal worker: %w", err)
	}
	defer w.Stop()
	// This node's own queue, where every lifecycle change is applied on it.
	nw := worker.New(tc, workflows.NodeTaskQueue(cfg.NodeID), worker.Options{})
	nw.RegisterActivity(acts)
	if err := nw.Start(); err != nil {
		return fmt.Errorf("temporal node worker: %w", err)
	}
	defer nw.Stop()
	members.OnBeat = func(alive []string, err error) {
		st := disp.Stats()
		infra.Emit(infraevents.HeartbeatTopic, "heartbeat", heartbeat{Node: cfg.NodeID, Alive: alive, Healthy: err == nil,
			Workers: st.Workers, Topics: st.Topics, Processed: st.Processed, DeadLettered: st.DeadLettered})
		if err != nil {
			h.Set(health.Cluster, health.Degraded, "heartbeat failed: "+err.Error())
			return
		}
		h.Set(health.Cluster, health.Healthy, fmt.Sprintf("node %s; live nodes: %s", cfg.NodeID, strings.Join(alive, ", ")))
	}
	if err := members.Beat(ctx); err != nil {
		// Not fatal: the next heartbeat joins, and until then reconcile
		// brings changes to this node.
		log.Warn("join the cluster", "node_id", cfg.NodeID, "err", err)
	}
	// Not the signal's context: on SIGTERM the node stays a member (peers
	// do not take its group locks) until it drained and released them.
	mctx, leave := context.WithCancel(context.WithoutCancel(ctx))
	left := make(chan struct{})
	go func() { members.Run(mctx, log, cfg.NodeHeartbeat); close(left) }()
	go gate.Run(ctx, max(cfg.NodeHeartbeat/4, 50*time.Millisecond))
	defer func() { leave(); <-left }() // leave before the connections close
	log.Info("node started", "node_id", cfg.NodeID, "http", cfg.HTTPAddr, "temporal", cfg.TemporalAddress, "dapr", cfg.DaprGRPCAddress)

	// Recovery (or, when it is off, this node's first reconcile), tried
	// again until it succeeds: /readyz waits for it.
	go reconcile.RecoverLoop(ctx, log, tc, n, h, cfg.RecoveryOnStart, cfg.ContinueAsNewAfter, 5*time.Second, met.RecoveryDone)
	go reconcile.ReconcileLoop(ctx, log, n, cfg.ReconcileInterval)
	h.GateReadiness(reconcile.Temporal, cfg.TemporalLease)
	go reconcile.LeaseLoop(ctx, log, func(ctx context.Context) error {
		_, err := tc.CheckHealth(ctx, &client.CheckHealthRequest{})
		return err
	}, n, h, cfg.TemporalLease)
	<-ctx.Done()
	log.Info("node stopping: draining in-flight messages", "grace", cfg.ShutdownGrace)
	dctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	drained := disp.Drain(dctx)
	cancel()
	if !drained {
		log.Warn("shutdown grace over: cutting off the calls still running", "grace", cfg.ShutdownGrace)
	}
	cutOff()
	<-statsDone // the last interval's counts written (bounded: 5 s)
	// Every worker detached: no call runs any more and every group lock is
	// released (or left to be taken). Only now may peers count the node as
	// gone.
	sctx, cancelShutdown := context.WithTimeout(context.Background(), 10*time.Second)
	n.Shutdown(sctx)
	cancelShutdown()
	leave()
	<-left
	log.Info("node stopping", "drained", drained)
	return nil
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
func httpHandler(h *health.State, reg *prometheus.Registry, log *slog.Logger, debugPprof bool) http.Handler {
	mux := http.NewServeMux()
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
