package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/virtufin/workmanager/engines/crashjournal"
	"github.com/virtufin/workmanager/engines/dotnet"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/wasm"
	"github.com/virtufin/workmanager/internal/codesource"
	"github.com/virtufin/workmanager/internal/credfile"
	"github.com/virtufin/workmanager/internal/envconfig"
	"github.com/virtufin/workmanager/internal/gcpacing"
	"github.com/virtufin/workmanager/internal/grouplock"
	"github.com/virtufin/workmanager/internal/node"
	"github.com/virtufin/workmanager/internal/placement"
	"github.com/virtufin/workmanager/internal/publish"
	"github.com/virtufin/workmanager/workflows"
)

// config is the node's typed configuration, read from the environment.
type config struct {
	envconfig.Services
	HTTPAddr              string            // WORKMANAGER_HTTP_ADDR
	AdvertiseAddr         string            // WORKMANAGER_ADVERTISE_ADDR: the HTTP address (or host: WORKMANAGER_HTTP_ADDR's port) peers reach this node at (group lock hand-overs)
	PubSub                string            // DAPR_PUBSUB
	StreamMaxLen          int               // STREAM_MAX_LEN: entries each stream the node publishes to keeps, about (0: the component's maxLenApprox)
	PublishCoalesce       bool              // PUBLISH_COALESCE: concurrent publishes to one topic go out as one bulk request (publish.Coalescing)
	RecoveryOnStart       bool              // WORKER_RECOVERY_ON_START
	ContinueAsNewAfter    int               // WORKMANAGER_CONTINUE_AS_NEW_AFTER: given to the worker workflows recovery starts (as the API's)
	MaxConcurrency        int               // WORKER_MAX_CONCURRENCY
	WorkerTimeout         time.Duration     // WORKER_TIMEOUT
	PythonProcesses       int               // PYTHON_PROCESSES
	PythonSpinWait        time.Duration     // PYTHON_SPIN_WAIT (negative: never spin)
	PythonMaxBatch        int               // PYTHON_MAX_BATCH (1: no batches)
	PythonMaxConcurrency  int               // PYTHON_MAX_CONCURRENCY: events an async def worker runs at once (per worker: max_concurrency)
	PythonMaxProcesses    int               // PYTHON_MAX_PROCESSES: runners a plain def worker gets on demand (per worker: max_processes)
	PythonParkAfter       time.Duration     // PYTHON_PARK_AFTER: stop an idle worker's runners after this long without an event (0: never)
	PythonSpares          int               // PYTHON_SPARE_RUNNERS: runners kept started ahead of need for the next create, start or reload (0: none)
	PythonForkServer      bool              // PYTHON_FORK_SERVER: fork runners from a fork server where the sandbox allows it (false: every runner through the sandbox's programs)
	ReconcileInterval     time.Duration     // RECONCILE_INTERVAL (0 disables)
	ReconcileParallel     int               // RECONCILE_PARALLELISM: workers a reconcile brings up at a time
	TemporalLease         time.Duration     // TEMPORAL_LEASE (0 disables)
	NodeID                string            // WORKMANAGER_NODE_ID (default: <hostname>-<pid>)
	NodeHeartbeat         time.Duration     // NODE_HEARTBEAT; a node silent for 3 heartbeats counts as gone
	NodeLabels            map[string]string // NODE_LABELS: "zone=a,pool=cpu", what workers may require (placement)
	PlacementReplicas     int               // PLACEMENT_REPLICAS: nodes serving each topic ("all": every node, 0)
	PlacementInterval     time.Duration     // PLACEMENT_INTERVAL: how often placement is planned and each node re-reads it
	PlacementMaxMoves     int               // PLACEMENT_MAX_MOVES: topics that may gain a node in one plan (rebalancing; 0: no bound)
	GatewayTimeout        time.Duration     // GATEWAY_TIMEOUT
	NativeIsolation       string            // NATIVE_ISOLATION: "in-process" (default) or "process"
	NativeHostPath        string            // NATIVE_HOST_PATH (default: native-host next to this binary)
	NativeTempDir         string            // NATIVE_TEMP_DIR
	NodeStateDir          string            // NODE_STATE_DIR: the node's local files kept across its restarts (the crash journal)
	NativeCrashQuarantine int               // NATIVE_CRASH_QUARANTINE: crashes of the node in one in-process native worker that quarantine it
	NativeJournalSlots    int               // NATIVE_CRASH_JOURNAL_SLOTS: in-process native calls the crash journal holds at once
	PythonDevKitDir       string            // PYTHON_DEVKIT_DIR: where the node installs the Python DevKit its workers import
	DotnetProcesses       int               // DOTNET_PROCESSES: host processes per .NET worker, always up
	DotnetMaxProcesses    int               // DOTNET_MAX_PROCESSES: hosts a .NET worker gets on demand while its events are slow (per worker: max_processes)
	DotnetParkAfter       time.Duration     // DOTNET_PARK_AFTER: stop an idle worker's hosts after this long without an event (0: never)
	DotnetSpares          int               // DOTNET_SPARE_HOSTS: hosts kept started ahead of need for the next create, start or reload (0: none)
	DotnetSpareCompilers  int               // DOTNET_SPARE_COMPILERS: warm C# compilers kept started ahead of need for the next compile (0: none)
	DotnetKeptCompilers   int               // DOTNET_KEPT_COMPILERS: compilers kept, each for the worker it compiled last, for that worker's next compile (0: none)
	DotnetCacheDir        string            // DOTNET_CACHE_DIR: the compiled .NET host, DevKit, C# workers and unpacked packages
	WasmMaxMemoryPages    int               // WASM_MAX_MEMORY_PAGES: each WebAssembly instance's memory cap, in 64 KiB pages
	WasmCacheDir          string            // WASM_CACHE_DIR: compiled WebAssembly modules on disk ("": in memory only)
	DotnetMono            string            // DOTNET_MONO: the mono executable (default: searched)
	DotnetCompiler        string            // DOTNET_COMPILER: the mcs C# compiler (default: searched)
	DotnetLockdown        bool              // DOTNET_LOCKDOWN: .NET hosts refuse execve and IP sockets to worker code
	NativeMaxAbandoned    int               // NATIVE_MAX_ABANDONED_CALLS
	NativeMaxExtracted    int               // NATIVE_MAX_EXTRACTED_BYTES: disk all extracted native packages may use
	NativeSpareChecks     int               // NATIVE_SPARE_CHECK_HOSTS: sandboxed hosts kept started for the load check of uploaded packages (0: none)
	BrokerProbe           time.Duration     // BROKER_PROBE_INTERVAL: how often an idle node checks that publishing works
	BrokerReadyGrace      time.Duration     // BROKER_READY_GRACE: how long the broker may fail before /readyz does
	LogLevel              slog.Level        // LOG_LEVEL
	Sandbox               string            // SANDBOX: strict, standard (default) or off
	SandboxLimits         sandbox.Limits
	SandboxWritable       []string          // SANDBOX_WRITABLE_PATHS: host paths bound read-write into every worker sandbox
	SandboxTmpBytes       uint64            // SANDBOX_TMP_BYTES: size of each worker process's /tmp
	SandboxScratchBytes   uint64            // SANDBOX_SCRATCH_BYTES: size of each worker process's /scratch
	SandboxExec           string            // SANDBOX_EXEC_PATH: cmd/sandbox-exec (default: sandbox-exec next to this binary)
	PythonAllowed         []string          // PYTHON_ALLOWED_PACKAGES
	WorkerEnv             []string          // WORKER_ENV: space-separated KEY=VALUE given to every worker process
	CodeURLs              codesource.Policy // CODE_URL_*: how the node fetches URL code sources (envconfig.CodeURLs)

	QueueDepth         int           // WORKER_QUEUE_DEPTH: messages waiting per worker beyond those running
	QueueWait          time.Duration // WORKER_QUEUE_WAIT: how long a message waits for room in a full queue
	MaxAttempts        int           // WORKER_MAX_ATTEMPTS: default attempts per (message, worker) before <topic>-dead
	RetryBackoff       time.Duration // WORKER_RETRY_BACKOFF: default wait before the second attempt (doubling)
	DeliveryRecordTTL  time.Duration // DELIVERY_RECORD_TTL: how long a message's delivery record is kept
	DeadLetterTTL      time.Duration // DEAD_LETTER_TTL: how long a dead letter stays replayable (0: kept)
	NotRunnableGrace   time.Duration // NOT_RUNNABLE_GRACE: how long a message waits for a worker no node here can run
	MaxEventBytes      int           // MAX_EVENT_BYTES: larger events go to <topic>-dead as too_large
	DaprMaxBodyBytes   int           // DAPR_MAX_BODY_BYTES: daprd's --max-body-size, the largest message it delivers or answers
	MaxOutputs         int           // MAX_OUTPUTS_PER_MESSAGE: more outputs from one call fail it (output_limit)
	LogLinesPerSecond  int           // WORKER_LOG_LINES_PER_SECOND: a worker's log lines beyond it are dropped and counted
	MaxOutputBytes     int           // MAX_OUTPUT_BYTES: an output with more data fails its call (output_limit)
	LockRetryBase      time.Duration // GROUP_LOCK_RETRY_BASE_DELAY_MS
	LockMaxRetries     int           // GROUP_LOCK_MAX_RETRIES
	LockKeepFor        int           // GROUP_LOCK_KEEP_FOR: messages one acquisition may serve in a row (0: one each)
	KeyLockTTL         time.Duration // GROUP_KEY_LOCK_TTL: how long an idle key's lock stays in the store
	LockLinger         time.Duration // GROUP_LOCK_LINGER: how long a node keeps a group's lock after its last message
	LockForward        bool          // GROUP_LOCK_FORWARD: send a grouped message's turn to the node holding its group
	LockMaxAge         time.Duration // GROUP_LOCK_MAX_AGE_MS: longer than WORKER_TIMEOUT
	ShutdownGrace      time.Duration // SHUTDOWN_GRACE: how long SIGTERM waits for in-flight messages
	DebugPprof         bool          // DEBUG_PPROF: serve Go's /debug/pprof/ profiles on WORKMANAGER_HTTP_ADDR (off by default)
	GCHeadroomBytes    int           // NODE_GC_HEADROOM_BYTES: the heap grows at least this much between collections, unless GOGC is set (internal/gcpacing)
	TestPanicExtension string        // WM_TEST_PANIC_EXTENSION: test hook, a hot-path panic for inputs with this extension (never in production)
	TestStateFaultFile string        // WM_TEST_STATE_FAULT_FILE: test hook, catalog writes to keys with a prefix listed in this file fail (never in production)
	TestStateHoldFile  string        // WM_TEST_STATE_HOLD_FILE: test hook, catalog writes to a key listed in this file wait while it lists it (never in production)
	TestNoFencing      bool          // WM_TEST_UNSAFE_NO_FENCING: test hook, outputs of grouped calls skip the fencing-token check (the chaos soak's demo that its checker can fail; never in production)
}

