// Package dotnet owns the .NET engine: C# source workers (text/x-csharp),
// compiled at load with the runtime's compiler, and pre-built worker
// assemblies (application/x-dotnet-dll: a nupkg-shaped zip whose
// lib/<tfm>/ holds the worker DLL and its dependencies, or one bare DLL).
// Each worker runs in its own child process, the host (host/Host.cs,
// compiled at first use together with the C# DevKit, sdk/dotnet), inside
// the node's sandbox, driven over the framed pipe protocol of the Python
// engine (engines/internal/wire). See README.md for the design and its
// trade-off against hosting CoreCLR in the node.
package dotnet

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/spares"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// MIME types this engine serves.
const (
	MIMESource  = engines.MIMECSharp
	MIMEPackage = engines.MIMEDotnetDLL
)

//go:embed host/Host.cs
var hostSource []byte

//go:embed host/Compiler.cs
var compilerSource []byte

// Defaults used when the Config leaves a field zero.
const (
	DefaultProcesses = 1
	// DefaultMaxProcesses bounds the hosts a worker gets on demand while
	// its events are slow (Config.MaxProcesses); MaxProcessesLimit bounds
	// the per-worker value (Spec.MaxProcesses).
	DefaultMaxProcesses = 4
	MaxProcessesLimit   = 16
	// DefaultSlowEvent and DefaultIdleRetire: see Config.SlowEvent and
	// Config.IdleRetire.
	DefaultSlowEvent   = 2 * time.Millisecond
	DefaultIdleRetire  = 30 * time.Second
	DefaultTimeout     = 30 * time.Second
	DefaultLoadTimeout = 120 * time.Second
)

// closeGrace is how long Close lets an idle host exit on its own (EOF on
// its request pipe) before it is killed.
const closeGrace = 2 * time.Second

// Config configures the engine. The zero value is usable.
type Config struct {
	// Mono and Compiler are the runtime and the C# compiler (DOTNET_MONO,
	// DOTNET_COMPILER). Default: searched (see Discover).
	Mono, Compiler string
	// CacheDir holds the compiled host and DevKit, compiled C# workers and
	// extracted packages, keyed by content (DOTNET_CACHE_DIR). Default:
	// <os.TempDir()>/workmanager-dotnet.
	CacheDir string
	// Processes is the number of host processes per loaded Instance that
	// are always up. Default 1.
	Processes int
	// MaxProcesses is how many hosts an Instance may have (DOTNET_MAX_PROCESSES,
	// per worker Spec.MaxProcesses; never below Processes): beyond
	// Processes, one more starts when every host is busy, a call waits
	// and the last event was slow (over SlowEvent), and is retired after
	// IdleRetire without a call. Default DefaultMaxProcesses.
	MaxProcesses int
	// SlowEvent and IdleRetire: see MaxProcesses. Defaults 2ms and 30s.
	SlowEvent, IdleRetire time.Duration
	// ParkAfter, when above 0, stops every host of a worker that got no
	// event for that long (DOTNET_PARK_AFTER): its next event waits for a
	// host's start (Mono: about a second). 0 (default): hosts stay.
	ParkAfter time.Duration
	// DefaultTimeout bounds one Process call when Spec.Timeout is 0.
	DefaultTimeout time.Duration
	// LoadTimeout bounds compiling the code, or starting one host and
	// loading the code into it. Default 120s.
	LoadTimeout time.Duration
	// Gateway serves the workers' gateway calls (the DevKit's ApiClient);
	// nil: calls fail with "no gateway is configured".
	Gateway engines.Gateway
	// Sandbox wraps every host process in the OS layers; the host then
	// gets only Env and the VIRTUFIN_WORKER_* variables. Nil: the host runs
	// as the node, with the node's environment (tests).
	Sandbox *sandbox.Sandbox
	// NoLockdown turns off the host's own seccomp filter, which refuses
	// new programs (execve) and IP sockets to the worker's code, installed
	// by the host on all its threads before the worker's assembly is
	// loaded (README.md). It is only used with a Sandbox (not Off).
	NoLockdown bool
	// CompilerLimits bound one compile of a C# source worker (mcs on
	// Mono), which runs in Sandbox as a user id of its own with an empty
	// environment, or, with no Sandbox or SANDBOX=off, as the node under
	// prlimit. Zero fields: DefaultCompilerMemory (address space),
	// DefaultCompilerCPUSeconds, DefaultCompilerFileSize (the assembly);
	// open files and processes are the Sandbox's. A source that takes the
	// compiler past one is refused as invalid code naming the limit.
	CompilerLimits sandbox.Limits
	// Env holds extra KEY=VALUE entries for every host process.
	Env []string
	// MaxPackageBytes bounds the extracted size of a package (0: 256 MiB).
	MaxPackageBytes int64
	// Logger receives the engine's logs and, when Spec.Logger is nil, the
	// workers' output. Default slog.Default().
	Logger *slog.Logger
	// OnRestart, when set, learns of each host process restarted after a
	// crash or a timeout (procpool.Config.OnRestart): reason is a short
	// fixed text ("timeout", "process exited", …), err the restart's error
	// (nil: it runs again). Keep it cheap.
	OnRestart func(reason string, err error)
	// MaxReplyBytes bounds what is read of one reply (a result, an error
	// report or a gateway call) from a worker process, checked on the
	// frame's header before anything is allocated for it; a bigger reply
	// fails the call (engines.ErrReplyTooLarge) and the process is
	// replaced. Default engines.DefaultMaxReplyBytes; builtin sets
	// engines.ReplyLimit of the node's output limits.
	MaxReplyBytes int
	// Spares is how many hosts the engine keeps started ahead of need, for
	// no worker yet (spare.go, DOTNET_SPARE_HOSTS): a create, start or
	// reload takes one instead of starting the runtime. Each is given to
	// one worker once. 0 (the default here; the node's default is 1): none.
	Spares int
	// SpareCompilers is how many warmed C# compilers the engine keeps
	// started ahead of need (sparecompiler.go, DOTNET_SPARE_COMPILERS): a
	// C# source's compile takes one instead of starting mcs, about 0.1 s
	// less. Each compiles one worker's source once. 0 (the default here;
	// the node's default is 2): none.
	SpareCompilers int
	// KeptCompilers is how many compilers the engine keeps, each for the
	// worker whose source it compiled last (keptcompiler.go,
	// DOTNET_KEPT_COMPILERS): that worker's next compile takes it instead
	// of a spare compiler, whose replacement is about half a second of
	// CPU. 0 (the default here; the node's default is 2): none. Only
	// with SpareCompilers (a kept compiler was a spare).
	KeptCompilers int
	// KeptCompilerIdle is how long a kept compiler waits for its worker's
	// next compile (0: a minute).
	KeptCompilerIdle time.Duration
}

