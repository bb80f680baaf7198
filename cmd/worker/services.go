package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	runtimev1 "github.com/dapr/dapr/pkg/proto/runtime/v1"
	dapr "github.com/dapr/go-sdk/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"google.golang.org/grpc"

	"github.com/virtufin/workmanager/activities"
	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/builtin"
	"github.com/virtufin/workmanager/engines/crashjournal"
	"github.com/virtufin/workmanager/engines/dotnet"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/internal/catalog"
	"github.com/virtufin/workmanager/internal/cluster"
	"github.com/virtufin/workmanager/internal/codesource"
	"github.com/virtufin/workmanager/internal/daprconn"
	"github.com/virtufin/workmanager/internal/deadletter"
	"github.com/virtufin/workmanager/internal/delivery"
	"github.com/virtufin/workmanager/internal/dispatch"
	"github.com/virtufin/workmanager/internal/gateway"
	"github.com/virtufin/workmanager/internal/gcpacing"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/health"
	"github.com/virtufin/workmanager/internal/infraevents"
	"github.com/virtufin/workmanager/internal/lifecycleevents"
	"github.com/virtufin/workmanager/internal/metrics"
	"github.com/virtufin/workmanager/internal/metrics/temporalmetrics"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/peeraddr"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/internal/redischeck"
	"github.com/virtufin/workmanager/internal/startstop"
	"github.com/virtufin/workmanager/internal/state"
	"github.com/virtufin/workmanager/internal/tracing"
	"github.com/virtufin/workmanager/internal/workerstats"
	devkit "github.com/virtufin/workmanager/sdk/python"
	"github.com/virtufin/workmanager/services/reconcile"
	"github.com/virtufin/workmanager/workflows"
)

// parts is what the node's services share: each service's Start fills in
// what it makes, for the services started after it (run lists them in
// start order).
type parts struct {
	cfg config
	log *slog.Logger // with trace ids once tracing is on

	// peerKey signs the turns nodes forward to each other (nil:
	// GROUP_LOCK_FORWARD off); peers finds their addresses.
	peerKey func(ctx context.Context) ([]byte, error)
	peers   *peeraddr.Cache

	journal *crashjournal.Journal // nil: no crash journal
	crashes crashjournal.Report

	tr                   *tracing.Tracing
	tp                   trace.TracerProvider // nil: the hot path does not trace
	prop                 propagation.TextMapPropagator
	temporalInterceptors []interceptor.ClientInterceptor

	conn       *grpc.ClientConn
	daprClient dapr.Client

	promReg *prometheus.Registry
	met     *metrics.Metrics
	reg     *engines.Registry
	h       *health.State
	broker  *health.BrokerWatch
	daprPub *publish.Dapr
	cat     *catalog.Catalog
	events  *lifecycleevents.Emitter
	infra   *infraevents.Emitter
	members *cluster.Members
	locks   *grouplock.Locks
	stats   *workerstats.Recorder
	disp    *dispatch.Dispatcher
	n       *node.Node
	gate    *reconcile.MemberGate
	cutOff  context.CancelFunc // ends the hot path's context
	drained bool               // the hot path drained within SHUTDOWN_GRACE

	// Placement (issue 45): the engines that passed their runtime check,
	// the record's store, this node's view of it and the node that follows
	// it, and the placer the placement activities decide with.
	healthy  *placement.Engines
	pstore   *placement.Store
	follower *placement.Follower
	placed   *reconcile.Placed
	placer   *placement.Placer
	started  time.Time
	// planned is closed once the placement workflow planned a round that
	// counts this node (or gave up asking): recovery waits for it.
	planned     chan struct{}
	plannedOnce sync.Once
	// warmed is closed once every engine's runtime check reported: what
	// the node advertises it can run is known.
	warmed chan struct{}

	stopTemporalMetrics func(context.Context) error
	temporalMetrics     client.MetricsHandler
	tc                  client.Client
	acts                *activities.Activities
}

// crashJournal opens the crash journal: what a crash of the node before
// this one left in flight. Closed last: a normal stop is not a crash.
func (p *parts) crashJournal() startstop.Service {
	return startstop.Funcs("crash journal", func(context.Context) error {
		p.journal, p.crashes = openCrashJournal(p.log, p.cfg)
		return nil
	}, func() { _ = p.journal.Close() })
}

