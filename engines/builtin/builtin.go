// Package builtin registers every built-in engine in one place. Adding an
// engine is a new package under engines/ plus one line here.
package builtin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/crashjournal"
	"github.com/virtufin/workmanager/engines/dotnet"
	"github.com/virtufin/workmanager/engines/native"
	"github.com/virtufin/workmanager/engines/python"
	"github.com/virtufin/workmanager/engines/sandbox"
	"github.com/virtufin/workmanager/engines/wasm"
)

// Config carries the settings of the built-in engines.
type Config struct {
	Logger *slog.Logger
	// PythonProcesses is the number of Python subprocesses per worker.
	PythonProcesses int
	// DefaultTimeout bounds one message when a worker sets none.
	DefaultTimeout time.Duration
	// PythonSpinWait is how long a Python call busy-polls for its reply
	// (0: engine default, negative: never).
	PythonSpinWait time.Duration
	// PythonMaxConcurrency and PythonMaxProcesses are the cluster defaults
	// of a Python worker's max_concurrency and max_processes (0: the
	// engine's, 16 and 4).
	PythonMaxConcurrency int
	PythonMaxProcesses   int
	// PythonParkAfter: python.Config.ParkAfter.
	PythonParkAfter time.Duration
	// PythonSpares: python.Config.Spares (runners started ahead of need).
	PythonSpares int
	// PythonNoForkServer: python.Config.NoForkServer (every runner
	// through the sandbox's programs).
	PythonNoForkServer bool
	// PythonMaxBatch is how many waiting calls a Python process takes at
	// once (0: engine default, 1: no batches).
	PythonMaxBatch int
	// Gateway serves native workers' gateway_call and Python workers'
	// virtufin_host.call_gateway (nil: unavailable).
	Gateway engines.Gateway
	// NativeIsolation is the native engine's default mode ("" = in process).
	NativeIsolation native.Isolation
	// NativeHostPath is the cmd/native-host binary for process isolation.
	NativeHostPath string
	// NativeTempDir is where native packages are extracted ("" = os.TempDir()).
	NativeTempDir string
	// NativeMaxAbandonedCalls bounds timed-out in-process native calls still
	// running, per worker (0 = native.DefaultMaxAbandonedCalls).
	NativeMaxAbandonedCalls int
	// NativeJournal records the in-process native calls in flight for
	// the node's crash accounting (nil: none).
	NativeJournal *crashjournal.Journal
	// Sandbox wraps worker processes in the OS layers (nil: none).
	Sandbox *sandbox.Sandbox
	// PythonAllowedPackages are importable beyond the safe standard library
	// subset (PYTHON_ALLOWED_PACKAGES).
	PythonAllowedPackages []string
	// NativeMaxExtractedBytes bounds the disk of extracted native packages
	// (0: unbounded).
	NativeMaxExtractedBytes int64
	// NativeSpareCheckHosts is native.Config.SpareCheckHosts
	// (NATIVE_SPARE_CHECK_HOSTS).
	NativeSpareCheckHosts int
	// WorkerEnv are KEY=VALUE entries every worker process gets
	// (WORKER_ENV); nothing else of the node's environment reaches it.
	WorkerEnv []string
	// PythonDevKitDir holds the Python DevKit every Python worker may
	// import (sdk/python, installed by the node at start).
	PythonDevKitDir string
	// Dotnet configures the .NET engine; its Logger, DefaultTimeout,
	// Gateway, Sandbox, Env and OnRestart are taken from the fields above.
	Dotnet dotnet.Config
	// MaxOutputs and MaxOutputBytes are the node's output limits
	// (MAX_OUTPUTS_PER_MESSAGE, MAX_OUTPUT_BYTES; 0: the dispatcher's
	// defaults, 100 and 1 MiB). Every engine reads at most
	// engines.ReplyLimit of them of one call's reply: a bigger reply fails
	// the call while it is read (engines.ErrReplyTooLarge).
	MaxOutputs, MaxOutputBytes int
	// WasmMaxMemoryPages caps each WebAssembly instance's memory in
	// pages of 64 KiB (WASM_MAX_MEMORY_PAGES; 0: the engine's default,
	// 1024). WasmCacheDir keeps compiled modules on disk (WASM_CACHE_DIR;
	// "": in memory only).
	WasmMaxMemoryPages uint32
	WasmCacheDir       string
	// OnProcessRestart, when set, learns of each worker process an engine
	// restarted after a crash or a timeout: the engine's name ("python",
	// "native", "dotnet"), the restart's reason (a short fixed text) and
	// its error (nil: the process runs again). Keep it cheap.
	OnProcessRestart func(engine, reason string, err error)
}