// MaxSpares bounds Config.Spares (DOTNET_SPARE_HOSTS).
const MaxSpares = 16

// Engine is the .NET engine. It is safe for concurrent use.
type Engine struct {
	cfg Config

	rtMu sync.Mutex
	rt   *runtime // nil until the first Check or Load found and built it

	// lockdown is the seccomp filter hosts install before loading worker
	// code (sandbox.LockdownProgram); nil: none.
	lockdown []byte

	// parking keeps the host a Check started for the Load of the same
	// worker and code (procpool.Parking).
	parking procpool.Parking[procpool.Key, *proc]

	spares *spares.Set[*proc]

	// compilers are the spare compilers; spareCompilerSeq names their
	// sandbox owners.
	compilers        *spares.Set[*spareCompiler]
	spareCompilerSeq atomic.Uint64
	// kept are the compilers kept for their workers' next compile.
	kept *keptCompilers
	// unstagedWarned is whether a spare compiler that could not stage
	// its compile has been logged (once).
	unstagedWarned atomic.Bool

	// slots are the directories the spares' slots are made in (slots.go).
	slots slotOwners
}

// ParkTTL and ParkMax bound the hosts Check keeps for the following Load:
// a create or a reload then starts one host instead of two.
const (
	ParkTTL = 30 * time.Second
	ParkMax = 16
)

var _ engines.Engine = (*Engine)(nil)

// New returns a .NET engine. Nothing is searched, compiled or started
// until the first Check or Load.
func New(cfg Config) *Engine {
	if cfg.Processes <= 0 {
		cfg.Processes = DefaultProcesses
	}
	if cfg.MaxProcesses <= 0 {
		cfg.MaxProcesses = DefaultMaxProcesses
	}
	if cfg.SlowEvent <= 0 {
		cfg.SlowEvent = DefaultSlowEvent
	}
	if cfg.IdleRetire <= 0 {
		cfg.IdleRetire = DefaultIdleRetire
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultTimeout
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = DefaultLoadTimeout
	}
	if cfg.CacheDir == "" {
		cfg.CacheDir = filepath.Join(os.TempDir(), "workmanager-dotnet")
	}
	if cfg.MaxPackageBytes <= 0 {
		cfg.MaxPackageBytes = 256 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = engines.DefaultMaxReplyBytes
	}
	e := &Engine{cfg: cfg}
	e.parking.TTL, e.parking.Max = ParkTTL, ParkMax
	e.spares = spares.New(cfg.Spares, cfg.Sandbox, e.startSpare, cfg.Logger, "dotnet engine: a spare host")
	e.compilers = e.newSpareCompilers()
	if cfg.KeptCompilerIdle <= 0 {
		cfg.KeptCompilerIdle = keptIdle
	}
	e.kept = &keptCompilers{max: min(cfg.KeptCompilers, MaxSpares), idle: cfg.KeptCompilerIdle}
	if !cfg.NoLockdown && cfg.Sandbox != nil && cfg.Sandbox.Mode() != sandbox.Off {
		lockdown := sandbox.LockdownProgram
		if !cfg.Sandbox.HasNamespaces() {
			// The host shares the node's network and IPC namespaces: only
			// AF_UNIX sockets, no memfd or SysV shared memory, and the
			// refusals of the filter bubblewrap would have installed.
			lockdown = sandbox.NoNamespacesLockdownProgram
		}
		prog, err := lockdown()
		if err != nil {
			// Only an architecture the seccomp library does not know.
			cfg.Logger.Warn("dotnet engine: no lockdown filter for .NET hosts", "error", err)
		}
		e.lockdown = prog
	}
	return e
}