// inheritedFiles: what the node's parent left open must not reach worker
// processes.
func (p *parts) inheritedFiles() startstop.Service {
	return startstop.Funcs("inherited files", func(context.Context) error { return sandbox.MarkInheritedCloseOnExec() }, nil)
}

// gcPacing paces the garbage collector by the live heap (internal/
// gcpacing): off with NODE_GC_HEADROOM_BYTES=0 or GOGC set.
func (p *parts) gcPacing() startstop.Service {
	cancel := func() {}
	done := make(chan struct{})
	return startstop.Funcs("gc pacing", func(context.Context) error {
		pacer := gcpacing.New(uint64(p.cfg.GCHeadroomBytes), p.log)
		if pacer == nil {
			close(done)
			return nil
		}
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		go func() { defer close(done); pacer.Run(ctx) }()
		return nil
	}, func() { cancel(); <-done })
}

// tracing sets traces up: on when OTEL_EXPORTER_OTLP_ENDPOINT is set
// (internal/tracing). Stopped (flushed) after everything that traces.
func (p *parts) tracing() startstop.Service {
	var sctx context.Context
	return startstop.Funcs("tracing", func(ctx context.Context) error {
		sctx = ctx
		tr, err := tracing.Setup(ctx, p.log, "workmanager-node", attribute.String("service.instance.id", p.cfg.NodeID))
		if err != nil {
			return err
		}
		p.tr = tr
		if tr.On() {
			p.tp, p.prop = tr.Provider, tr.Propagator
			p.log = slog.New(tracing.LogHandler(p.log.Handler()))
			p.log.Info("tracing on", "exporter", tr.Exporter)
		}
		if p.temporalInterceptors, err = tr.TemporalInterceptors(); err != nil {
			return fmt.Errorf("temporal tracing: %w", err)
		}
		return nil
	}, func() {
		if err := p.tr.Shutdown(sctx, 5*time.Second); err != nil {
			p.log.Warn("traces not flushed", "err", err)
		}
	})
}

// daprConnection is the node's one connection to daprd.
func (p *parts) daprConnection() startstop.Service {
	return startstop.Funcs("dapr connection", func(context.Context) error {
		conn, err := daprconn.Dial(p.cfg.DaprGRPCAddress, daprOptions(p.cfg))
		if err != nil {
			return err
		}
		p.conn, p.daprClient = conn, dapr.NewClientWithConnection(conn)
		return nil
	}, func() { _ = p.conn.Close() })
}

// nodeCore builds the engines, the hot path (dispatcher) and the node.
// Its stop shuts the node down (again: at once after a failed start),
// closes the engines and cuts the hot path off.
func (p *parts) nodeCore() startstop.Service {
	return startstop.Funcs("node", p.build, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.n.Shutdown(sctx)
		if err := builtin.Close(p.reg); err != nil {
			p.log.Warn("closing the engines", "err", err)
		}
		p.cutOff()
	}).StopWithin(10*time.Second + startstop.DefaultStopTimeout)
}