func loadConfig() (config, error) {
	r := envconfig.New()
	c := config{
		Services:              r.Services(),
		HTTPAddr:              r.String("WORKMANAGER_HTTP_ADDR", "127.0.0.1:8080"),
		AdvertiseAddr:         r.String("WORKMANAGER_ADVERTISE_ADDR", ""),
		PubSub:                r.String("DAPR_PUBSUB", "pubsub"),
		StreamMaxLen:          r.Int("STREAM_MAX_LEN", publish.DefaultStreamMaxLen),
		PublishCoalesce:       r.Bool("PUBLISH_COALESCE", true),
		RecoveryOnStart:       r.Bool("WORKER_RECOVERY_ON_START", true),
		ContinueAsNewAfter:    r.Int("WORKMANAGER_CONTINUE_AS_NEW_AFTER", 0),
		MaxConcurrency:        r.Int("WORKER_MAX_CONCURRENCY", 8),
		WorkerTimeout:         r.Duration("WORKER_TIMEOUT", 30*time.Second),
		PythonProcesses:       r.Int("PYTHON_PROCESSES", 1),
		PythonSpinWait:        r.Duration("PYTHON_SPIN_WAIT", 0),
		PythonMaxBatch:        r.Int("PYTHON_MAX_BATCH", 16),
		PythonMaxConcurrency:  r.Int("PYTHON_MAX_CONCURRENCY", python.DefaultMaxConcurrency),
		PythonMaxProcesses:    r.Int("PYTHON_MAX_PROCESSES", python.DefaultMaxProcesses),
		PythonParkAfter:       r.Duration("PYTHON_PARK_AFTER", 0),
		PythonSpares:          r.Int("PYTHON_SPARE_RUNNERS", 4),
		PythonForkServer:      r.Bool("PYTHON_FORK_SERVER", true),
		ReconcileInterval:     r.Duration("RECONCILE_INTERVAL", 30*time.Second),
		ReconcileParallel:     r.Int("RECONCILE_PARALLELISM", node.DefaultReconcileParallelism),
		TemporalLease:         r.Duration("TEMPORAL_LEASE", 30*time.Second),
		NodeID:                r.String("WORKMANAGER_NODE_ID", defaultNodeID()),
		NodeHeartbeat:         r.Duration("NODE_HEARTBEAT", 5*time.Second),
		PlacementInterval:     r.Duration("PLACEMENT_INTERVAL", workflows.DefaultPlacementInterval),
		PlacementMaxMoves:     r.Int("PLACEMENT_MAX_MOVES", 32),
		GatewayTimeout:        r.Duration("GATEWAY_TIMEOUT", 30*time.Second),
		NativeIsolation:       r.String("NATIVE_ISOLATION", ""),
		NativeHostPath:        r.String("NATIVE_HOST_PATH", defaultHostPath()),
		NativeTempDir:         r.String("NATIVE_TEMP_DIR", ""),
		NodeStateDir:          r.String("NODE_STATE_DIR", ""),
		NativeCrashQuarantine: r.Int("NATIVE_CRASH_QUARANTINE", crashjournal.DefaultQuarantine),
		NativeJournalSlots:    r.Int("NATIVE_CRASH_JOURNAL_SLOTS", crashjournal.DefaultSlots),
		PythonDevKitDir:       r.String("PYTHON_DEVKIT_DIR", filepath.Join(os.TempDir(), "workmanager-devkit")),
		DotnetProcesses:       r.Int("DOTNET_PROCESSES", 1),
		DotnetMaxProcesses:    r.Int("DOTNET_MAX_PROCESSES", dotnet.DefaultMaxProcesses),
		DotnetParkAfter:       r.Duration("DOTNET_PARK_AFTER", 0),
		DotnetSpares:          r.Int("DOTNET_SPARE_HOSTS", 4),
		DotnetSpareCompilers:  r.Int("DOTNET_SPARE_COMPILERS", 2),
		DotnetKeptCompilers:   r.Int("DOTNET_KEPT_COMPILERS", 2),
		DotnetCacheDir:        r.String("DOTNET_CACHE_DIR", filepath.Join(os.TempDir(), "workmanager-dotnet")),
		WasmMaxMemoryPages:    r.Int("WASM_MAX_MEMORY_PAGES", wasm.DefaultMaxMemoryPages),
		WasmCacheDir:          r.String("WASM_CACHE_DIR", filepath.Join(os.TempDir(), "workmanager-wasm")),
		DotnetMono:            r.String("DOTNET_MONO", ""),
		DotnetCompiler:        r.String("DOTNET_COMPILER", ""),
		DotnetLockdown:        r.Bool("DOTNET_LOCKDOWN", true),
		NativeMaxAbandoned:    r.Int("NATIVE_MAX_ABANDONED_CALLS", 4),
		NativeMaxExtracted:    r.Int("NATIVE_MAX_EXTRACTED_BYTES", 1<<30),
		NativeSpareChecks:     r.Int("NATIVE_SPARE_CHECK_HOSTS", 3),
		BrokerProbe:           r.Duration("BROKER_PROBE_INTERVAL", 2*time.Second),
		BrokerReadyGrace:      r.Duration("BROKER_READY_GRACE", 15*time.Second),
		LogLevel:              r.LogLevel("LOG_LEVEL"),
		Sandbox:               r.String("SANDBOX", "standard"),
		SandboxLimits: sandbox.Limits{
			AddressSpace: uint64(r.Int("SANDBOX_MEMORY_BYTES", int(sandbox.DefaultLimits.AddressSpace))),
			FileSize:     uint64(r.Int("SANDBOX_FILE_BYTES", int(sandbox.DefaultLimits.FileSize))),
			OpenFiles:    uint64(r.Int("SANDBOX_OPEN_FILES", int(sandbox.DefaultLimits.OpenFiles))),
			Processes:    uint64(r.Int("SANDBOX_PROCESSES", int(sandbox.DefaultLimits.Processes))),
			CPUSeconds:   uint64(r.Int("SANDBOX_CPU_SECONDS", 0)),
		},
		SandboxWritable:     r.List("SANDBOX_WRITABLE_PATHS", ","),
		SandboxTmpBytes:     uint64(r.Int("SANDBOX_TMP_BYTES", sandbox.DefaultTmpBytes)),
		SandboxScratchBytes: uint64(r.Int("SANDBOX_SCRATCH_BYTES", sandbox.DefaultScratchBytes)),
		SandboxExec:         r.String("SANDBOX_EXEC_PATH", ""),
		PythonAllowed:       r.List("PYTHON_ALLOWED_PACKAGES", ","),
		CodeURLs:            r.CodeURLs(),
		WorkerEnv:           strings.Fields(r.String("WORKER_ENV", "")),
		QueueDepth:          r.Int("WORKER_QUEUE_DEPTH", 64),
		QueueWait:           r.Duration("WORKER_QUEUE_WAIT", time.Second),
		MaxAttempts:         r.Int("WORKER_MAX_ATTEMPTS", 3),
		RetryBackoff:        r.Duration("WORKER_RETRY_BACKOFF", time.Second),
		DeliveryRecordTTL:   r.Duration("DELIVERY_RECORD_TTL", 24*time.Hour),
		DeadLetterTTL:       r.Duration("DEAD_LETTER_TTL", 7*24*time.Hour),
		NotRunnableGrace:    r.Duration("NOT_RUNNABLE_GRACE", 10*time.Minute),
		MaxEventBytes:       r.Int("MAX_EVENT_BYTES", 1<<20),
		DaprMaxBodyBytes:    r.Int("DAPR_MAX_BODY_BYTES", 16<<20),
		MaxOutputs:          r.Int("MAX_OUTPUTS_PER_MESSAGE", 100),
		LogLinesPerSecond:   r.Int("WORKER_LOG_LINES_PER_SECOND", 100),
		MaxOutputBytes:      r.Int("MAX_OUTPUT_BYTES", 1<<20),
		LockRetryBase:       time.Duration(r.Int("GROUP_LOCK_RETRY_BASE_DELAY_MS", 500)) * time.Millisecond,
		LockMaxRetries:      r.Int("GROUP_LOCK_MAX_RETRIES", 3),
		LockKeepFor:         r.Int("GROUP_LOCK_KEEP_FOR", 256),
		KeyLockTTL:          r.Duration("GROUP_KEY_LOCK_TTL", grouplock.DefaultKeyTTL),
		LockLinger:          r.Duration("GROUP_LOCK_LINGER", time.Second),
		LockForward:         r.Bool("GROUP_LOCK_FORWARD", true),
		LockMaxAge:          time.Duration(r.Int("GROUP_LOCK_MAX_AGE_MS", int(grouplock.DefaultMaxAge/time.Millisecond))) * time.Millisecond,
		ShutdownGrace:       r.Duration("SHUTDOWN_GRACE", 30*time.Second),
		TestPanicExtension:  r.String("WM_TEST_PANIC_EXTENSION", ""),
		TestStateFaultFile:  r.String("WM_TEST_STATE_FAULT_FILE", ""),
		TestStateHoldFile:   r.String("WM_TEST_STATE_HOLD_FILE", ""),
		TestNoFencing:       r.Bool("WM_TEST_UNSAFE_NO_FENCING", false),
		DebugPprof:          r.Bool("DEBUG_PPROF", false),
		GCHeadroomBytes:     r.Int("NODE_GC_HEADROOM_BYTES", gcpacing.DefaultHeadroom),
	}
	// The Temporal client's TLS files and API key are read again when they
	// change (docs/scaling.md, "Rotating certificates and tokens").
	c.Temporal.ReloadInterval = r.Duration("CREDENTIALS_RELOAD_INTERVAL", credfile.DefaultInterval)
	if c.Temporal.ReloadInterval < 0 {
		return c, fmt.Errorf("CREDENTIALS_RELOAD_INTERVAL must not be negative (0 reads credentials once), got %s", c.Temporal.ReloadInterval)
	}
	if err := r.Err(); err != nil {
		return c, err
	}
	labels, err := placement.ParseLabels(os.Getenv("NODE_LABELS"))
	if err != nil {
		return c, fmt.Errorf("NODE_LABELS: %w", err)
	}
	c.NodeLabels = labels
	switch v := strings.TrimSpace(os.Getenv("PLACEMENT_REPLICAS")); v {
	case "":
		c.PlacementReplicas = placement.DefaultReplicas
	case "all":
		c.PlacementReplicas = placement.All
	default:
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 64 {
			return c, fmt.Errorf("PLACEMENT_REPLICAS must be a number of nodes from 0 to 64 or \"all\", got %q", v)
		}
		c.PlacementReplicas = n
	}
	if c.NodeStateDir == "" {
		// Per node id: set WORKMANAGER_NODE_ID for the journal to carry
		// over a restart (the default id has the pid in it).
		c.NodeStateDir = filepath.Join(os.TempDir(), "workmanager-node-"+c.NodeID)
	}
	return c, c.validate()
}