// Info implements engines.Engine.
func (e *Engine) Info() engines.Info {
	return engines.Info{
		Name:      "dotnet",
		MIMETypes: []string{MIMESource, MIMEPackage},
		Capabilities: engines.Capabilities{
			InProcess:     false,
			Interruptible: true,
			ParallelCalls: max(e.cfg.Processes, e.cfg.MaxProcesses),
		},
	}
}

// maxProcesses is how many hosts an Instance of spec may have
// (Spec.MaxProcesses, else Config.MaxProcesses; never below Processes).
func (e *Engine) maxProcesses(spec engines.Spec) int {
	n := e.cfg.MaxProcesses
	if spec.MaxProcesses > 0 {
		n = min(spec.MaxProcesses, MaxProcessesLimit)
	}
	return max(n, e.cfg.Processes)
}

// Check implements engines.Engine: it compiles (or unpacks) the code and
// loads it into one host process, which it then stops.
func (e *Engine) Check(ctx context.Context, spec engines.Spec, code []byte) error {
	spec = spec.WithDefaults(e.cfg.DefaultTimeout, e.cfg.Logger)
	ctx, cancel := context.WithTimeout(ctx, e.cfg.LoadTimeout)
	defer cancel()
	w, err := e.prepare(ctx, spec, code)
	if err != nil {
		return err
	}
	p, err := e.startLoaded(ctx, spec, w, nil)
	if err != nil {
		return err
	}
	if spec.LoadsElsewhere {
		e.parking.Discard(p)
	} else {
		e.parking.Park(procpool.KeyOf(spec, code), p)
	}
	return nil
}

// Close retires the hosts parked by Check and the spares
// (engines.Closer).
func (e *Engine) Close() error {
	e.parking.Close()
	e.spares.Close()
	e.compilers.Close()
	e.kept.close()
	e.slots.close()
	return nil
}

// Load implements engines.Engine: it compiles (or unpacks) the code once
// and starts Config.Processes hosts with it loaded.
func (e *Engine) Load(ctx context.Context, spec engines.Spec, code []byte) (engines.Instance, error) {
	spec = spec.WithDefaults(e.cfg.DefaultTimeout, e.cfg.Logger)
	pctx, cancel := context.WithTimeout(ctx, e.cfg.LoadTimeout)
	w, err := e.prepare(pctx, spec, code)
	cancel()
	if err != nil {
		return nil, err
	}
	in := newInstance(e, spec, w, procpool.KeyOf(spec, code))
	if spec.Parked && e.cfg.ParkAfter > 0 {
		in.pool.FillParked() // its first event starts a host
		return in, nil
	}
	if err := procpool.FirstError(in.pool.Fill(ctx), engines.ErrInvalidCode); err != nil {
		return nil, err
	}
	return in, nil
}

var _ engines.Warmer = (*Engine)(nil)

// Warm implements engines.Warmer: it finds the runtime and compiles the
// host and the DevKit (a second or two on a cold cache).
func (e *Engine) Warm(ctx context.Context) (string, error) {
	rt, err := e.runtimeFor(ctx)
	if err != nil {
		return "", err
	}
	return rt.describe(), nil
}

// runtimeFor finds the runtime and builds the host and the DevKit, once
// per Engine; a failure is not cached (the packages may be installed
// meanwhile).
func (e *Engine) runtimeFor(ctx context.Context) (*runtime, error) {
	e.rtMu.Lock()
	defer e.rtMu.Unlock()
	if e.rt != nil {
		return e.rt, nil
	}
	rt, err := discover(e.cfg.Mono, e.cfg.Compiler)
	if err != nil {
		return nil, err
	}
	if err := rt.build(ctx, e.cfg.CacheDir, hostSource, compilerSource, e.cfg.Logger); err != nil {
		return nil, err
	}
	e.rt = rt
	return rt, nil
}

// prepare turns code into something a host can load: a compiled C# source
// or an unpacked package.
func (e *Engine) prepare(ctx context.Context, spec engines.Spec, code []byte) (*workerCode, error) {
	rt, err := e.runtimeFor(ctx)
	if err != nil {
		return nil, err
	}
	switch spec.MIMEType {
	case MIMESource:
		return rt.compile(ctx, e.cfg.CacheDir, code, e.compilerFor(spec))
	case MIMEPackage:
		return rt.unpack(e.cfg.CacheDir, spec.Tenant, code, e.cfg.MaxPackageBytes)
	default:
		return nil, fmt.Errorf("dotnet engine: %w %q", engines.ErrUnknownMIMEType, spec.MIMEType)
	}
}

// ErrClosed is returned by Process on a closed Instance, and by calls that
// were still running when Close stopped waiting for them.
var ErrClosed = fmt.Errorf("dotnet engine: %w", engines.ErrClosed)

// ErrNoRuntime is wrapped when no runtime to run .NET workers was found.
var ErrNoRuntime = errors.New("no .NET runtime found")