// build wires the engines, the hot path and the node; nothing of it runs
// until the services after nodeCore start.
func (p *parts) build(ctx context.Context) error {
	cfg, log := p.cfg, p.log
	gw := gateway.NewDapr(p.daprClient, cfg.GatewayTimeout)
	gw.Propagator = p.prop

	// One registry for everything /metrics serves: the Go runtime and the
	// process, the node's workmanager_ metrics, the Temporal SDK's.
	p.promReg = prometheus.NewRegistry()
	p.promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	p.met = metrics.New(p.promReg)
	met := p.met

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
		Sandbox: sb, PythonAllowedPackages: cfg.PythonAllowed, WorkerEnv: cfg.WorkerEnv, NativeMaxExtractedBytes: int64(cfg.NativeMaxExtracted), NativeSpareCheckHosts: cfg.NativeSpareChecks,
		DefaultTimeout: cfg.WorkerTimeout, PythonSpinWait: cfg.PythonSpinWait, PythonMaxBatch: cfg.PythonMaxBatch,
		PythonMaxConcurrency: cfg.PythonMaxConcurrency, PythonMaxProcesses: cfg.PythonMaxProcesses, PythonParkAfter: cfg.PythonParkAfter, PythonSpares: cfg.PythonSpares, PythonNoForkServer: !cfg.PythonForkServer,
		Gateway:         gw,
		NativeIsolation: nativeIsolation(cfg.NativeIsolation), NativeHostPath: cfg.NativeHostPath, NativeTempDir: cfg.NativeTempDir,
		NativeMaxAbandonedCalls: cfg.NativeMaxAbandoned, OnProcessRestart: met.EngineRestart, NativeJournal: p.journal,
		MaxOutputs: cfg.MaxOutputs, MaxOutputBytes: cfg.MaxOutputBytes, // the engines' reply limit while reading
		WasmMaxMemoryPages: uint32(cfg.WasmMaxMemoryPages), WasmCacheDir: cfg.WasmCacheDir,
		Dotnet: dotnet.Config{Processes: cfg.DotnetProcesses, MaxProcesses: cfg.DotnetMaxProcesses, ParkAfter: cfg.DotnetParkAfter, Spares: cfg.DotnetSpares, SpareCompilers: cfg.DotnetSpareCompilers, KeptCompilers: cfg.DotnetKeptCompilers, CacheDir: cfg.DotnetCacheDir, Mono: cfg.DotnetMono,
			Compiler: cfg.DotnetCompiler, NoLockdown: !cfg.DotnetLockdown}})
	if err != nil {
		return err
	}
	p.reg = reg
	h := health.New()
	p.h = h
	h.Set("python_devkit", health.Healthy, "virtufin_worker "+devkit.Version()+" at "+devkitDir)
	// What the node advertises it can run: an engine with a runtime check
	// once the check passed, the others at once.
	p.healthy, p.started, p.planned, p.warmed = &placement.Engines{}, time.Now().UTC(), make(chan struct{}), make(chan struct{})
	var warming sync.WaitGroup
	seen := map[string]bool{}
	for _, m := range reg.MIMETypes() {
		if e, err := reg.Lookup(m); err == nil && !seen[e.Info().Name] {
			seen[e.Info().Name] = true
			_, warms := e.(engines.Warmer)
			p.healthy.Set(e.Info().Name, !warms)
			if warms {
				warming.Add(1)
			}
		}
	}
	go func() { warming.Wait(); close(p.warmed) }()
	builtin.Warm(ctx, reg, func(engine, runtime string, err error) {
		defer warming.Done()
		p.healthy.Set(engine, err == nil)
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
	p.broker = health.NewBrokerWatch(h)
	h.GateReadiness(health.Broker, cfg.BrokerReadyGrace)
	var catStore state.Store = state.NewDaprStore(p.daprClient, cfg.StateStore)
	if cfg.TestStateFaultFile != "" {
		catStore = state.WithFaultFile(catStore, cfg.TestStateFaultFile)
	}
	if cfg.TestStateHoldFile != "" {
		log.Error("WM_TEST_STATE_HOLD_FILE is set: catalog writes to the keys it lists wait (a test hook; never in production)")
		catStore = state.WithHoldFile(catStore, cfg.TestStateHoldFile)
	}
	p.cat = catalog.New(catStore)
	if cfg.TestNoFencing {
		log.Error("WM_TEST_UNSAFE_NO_FENCING is set: outputs of grouped calls are published without the fencing-token check (a test hook; never in production)")
	}
	// Outputs, dead letters and lifecycle events: every stream capped at
	// STREAM_MAX_LEN entries (docs/scaling.md, "Stream length").
	p.daprPub = newPublisher(p.daprClient, cfg)
	p.daprPub.Propagator = p.prop
	var pub publish.Publisher = p.daprPub
	if cfg.PublishCoalesce {
		// Concurrent publishes to one topic share a request (a group
		// commit): docs/performance.md, "Outputs published together".
		pub = publish.NewCoalescing(p.daprPub, 0)
	}
	pub = publish.Observed(pub, p.broker.Published)
	p.events = lifecycleevents.NewEmitter(pub)
	// The hot path lives on its own context: SIGTERM first drains it (in-flight
	// messages finish and are acked), and only then is it cut off (hotPath).
	hotCtx, cutOff := context.WithCancel(context.WithoutCancel(ctx))
	p.cutOff = cutOff
	p.infra = infraevents.NewEmitter(log, publish.Observed(p.daprPub.Capped(infraevents.MaxLen), p.broker.Published), cfg.NodeID, 4096)
	p.met.SetInfraDropped(p.infra.Dropped)
	store := state.NewDaprStore(p.daprClient, cfg.StateStore)
	// state.redis counts a key's writes in its ETag: a group lock's hold is
	// then handed over in one write, without reading the record first.
	mdCtx, mdCancel := context.WithTimeout(ctx, 5*time.Second)
	if versions, err := store.DetectVersionETags(mdCtx); err != nil {
		log.Warn("state store component not identified: group locks read before each hand-over", "err", err)
	} else {
		log.Debug("state store component identified", "store", cfg.StateStore, "version_etags", versions)
	}
	mdCancel()
	// Peers' advertised HTTP addresses, for the lock questions and the
	// forwarded turns alike.
	p.peers = peeraddr.New(p.peerAddr)
	// The membership and the placement read what a change's placement
	// reads ahead in one bulk read (placement.Placer.ReadAhead).
	placementStore := state.WithPrefetch(store)
	members := cluster.New(placementStore, cfg.NodeID, 3*cfg.NodeHeartbeat)
	members.LapseMargin = cfg.NodeHeartbeat // as SelfAlive and the gate below
	p.members = members
	// One connection pool to the peers for the lock's questions and news.
	peerClient := grouplock.NotifyClient()
	locks := grouplock.New(store, grouplock.Config{
		// ...and keeps it for GROUP_LOCK_LINGER after the run's last
		// message, for the group's (or the key's) next one.
		Linger: cfg.LockLinger, RetryBase: cfg.LockRetryBase, MaxRetries: cfg.LockMaxRetries, MaxAge: cfg.LockMaxAge, Node: cfg.NodeID,
		// A run of a group's messages on this node holds the lock once
		// (issue 47): one token block per acquisition.
		KeepFor: cfg.LockKeepFor, TokenBlock: int64(max(cfg.LockKeepFor, 1)), KeyTTL: cfg.KeyLockTTL,
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
		// No other live node: no waiter marker to look for.
		Alone: members.SeenAlone,
		OnEvent: func(e grouplock.Event) {
			met.GroupLockEvent(e)
			p.infra.Emit(infraevents.GroupLockTopic, "grouplock."+e.Kind, e)
		},
		// A lingering hold asked for is handed straight to the asking
		// node's holder (one write instead of a release, an acquisition
		// and a Check) when that node is alive and the holder its own.
		HandTo: func(node, holder string) bool {
			n, _, _ := strings.Cut(holder, "/")
			return n == node && members.SeenAlive(node)
		},
		// A group that only lingers on another node is asked for at that
		// node's advertised HTTP address (grouplock.YieldPath).
		Notify: grouplock.HTTPNotifier(peerClient, cfg.NodeID, p.peers),
		// A lock given up for another node's waiter marker is announced
		// to that node (grouplock.FreedPath), which tries at once.
		Tell: grouplock.HTTPTeller(peerClient, p.peers)})
	p.locks = locks
	// Each worker's counts for GetWorker, written every few seconds off the
	// message path (internal/workerstats; statsWriter).
	p.stats = workerstats.NewRecorder(state.NewBatching(store, 0), cfg.NodeID, log)
	dead := deadletter.NewStore(store, cfg.DeadLetterTTL)
	var peers dispatch.Forwarder
	if cfg.LockForward {
		// A grouped message's turn goes to the node that holds its group
		// (internal/dispatch/forward.go), signed with the cluster's peer
		// key; the holder serves it on dispatch.ForwardPath.
		peers = dispatch.HTTPForwarder(&http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8, IdleConnTimeout: 10 * time.Second, DisableCompression: true}},
			p.peers, dead.PeerKey)
		p.peerKey = dead.PeerKey
	}
	p.disp = dispatch.New(hotCtx, log, dispatch.Deps{Sub: dispatch.DaprSubscriber{Client: runtimev1.NewDaprClient(p.conn)}, Pub: pub, Events: p.events,
		Records: delivery.NewStore(state.NewBatching(store, 0), cfg.DeliveryRecordTTL), Locks: locks, DeadLetters: dead,
		Metrics: met, TracerProvider: p.tp, Propagator: p.prop, WorkerStats: p.stats, Peers: peers},
		dispatch.Config{PubSub: cfg.PubSub, NodeID: cfg.NodeID, MaxConcurrency: cfg.MaxConcurrency, QueueDepth: cfg.QueueDepth, QueueWait: cfg.QueueWait,
			MaxAttempts: cfg.MaxAttempts, RetryBackoff: cfg.RetryBackoff, NotRunnableGrace: cfg.NotRunnableGrace,
			MaxEventBytes: cfg.MaxEventBytes, MaxOutputs: cfg.MaxOutputs, MaxOutputBytes: cfg.MaxOutputBytes, Secrets: secretValues(os.Environ()), PanicOn: cfg.TestPanicExtension, UnsafeNoFencing: cfg.TestNoFencing, OnSubscription: p.broker.Subscribed,
			Suspect: suspect(p.journal), ForwardTimeout: cfg.WorkerTimeout + 5*time.Second,
			// A node that is not a cluster member serves nothing (issue 33 item 5).
			// Set below, before anything can attach a worker.
			Serving: func() bool { return p.gate.Serving() }})
	n := node.New(log, p.cat, reg, p.disp, cfg.WorkerTimeout)
	n.SetLogBudget(cfg.LogLinesPerSecond)
	n.SetEvents(p.events) // a worker that fails to load in a reconcile: worker.error
	n.SetReconcileParallelism(cfg.ReconcileParallel)
	p.n = n
	// Placement: the node serves only the topics placed on it (issue 45),
	// from before anything can attach a worker.
	p.pstore = placement.NewStore(placementStore)
	p.follower = &placement.Follower{Self: cfg.NodeID, Store: p.pstore, Alive: members.SeenNodes, Replicas: cfg.PlacementReplicas,
		Labels: cfg.NodeLabels, Log: log}
	p.placed = &reconcile.Placed{Follower: p.follower, Node: n, Log: log}
	p.follower.OnChange = p.placed.Changed
	n.SetPlacement(p.follower)
	p.placer = &placement.Placer{Store: p.pstore, Alive: members.Alive, AliveKeys: []string{cluster.MembersKey}, Seen: members.SeenNodes, Replicas: cfg.PlacementReplicas,
		EngineOf: func(mime string) string {
			if e, err := reg.Lookup(mime); err == nil {
				return e.Info().Name
			}
			return ""
		}}
	quarantineCrashed(ctx, log, p.crashes, p.journal, n, p.cat, p.events, cfg.NodeID)
	p.gate = reconcile.NewMemberGate(log, members, cfg.NodeHeartbeat, n, h)
	return nil
}