// secretValues are the values of the environment's variables whose names
// say they hold a secret (…TOKEN, …SECRET, …PASSWORD, …KEY, …CREDENTIALS):
// the hot path redacts them from every error text it publishes.
func secretValues(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		u := strings.ToUpper(k)
		for _, word := range []string{"TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL"} {
			if strings.Contains(u, word) && len(v) >= 6 {
				out = append(out, v)
				break
			}
		}
	}
	return out
}

func (c config) validate() error {
	if c.PlacementInterval <= 0 {
		return fmt.Errorf("PLACEMENT_INTERVAL must be positive, got %s", c.PlacementInterval)
	}
	if c.PlacementMaxMoves < 0 {
		return fmt.Errorf("PLACEMENT_MAX_MOVES must not be negative, got %d", c.PlacementMaxMoves)
	}
	if c.ContinueAsNewAfter < 0 {
		return fmt.Errorf("WORKMANAGER_CONTINUE_AS_NEW_AFTER must not be negative, got %d", c.ContinueAsNewAfter)
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
	if _, err := sandbox.ParseMode(c.Sandbox); err != nil {
		return err
	}
	if err := python.ValidatePackages(c.PythonAllowed); err != nil {
		return fmt.Errorf("PYTHON_ALLOWED_PACKAGES: %w", err)
	}
	for _, kv := range c.WorkerEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("WORKER_ENV: %q is not KEY=VALUE", kv)
		}
	}
	for _, p := range c.SandboxWritable {
		if !filepath.IsAbs(p) {
			return fmt.Errorf("SANDBOX_WRITABLE_PATHS: %q is not an absolute path", p)
		}
	}
	if c.SandboxTmpBytes < 1<<20 || c.SandboxScratchBytes < 1<<20 {
		return fmt.Errorf("SANDBOX_TMP_BYTES and SANDBOX_SCRATCH_BYTES must be at least 1048576 (got %d, %d)", c.SandboxTmpBytes, c.SandboxScratchBytes)
	}
	l := c.SandboxLimits
	if l.AddressSpace < 64<<20 || l.OpenFiles < 16 || l.Processes < 1 || l.FileSize < 1 {
		return fmt.Errorf("sandbox limits too small to run a worker: SANDBOX_MEMORY_BYTES at least 67108864, SANDBOX_OPEN_FILES at least 16, SANDBOX_PROCESSES and SANDBOX_FILE_BYTES at least 1 (got %d, %d, %d, %d)",
			l.AddressSpace, l.OpenFiles, l.Processes, l.FileSize)
	}
	switch {
	case !filepath.IsAbs(c.NodeStateDir):
		return fmt.Errorf("NODE_STATE_DIR must be an absolute path, got %q", c.NodeStateDir)
	case c.NativeCrashQuarantine < 1:
		return fmt.Errorf("NATIVE_CRASH_QUARANTINE must be at least 1, got %d", c.NativeCrashQuarantine)
	case c.NativeJournalSlots < 1 || c.NativeJournalSlots > crashjournal.MaxSlots:
		return fmt.Errorf("NATIVE_CRASH_JOURNAL_SLOTS must be 1 to %d, got %d", crashjournal.MaxSlots, c.NativeJournalSlots)
	case c.NativeMaxAbandoned < 1:
		return fmt.Errorf("NATIVE_MAX_ABANDONED_CALLS must be at least 1, got %d", c.NativeMaxAbandoned)
	case c.MaxConcurrency < 1:
		return fmt.Errorf("WORKER_MAX_CONCURRENCY must be at least 1, got %d", c.MaxConcurrency)
	case c.WorkerTimeout <= 0:
		return fmt.Errorf("WORKER_TIMEOUT must be positive, got %s", c.WorkerTimeout)
	case c.PythonProcesses < 1:
		return fmt.Errorf("PYTHON_PROCESSES must be at least 1, got %d", c.PythonProcesses)
	case c.DotnetProcesses < 1:
		return fmt.Errorf("DOTNET_PROCESSES must be at least 1, got %d", c.DotnetProcesses)
	case c.DotnetMaxProcesses < 1 || c.DotnetMaxProcesses > dotnet.MaxProcessesLimit:
		return fmt.Errorf("DOTNET_MAX_PROCESSES must be 1 to %d, got %d", dotnet.MaxProcessesLimit, c.DotnetMaxProcesses)
	case c.WasmMaxMemoryPages < 1 || c.WasmMaxMemoryPages > 65536:
		return fmt.Errorf("WASM_MAX_MEMORY_PAGES must be 1 to 65536 (64 KiB pages: 64 KiB to 4 GiB), got %d", c.WasmMaxMemoryPages)
	case c.WasmCacheDir != "" && !filepath.IsAbs(c.WasmCacheDir):
		return fmt.Errorf("WASM_CACHE_DIR must be an absolute path or empty, got %q", c.WasmCacheDir)
	case c.DotnetCacheDir == "" || !filepath.IsAbs(c.DotnetCacheDir):
		return fmt.Errorf("DOTNET_CACHE_DIR must be an absolute path, got %q", c.DotnetCacheDir)
	case c.PythonMaxConcurrency < 1 || c.PythonMaxConcurrency > python.MaxConcurrencyLimit:
		return fmt.Errorf("PYTHON_MAX_CONCURRENCY must be 1 to %d, got %d", python.MaxConcurrencyLimit, c.PythonMaxConcurrency)
	case c.PythonSpares < 0 || c.PythonSpares > python.MaxSpares:
		return fmt.Errorf("PYTHON_SPARE_RUNNERS must be 0 (none) to %d, got %d", python.MaxSpares, c.PythonSpares)
	case c.PythonParkAfter < 0:
		return fmt.Errorf("PYTHON_PARK_AFTER must not be negative (0: runners are never parked), got %s", c.PythonParkAfter)
	case c.DotnetSpares < 0 || c.DotnetSpares > dotnet.MaxSpares:
		return fmt.Errorf("DOTNET_SPARE_HOSTS must be 0 (none) to %d, got %d", dotnet.MaxSpares, c.DotnetSpares)
	case c.DotnetSpareCompilers < 0 || c.DotnetSpareCompilers > dotnet.MaxSpares:
		return fmt.Errorf("DOTNET_SPARE_COMPILERS must be 0 (none) to %d, got %d", dotnet.MaxSpares, c.DotnetSpareCompilers)
	case c.DotnetKeptCompilers < 0 || c.DotnetKeptCompilers > dotnet.MaxSpares:
		return fmt.Errorf("DOTNET_KEPT_COMPILERS must be 0 (none) to %d, got %d", dotnet.MaxSpares, c.DotnetKeptCompilers)
	case c.DotnetParkAfter < 0:
		return fmt.Errorf("DOTNET_PARK_AFTER must not be negative (0: hosts are never parked), got %s", c.DotnetParkAfter)
	case c.PythonMaxProcesses < 1 || c.PythonMaxProcesses > python.MaxProcessesLimit:
		return fmt.Errorf("PYTHON_MAX_PROCESSES must be 1 to %d, got %d", python.MaxProcessesLimit, c.PythonMaxProcesses)
	case c.PythonMaxBatch < 1:
		return fmt.Errorf("PYTHON_MAX_BATCH must be at least 1 (1: no batches), got %d", c.PythonMaxBatch)
	case c.TemporalLease < 0 || (c.TemporalLease > 0 && c.TemporalLease < time.Second):
		return fmt.Errorf("TEMPORAL_LEASE must be 0 (off) or at least 1s, got %s", c.TemporalLease)
	case c.ReconcileInterval < 0:
		return fmt.Errorf("RECONCILE_INTERVAL must not be negative, got %s", c.ReconcileInterval)
	case c.ReconcileParallel < 1 || c.ReconcileParallel > 64:
		return fmt.Errorf("RECONCILE_PARALLELISM must be 1 to 64, got %d", c.ReconcileParallel)
	case c.NativeIsolation != "" && c.NativeIsolation != "in-process" && c.NativeIsolation != "process" && c.NativeIsolation != "always":
		return fmt.Errorf(`NATIVE_ISOLATION must be "in-process", "process" or "always" (the same as "process": every native worker in a sandboxed host), got %q`, c.NativeIsolation)
	case c.GatewayTimeout <= 0:
		return fmt.Errorf("GATEWAY_TIMEOUT must be positive, got %s", c.GatewayTimeout)
	case c.BrokerProbe <= 0:
		return fmt.Errorf("BROKER_PROBE_INTERVAL must be positive, got %s", c.BrokerProbe)
	case c.BrokerReadyGrace < 0:
		return fmt.Errorf("BROKER_READY_GRACE must not be negative, got %s", c.BrokerReadyGrace)
	case c.NodeHeartbeat <= 0:
		return fmt.Errorf("NODE_HEARTBEAT must be positive, got %s", c.NodeHeartbeat)
	case !validNodeID(c.NodeID):
		return fmt.Errorf("WORKMANAGER_NODE_ID must be 1 to 100 letters, digits, '.', '_' or '-', got %q", c.NodeID)
	case c.QueueDepth < 1:
		return fmt.Errorf("WORKER_QUEUE_DEPTH must be at least 1, got %d", c.QueueDepth)
	case c.QueueWait < 0 || c.QueueWait > time.Minute:
		return fmt.Errorf("WORKER_QUEUE_WAIT must be 0 to 1m, got %s", c.QueueWait)
	case c.MaxAttempts < 1 || c.MaxAttempts > 100:
		return fmt.Errorf("WORKER_MAX_ATTEMPTS must be 1 to 100, got %d", c.MaxAttempts)
	case c.RetryBackoff < 0:
		return fmt.Errorf("WORKER_RETRY_BACKOFF must not be negative, got %s", c.RetryBackoff)
	case c.DeliveryRecordTTL < time.Minute:
		return fmt.Errorf("DELIVERY_RECORD_TTL must be at least 1m (it must outlive redeliveries), got %s", c.DeliveryRecordTTL)
	case c.DeadLetterTTL < 0:
		return fmt.Errorf("DEAD_LETTER_TTL must not be negative, got %s", c.DeadLetterTTL)
	case c.NotRunnableGrace < 0:
		return fmt.Errorf("NOT_RUNNABLE_GRACE must not be negative, got %s", c.NotRunnableGrace)
	case c.GCHeadroomBytes < 0 || c.GCHeadroomBytes > 4<<30:
		return fmt.Errorf("NODE_GC_HEADROOM_BYTES must be 0 (Go's default pacing) to 4294967296, got %d", c.GCHeadroomBytes)
	case c.MaxEventBytes < 1024 || c.MaxEventBytes > 64<<20:
		return fmt.Errorf("MAX_EVENT_BYTES must be 1024 to 67108864, got %d", c.MaxEventBytes)
	case c.DaprMaxBodyBytes < 1<<20 || c.DaprMaxBodyBytes > 1<<30:
		return fmt.Errorf("DAPR_MAX_BODY_BYTES (daprd's --max-body-size) must be 1048576 to 1073741824, got %d", c.DaprMaxBodyBytes)
	case c.NativeSpareChecks < 0 || c.NativeSpareChecks > dotnet.MaxSpares:
		return fmt.Errorf("NATIVE_SPARE_CHECK_HOSTS must be 0 (none) to %d, got %d", dotnet.MaxSpares, c.NativeSpareChecks)
	case c.NativeMaxExtracted < 0:
		return fmt.Errorf("NATIVE_MAX_EXTRACTED_BYTES must be 0 (unbounded) or more, got %d", c.NativeMaxExtracted)
	case c.LogLinesPerSecond < 0:
		return fmt.Errorf("WORKER_LOG_LINES_PER_SECOND must be 0 (unlimited) or more, got %d", c.LogLinesPerSecond)
	case c.MaxOutputs < 1 || c.MaxOutputs > 10000:
		return fmt.Errorf("MAX_OUTPUTS_PER_MESSAGE must be 1 to 10000, got %d", c.MaxOutputs)
	case c.MaxOutputBytes < 1024 || c.MaxOutputBytes > 64<<20:
		return fmt.Errorf("MAX_OUTPUT_BYTES must be 1024 to 67108864, got %d", c.MaxOutputBytes)
	case c.LockRetryBase <= 0:
		return fmt.Errorf("GROUP_LOCK_RETRY_BASE_DELAY_MS must be positive, got %d", c.LockRetryBase.Milliseconds())
	case c.LockMaxRetries < 0 || c.LockMaxRetries > 20:
		return fmt.Errorf("GROUP_LOCK_MAX_RETRIES must be 0 to 20, got %d", c.LockMaxRetries)
	case c.LockKeepFor < 0 || c.LockKeepFor > 1_000_000:
		return fmt.Errorf("GROUP_LOCK_KEEP_FOR must be 0 to 1000000, got %d", c.LockKeepFor)
	case c.LockLinger < 0 || c.LockLinger > 10*time.Second:
		return fmt.Errorf("GROUP_LOCK_LINGER must be 0 to 10s, got %s", c.LockLinger)
	case c.KeyLockTTL < 10*c.LockMaxAge:
		// A key's lock must outlive its holder's written max age (10 ×
		// the max age), or a held lock could expire under its holder.
		return fmt.Errorf("GROUP_KEY_LOCK_TTL must be at least 10 × GROUP_LOCK_MAX_AGE_MS (%s), got %s", 10*c.LockMaxAge, c.KeyLockTTL)
	case c.LockMaxAge < time.Second:
		return fmt.Errorf("GROUP_LOCK_MAX_AGE_MS must be at least 1000, got %d", c.LockMaxAge.Milliseconds())
	case c.WorkerTimeout >= c.LockMaxAge:
		// Every worker's calls are bounded by WORKER_TIMEOUT (there is no
		// per-worker timeout). A holder renews its lease while its call
		// runs, but one that cannot (paused, cut off from the store) must
		// not have a call outlive its lock: peers take it after the max age.
		return fmt.Errorf("WORKER_TIMEOUT (%s) must be shorter than GROUP_LOCK_MAX_AGE_MS (%d ms): a grouped call could outlive its group lock and run beside another node's; lower WORKER_TIMEOUT or raise GROUP_LOCK_MAX_AGE_MS",
			c.WorkerTimeout, c.LockMaxAge.Milliseconds())
	case c.ShutdownGrace < 0:
		return fmt.Errorf("SHUTDOWN_GRACE must not be negative, got %s", c.ShutdownGrace)
	case c.TemporalAddress == "" || c.DaprGRPCAddress == "" || c.HTTPAddr == "":
		return fmt.Errorf("TEMPORAL_ADDRESS, DAPR_GRPC_ADDRESS and WORKMANAGER_HTTP_ADDR must not be empty")
	}
	if c.AdvertiseAddr != "" {
		if err := grouplock.ValidateAdvertiseAddr(c.advertiseAddr()); err != nil {
			return fmt.Errorf("WORKMANAGER_ADVERTISE_ADDR: %w", err)
		}
	}
	return nil
}