// Registry returns a registry with every built-in engine. Constructing an
// engine starts nothing: processes are started when a worker is loaded.
func Registry(cfg Config) (*engines.Registry, error) {
	reg := engines.NewRegistry()
	for _, e := range []engines.Engine{
		python.New(pythonConfig(cfg)),
		native.New(nativeConfig(cfg)),
		dotnet.New(dotnetConfig(cfg)),
		wasm.New(wasmConfig(cfg)),
	} {
		if err := reg.Register(e); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

func pythonConfig(cfg Config) python.Config {
	return python.Config{Processes: cfg.PythonProcesses, MaxConcurrency: cfg.PythonMaxConcurrency, MaxProcesses: cfg.PythonMaxProcesses, ParkAfter: cfg.PythonParkAfter, DefaultTimeout: cfg.DefaultTimeout, MaxReplyBytes: replyLimit(cfg),
		Spares: cfg.PythonSpares, NoForkServer: cfg.PythonNoForkServer, SpinWait: cfg.PythonSpinWait, MaxBatch: cfg.PythonMaxBatch, Logger: cfg.Logger, Sandbox: cfg.Sandbox,
		AllowedPackages: cfg.PythonAllowedPackages, Env: cfg.WorkerEnv, Gateway: cfg.Gateway, DevKitDir: cfg.PythonDevKitDir,
		OnRestart: onRestart(cfg, "python")}
}

func nativeConfig(cfg Config) native.Config {
	return native.Config{DefaultTimeout: cfg.DefaultTimeout, Gateway: cfg.Gateway, Logger: cfg.Logger,
		Isolation: cfg.NativeIsolation, HostPath: cfg.NativeHostPath, TempDir: cfg.NativeTempDir,
		MaxAbandonedCalls: cfg.NativeMaxAbandonedCalls, Sandbox: cfg.Sandbox, HostEnv: cfg.WorkerEnv,
		MaxExtractedBytes: cfg.NativeMaxExtractedBytes, MaxReplyBytes: replyLimit(cfg), OnRestart: onRestart(cfg, "native"),
		Journal: cfg.NativeJournal, SpareCheckHosts: cfg.NativeSpareCheckHosts}
}

func dotnetConfig(cfg Config) dotnet.Config {
	d := cfg.Dotnet
	d.Logger, d.DefaultTimeout, d.Gateway, d.Sandbox, d.Env = cfg.Logger, cfg.DefaultTimeout, cfg.Gateway, cfg.Sandbox, cfg.WorkerEnv
	d.OnRestart = onRestart(cfg, "dotnet")
	d.MaxReplyBytes = replyLimit(cfg)
	return d
}

func wasmConfig(cfg Config) wasm.Config {
	return wasm.Config{DefaultTimeout: cfg.DefaultTimeout, Gateway: cfg.Gateway, Logger: cfg.Logger,
		MaxReplyBytes: replyLimit(cfg), MaxMemoryPages: cfg.WasmMaxMemoryPages, CacheDir: cfg.WasmCacheDir}
}

// replyLimit is the engines' reply limit for the node's output limits.
func replyLimit(cfg Config) int {
	outputs, bytes := cfg.MaxOutputs, cfg.MaxOutputBytes
	if outputs <= 0 {
		outputs = 100
	}
	if bytes <= 0 {
		bytes = 1 << 20
	}
	return engines.ReplyLimit(outputs, bytes)
}

// onRestart is an engine's restart callback: cfg.OnProcessRestart with the
// engine's name (nil when it is not set).
func onRestart(cfg Config, engine string) func(reason string, err error) {
	if cfg.OnProcessRestart == nil {
		return nil
	}
	return func(reason string, err error) { cfg.OnProcessRestart(engine, reason, err) }
}

// Warm prepares, in the background and bounded by ctx, every registered
// engine that implements engines.Warmer (the .NET engine compiles its
// host), so that the first worker does not wait for it, and reports each
// outcome with the engine's name.
func Warm(ctx context.Context, reg *engines.Registry, report func(engine, runtime string, err error)) {
	for _, e := range each(reg) {
		if w, ok := e.(engines.Warmer); ok {
			go func() {
				desc, err := w.Warm(ctx)
				report(e.Info().Name, desc, err)
			}()
		}
	}
}

// each lists reg's engines, each once (an engine serves several MIME
// types).
func each(reg *engines.Registry) []engines.Engine {
	seen := map[string]bool{}
	var out []engines.Engine
	for _, m := range reg.MIMETypes() {
		e, err := reg.Lookup(m)
		if err != nil || seen[e.Info().Name] {
			continue
		}
		seen[e.Info().Name] = true
		out = append(out, e)
	}
	return out
}

// Close closes every engine of reg that holds processes of its own
// (engines.Closer), each once, and returns their errors joined.
func Close(reg *engines.Registry) error {
	var errs []error
	for _, e := range each(reg) {
		if c, ok := e.(engines.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("%s engine: %w", e.Info().Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