// signalLoopStop bounds the wait for each loop that ends with the shutdown
// signal (reconcile, recovery, the lease, the gate, placement): they were
// cancelled when the signal came, and the drain of the hot path that
// follows them must start within the time daprd keeps serving the node
// (deploy/k8s/validate reads this bound and counts the loops: each one
// stuck past its cancel costs this much more).
const signalLoopStop = 500 * time.Millisecond

// redisCheck watches the state store's Redis: eviction or no persistence
// loses delivery records and catalog records (REDIS_CHECK_*;
// docs/scaling.md, "Redis"). Ends with the shutdown signal.
func (p *parts) redisCheck() startstop.Service {
	return startstop.Loop("redis check", func(ctx context.Context) {
		redischeck.Watch(ctx, p.log, p.cfg.RedisCheck, p.h, 10*time.Minute)
	})
}

// brokerProbe publishes a probe now and then, for the broker's health.
// Ends with the shutdown signal.
func (p *parts) brokerProbe() startstop.Service {
	return startstop.Loop("broker probe", func(ctx context.Context) {
		p.broker.Probe(ctx, p.cfg.BrokerProbe, min(p.cfg.BrokerProbe, 5*time.Second), func(ctx context.Context) error {
			return p.daprPub.Probe(ctx, p.cfg.NodeID)
		})
	})
}