// advertiseAddr is the HTTP address this node's peers reach it at, for
// group lock hand-overs: WORKMANAGER_ADVERTISE_ADDR (a host alone takes
// WORKMANAGER_HTTP_ADDR's port: a pod's IP), else WORKMANAGER_HTTP_ADDR
// when its host is an address (not a wildcard), else none (peers then
// wait for a lingering hold by polling).
func (c config) advertiseAddr() string {
	a := c.AdvertiseAddr
	if a == "" {
		if grouplock.ValidateAdvertiseAddr(c.HTTPAddr) == nil {
			return c.HTTPAddr
		}
		return ""
	}
	if _, _, err := net.SplitHostPort(a); err == nil {
		return a
	}
	if _, port, err := net.SplitHostPort(c.HTTPAddr); err == nil {
		return net.JoinHostPort(a, port)
	}
	return a
}

// defaultNodeID is <hostname>-<pid>: unique among the nodes of one host, and
// readable in the Temporal UI (task queue workmanager-node-<id>).
func defaultNodeID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "node"
	}
	id := []byte(fmt.Sprintf("%s-%d", h, os.Getpid()))
	for i, c := range id {
		if !nodeIDChar(c) {
			id[i] = '-'
		}
	}
	return string(id)
}

func validNodeID(id string) bool {
	if id == "" || len(id) > 100 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !nodeIDChar(id[i]) {
			return false
		}
	}
	return true
}

func nodeIDChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

// defaultHostPath is cmd/native-host's binary next to this one.
func defaultHostPath() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(exe), "native-host")
}