// httpServer serves health, metrics and (DEBUG_PPROF) profiles.
func (p *parts) httpServer() startstop.Service {
	var srv *http.Server
	return startstop.Funcs("http server", func(context.Context) error {
		srv = &http.Server{Addr: p.cfg.HTTPAddr, Handler: httpHandler(p.h, p.promReg, p.log, p.cfg.DebugPprof, grouplock.Handler(p.locks), p.forwardHandler()), ReadHeaderTimeout: 5 * time.Second}
		ln, err := net.Listen("tcp", p.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("health listener: %w", err)
		}
		go func() { _ = srv.Serve(ln) }()
		return nil
	}, func() { _ = srv.Close() })
}

// temporalMetricsHandler reports the Temporal SDK's metrics on /metrics.
func (p *parts) temporalMetricsHandler() startstop.Service {
	var sctx context.Context
	return startstop.Funcs("temporal metrics", func(ctx context.Context) error {
		sctx = ctx
		var err error
		p.temporalMetrics, p.stopTemporalMetrics, err = temporalmetrics.Handler(p.promReg, p.log)
		if err != nil {
			return fmt.Errorf("temporal metrics: %w", err)
		}
		return nil
	}, func() { _ = p.stopTemporalMetrics(context.WithoutCancel(sctx)) })
}

// temporalClient dials Temporal (TLS, mTLS, API key: TEMPORAL_TLS*,
// TEMPORAL_API_KEY_FILE).
func (p *parts) temporalClient() startstop.Service {
	return startstop.Funcs("temporal client", func(ctx context.Context) error {
		cfg := p.cfg
		topts := client.Options{HostPort: cfg.TemporalAddress, Namespace: cfg.TemporalNamespace,
			Logger: tlog.NewStructuredLogger(p.log.With("component", "temporal")), MetricsHandler: p.temporalMetrics,
			Interceptors: p.temporalInterceptors}
		cfg.Temporal.Log = p.log // reloads of the TLS files and API key (CREDENTIALS_RELOAD_INTERVAL)
		if err := cfg.Temporal.Apply(&topts); err != nil {
			return err
		}
		tc, err := client.DialContext(ctx, topts)
		if err != nil {
			return fmt.Errorf("temporal: %w", err)
		}
		p.tc = tc
		// A record whose workflow completed (a deleted worker written back) is
		// not served (issue 43 item 1).
		p.n.SetWorkflowCheck(reconcile.WorkflowDeleted(tc))
		p.acts = &activities.Activities{Catalog: p.cat, Node: p.n, Events: p.events, Members: p.members,
			Fetcher: codesource.Fetcher{Policy: cfg.CodeURLs},
			Placement: &activities.Placement{Placer: p.placer, Node: p.placed, MaxMoves: cfg.PlacementMaxMoves,
				Publish: func(kind string, data any) { p.infra.Emit(placement.EventTopic, kind, data) }}}
		return nil
	}, func() { p.tc.Close() })
}

// temporalWorker serves the lifecycle workflows and activities on the
// shared task queue.
func (p *parts) temporalWorker() startstop.Service {
	var w worker.Worker
	return startstop.Funcs("temporal worker", func(context.Context) error {
		// Workflow tasks are polled by an autoscaled number of pollers
		// (the SDK's default is two, of which one polls the shared queue
		// while the other polls the sticky one): the server spreads a
		// queue over partitions, and one poll cannot cover them, so in a
		// burst of creates a first workflow task waited up to 2 s for a
		// poll (docs/performance.md, "Less work a create").
		w = worker.New(p.tc, workflows.TaskQueue, worker.Options{
			WorkflowTaskPollerBehavior: worker.NewPollerBehaviorAutoscaling(worker.PollerBehaviorAutoscalingOptions{}),
		})
		w.RegisterWorkflow(workflows.WorkerWorkflow)
		w.RegisterWorkflow(workflows.RecoveryWorkflow)
		w.RegisterWorkflow(workflows.PlacementWorkflow)
		w.RegisterActivity(p.acts)
		if err := w.Start(); err != nil {
			return fmt.Errorf("temporal worker: %w", err)
		}
		return nil
	}, func() { w.Stop() })
}

// temporalNodeWorker serves this node's own queue, where every lifecycle
// change is applied on it.
func (p *parts) temporalNodeWorker() startstop.Service {
	var nw worker.Worker
	return startstop.Funcs("temporal node worker", func(context.Context) error {
		nw = worker.New(p.tc, workflows.NodeTaskQueue(p.cfg.NodeID), worker.Options{})
		nw.RegisterActivity(p.acts)
		if err := nw.Start(); err != nil {
			return fmt.Errorf("temporal node worker: %w", err)
		}
		return nil
	}, func() { nw.Stop() })
}

// membership joins the cluster (the first heartbeat) and keeps beating.
// Detached from the shutdown signal: on SIGTERM the node stays a member
// (peers do not take its group locks) until it drained and released them;
// its Stop leaves the cluster.
func (p *parts) membership() startstop.Service {
	cfg := p.cfg
	return startstop.Loop("membership", func(ctx context.Context) {
		p.members.Run(ctx, p.log, cfg.NodeHeartbeat)
	}).WithStart(func(ctx context.Context) error {
		p.members.OnBeat = func(alive []string, err error) {
			st := p.disp.Stats()
			p.infra.Emit(infraevents.HeartbeatTopic, "heartbeat", heartbeat{Node: cfg.NodeID, Alive: alive, Healthy: err == nil,
				Workers: st.Workers, Topics: st.Topics, Processed: st.Processed, DeadLettered: st.DeadLettered})
			if err != nil {
				p.h.Set(health.Cluster, health.Degraded, "heartbeat failed: "+err.Error())
				return
			}
			p.h.Set(health.Cluster, health.Healthy, fmt.Sprintf("node %s; live nodes: %s", cfg.NodeID, strings.Join(alive, ", ")))
		}
		if err := p.members.Beat(ctx); err != nil {
			// Not fatal: the next heartbeat joins, and until then reconcile
			// brings changes to this node.
			p.log.Warn("join the cluster", "node_id", cfg.NodeID, "err", err)
		}
		return nil
	}).Detached()
}

// nodeShutdown detaches every worker: no call runs any more and every
// group lock is released (or left to be taken). Only after it may peers
// count the node as gone (membership stops after it).
func (p *parts) nodeShutdown() startstop.Service {
	return startstop.OnStop("node shutdown", func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.n.Shutdown(sctx)
		p.locks.ReleaseIdle(sctx) // holds lingering after their last message
	})
}

// infraEmitter publishes infrastructure events; it stops with the hot
// path, not with the shutdown signal.
func (p *parts) infraEmitter() startstop.Service {
	return startstop.Loop("infra events", func(ctx context.Context) { p.infra.Run(ctx) }).Detached()
}

// statsWriter writes each worker's counts every few seconds; its Stop
// writes the last interval's (bounded: 5 s), before the node shuts down.
func (p *parts) statsWriter() startstop.Service {
	return startstop.Loop("worker stats", func(ctx context.Context) { p.stats.Run(ctx, workerstats.Interval) }).Detached()
}

// hotPath stops the hot path: in-flight messages finish and are acked
// (within SHUTDOWN_GRACE), and only then is its context cut off.
func (p *parts) hotPath() startstop.Service {
	grace := p.cfg.ShutdownGrace
	return startstop.OnStop("hot path", func() {
		p.log.Info("node stopping: draining in-flight messages", "grace", grace)
		dctx, cancel := context.WithTimeout(context.Background(), grace)
		p.drained = p.disp.Drain(dctx)
		cancel()
		if !p.drained {
			p.log.Warn("shutdown grace over: cutting off the calls still running", "grace", grace)
		}
		p.cutOff()
	}).StopWithin(grace + startstop.DefaultStopTimeout)
}

// memberGate fences the node while it is not a cluster member. Ends with
// the shutdown signal.
func (p *parts) memberGate() startstop.Service {
	return startstop.Loop("member gate", func(ctx context.Context) {
		p.gate.Run(ctx, max(p.cfg.NodeHeartbeat/4, 50*time.Millisecond))
	}).StopWithin(signalLoopStop)
}

// recovery runs recovery (or, when it is off, this node's first
// reconcile), tried again until it succeeds: /readyz waits for it.
func (p *parts) recovery() startstop.Service {
	return startstop.Loop("recovery", func(ctx context.Context) {
		// The share this node recovers is the one the placement round that
		// counts it gave (placementWorkflow).
		select {
		case <-p.planned:
		case <-ctx.Done():
			return
		}
		started := time.Now()
		reconcile.RecoverLoop(ctx, p.log, p.tc, p.n, p.h, p.cfg.RecoveryOnStart, p.cfg.ContinueAsNewAfter, 5*time.Second, p.met.RecoveryDone)
		// With recovery on start off: workers come back when RecoverWorkers runs.
		reconcile.AwaitRecovery(ctx, p.log, p.tc, p.n, p.h, started, 2*time.Second)
	}).StopWithin(signalLoopStop)
}

// reconciler reconciles the node with the catalog every RECONCILE_INTERVAL.
func (p *parts) reconciler() startstop.Service {
	return startstop.Loop("reconcile", func(ctx context.Context) {
		reconcile.ReconcileLoop(ctx, p.log, p.n, p.cfg.ReconcileInterval)
	}).StopWithin(signalLoopStop)
}

// temporalLease fences the node when Temporal stays unreachable past
// TEMPORAL_LEASE; /readyz waits for its first check.
func (p *parts) temporalLease() startstop.Service {
	return startstop.Loop("temporal lease", func(ctx context.Context) {
		reconcile.LeaseLoop(ctx, p.log, func(ctx context.Context) error {
			_, err := p.tc.CheckHealth(ctx, &client.CheckHealthRequest{})
			return err
		}, p.n, p.h, p.cfg.TemporalLease)
	}).WithStart(func(context.Context) error {
		p.h.GateReadiness(reconcile.Temporal, p.cfg.TemporalLease)
		return nil
	}).StopWithin(signalLoopStop)
}

// advertisement writes what this node can run and serves (its labels,
// healthy engines, memory, workers) every NODE_HEARTBEAT, for the
// placement workflow and wmctl nodes. Ends with the shutdown signal.
func (p *parts) advertisement() startstop.Service {
	return startstop.Loop("node advertisement", func(ctx context.Context) {
		reconcile.Advertise(ctx, p.log, p.pstore, p.nodeInfo, p.cfg.NodeHeartbeat)
	}).StopWithin(signalLoopStop)
}

// hostMemory is read once: the memory the node advertises.
var hostMemory = sync.OnceValue(placement.HostMemory)

// nodeInfo is what this node advertises now.
func (p *parts) nodeInfo() placement.NodeInfo {
	st := p.disp.Stats()
	healthy := p.healthy.Healthy()
	return placement.NodeInfo{ID: p.cfg.NodeID, Addr: p.cfg.advertiseAddr(), Labels: p.cfg.NodeLabels, Engines: healthy, MIMETypes: p.reg.MIMETypesOf(healthy), MemoryBytes: hostMemory(),
		Workers: st.Workers, Topics: st.Topics, StartedAt: p.started, UpdatedAt: time.Now().UTC()}
}

// placementFollower keeps this node's view of the placement record (read
// every PLACEMENT_INTERVAL, and when the placement workflow says) and
// converges the node to it. Ends with the shutdown signal.
func (p *parts) placementFollower() startstop.Service {
	return startstop.Loop("placement follower", func(ctx context.Context) {
		p.placed.Run(ctx, p.cfg.PlacementInterval)
	}).StopWithin(signalLoopStop)
}

// placementWorkflow starts the cluster's placement workflow if it is not
// running and asks it for a round that counts this node (PlanNow), tried
// again until Temporal answers; planned is closed once it answered, and
// recovery waits for it (at most placementWait): the node then recovers
// the share that round gave it.
func (p *parts) placementWorkflow() startstop.Service {
	return startstop.Loop("placement workflow", func(ctx context.Context) {
		defer p.plannedOnce.Do(func() { close(p.planned) })
		// Planned with what this node can run: its engines' runtime checks
		// in (a .NET check takes seconds) and advertised.
		select {
		case <-p.warmed:
		case <-time.After(placementWait):
		case <-ctx.Done():
			return
		}
		if err := p.pstore.Advertise(ctx, p.nodeInfo(), 0); err != nil {
			p.log.Warn("node advertisement not written", "err", err)
		}
		in := workflows.PlacementInput{Interval: p.cfg.PlacementInterval}
		for wait := time.Second; ; wait = min(2*wait, time.Minute) {
			actx, cancel := context.WithTimeout(ctx, placementWait)
			rev, err := workflows.PlanNow(actx, p.tc, "node "+p.cfg.NodeID+" started", in)
			cancel()
			if err == nil {
				p.log.Info("placement planned with this node", "revision", rev)
				return
			}
			if ctx.Err() != nil {
				return
			}
			p.log.Warn("placement workflow did not plan; trying again", "err", err, "retry_in", wait)
			p.plannedOnce.Do(func() { close(p.planned) }) // recovery does not wait for a Temporal that does not answer
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}).StopWithin(signalLoopStop)
}

// placementWait bounds how long a starting node waits for the placement
// round that counts it before it recovers anyway (following the record,
// or its fallback ranking, as it is).
const placementWait = time.Minute

// peerAddr is the HTTP address node advertises (its placement record), ""
// when it advertises none.
func (p *parts) peerAddr(ctx context.Context, node string) (string, error) {
	infos, err := p.pstore.Nodes(ctx, []string{node})
	if err != nil || len(infos) == 0 {
		return "", err
	}
	return infos[0].Addr, nil
}

// forwardHandler serves the turns peers forward to this node (nil with
// GROUP_LOCK_FORWARD off: not served).
func (p *parts) forwardHandler() http.Handler {
	if p.peerKey == nil {
		return nil
	}
	return dispatch.ForwardHandler(p.disp, p.peerKey)
}
