// Package native owns the native engine (MIME type application/x-native-dll):
// worker code is a shared library (.so, .dylib, .dll) shipped in a zip
// package with a manifest, called through a small C ABI whose messages are
// FlatBuffers (sdk/native/worker_api.fbs, sdk/native/virtufin_worker_api.h).
//
// By default the library is loaded into the WorkManager process with purego
// (no cgo): calls cost well under a microsecond of overhead, but a crash in
// the library ends the process and a call that hangs cannot be stopped. The
// opt-in process isolation hosts the same library in a small child process
// (cmd/native-host) that speaks the same FlatBuffers messages over pipes and
// is killed and restarted on a timeout or a crash. See README.md.
package native

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/crashjournal"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/spares"
	"github.com/virtufin/workmanager/engines/lull"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// MIMEType is the worker MIME type this engine serves.
const MIMEType = engines.MIMENativeDLL

// Isolation says where a worker library runs.
type Isolation string

const (
	// IsolationInProcess loads the library into the WorkManager process.
	IsolationInProcess Isolation = "in-process"
	// IsolationProcess hosts the library in a native-host child process.
	IsolationProcess Isolation = "process"
)

// Defaults used when the Config leaves a field zero.
const (
	DefaultTimeout       = 30 * time.Second
	DefaultLoadTimeout   = 30 * time.Second
	DefaultHostProcesses = 1
	// DefaultMaxAbandonedCalls is Config.MaxAbandonedCalls's default.
	DefaultMaxAbandonedCalls = 4
)

// Config configures the engine. The zero value is usable (in-process, no
// gateway).
type Config struct {
	// DefaultTimeout bounds one Process call when Spec.Timeout is 0.
	// Default 30s.
	DefaultTimeout time.Duration
	// Gateway serves the workers' gateway_call host function. Nil: the
	// call returns VIRTUFIN_GATEWAY_UNAVAILABLE.
	Gateway engines.Gateway
	// GatewayTimeout bounds one gateway call. Default: the worker's
	// timeout. In process isolation the calling event's deadline bounds it
	// too; in process it cannot (engine_ptr identifies the worker, not the
	// call), so there a gateway call may outlast a timed-out event.
	GatewayTimeout time.Duration
	// TempDir is where packages are extracted (one fresh directory per
	// Check and per Load, removed when done). It must allow executable
	// mappings (not mounted noexec). Default os.TempDir().
	TempDir string
	// Isolation is the mode of every worker: IsolationInProcess (default)
	// or IsolationProcess. A worker can also ask for IsolationProcess in its
	// manifest ("isolation": "process"); that needs HostPath.
	Isolation Isolation
	// MaxAbandonedCalls bounds, per loaded in-process worker, the calls that
	// timed out and are still running in native code (each keeps an OS
	// thread until it returns). Since any call may hang, it bounds the
	// worker's calls in native code at once: a call past it waits for one
	// to return (until its own deadline; it has not started). Once that
	// many calls were abandoned, the worker's calls fail at once with a
	// worker-failed error that says so, instead of leaking threads until
	// the node dies; they work again when an abandoned call returns.
	// Default 4. Process isolation has no such limit (a timed-out host
	// process is killed).
	MaxAbandonedCalls int
	// HostPath is the native-host executable (cmd/native-host) used for
	// process isolation.
	HostPath string
	// HostArgs are extra arguments put before the host's own (for a
	// HostPath that is a wrapper, e.g. "prlimit" or "nice").
	HostArgs []string
	// MaxExtractedBytes bounds the disk all extracted packages of this
	// engine use at a time (NATIVE_MAX_EXTRACTED_BYTES; 0: unbounded): a
	// Check or Load past it fails and says so.
	MaxExtractedBytes int64
	// HostEnv holds extra KEY=VALUE entries for host processes, on top of
	// the WorkManager's environment (and below VIRTUFIN_WORKER_*).
	HostEnv []string
	// Sandbox, when set, runs every host process (the load check of every
	// package, and isolated workers) inside the OS layers
	// (engines/sandbox), with only HostEnv and VIRTUFIN_WORKER_* for
	// environment. The load check then always runs in a sandboxed host,
	// never by dlopen in this process.
	Sandbox *sandbox.Sandbox
	// HostProcesses is the number of host processes per loaded worker in
	// process isolation, i.e. the calls it runs in parallel. Default 1.
	HostProcesses int
	// LoadTimeout bounds starting a host process and loading the library
	// in it. Default 30s.
	LoadTimeout time.Duration
	// Logger receives the engine's own logs and, when Spec.Logger is nil,
	// the workers' log lines. Default slog.Default().
	Logger *slog.Logger
	// MaxReplyBytes bounds one call's response: its bytes, what decoding
	// it allocates and, in process isolation, every frame read from the
	// host. A response over it fails the call (engines.ErrReplyTooLarge).
	// Default engines.DefaultMaxReplyBytes; builtin sets
	// engines.ReplyLimit of the node's output limits.
	MaxReplyBytes int
	// Journal, when set, records every in-process call in flight (worker
	// and event) so that the node's next start knows which calls were
	// running when a worker crashed it (engines/crashjournal). Nil: none.
	Journal *crashjournal.Journal
	// OnRestart, when set, learns of each host process (process isolation) restarted after a
	// crash or a timeout (procpool.Config.OnRestart): reason is a short
	// fixed text ("timeout", "process exited", …), err the restart's error
	// (nil: it runs again). Keep it cheap.
	OnRestart func(reason string, err error)
	// SpareCheckHosts is how many sandboxed hosts the engine keeps started
	// ahead of need for the load check of uploaded packages
	// (NATIVE_SPARE_CHECK_HOSTS; spare.go), when Sandbox and HostPath are
	// set. 0: none (each Check starts a host of its own).
	SpareCheckHosts int
	// ParkTTL is how long the host that checked a process-isolated
	// worker's package waits, loaded, for the Load of the same worker and
	// code that usually follows (procpool.Parking; Engine.park). 0:
	// DefaultParkTTL; negative: every checking host exits at once.
	ParkTTL time.Duration
}

// DefaultParkTTL and DefaultParkMax bound the hosts a Check keeps for
// the Load: as the Python engine's runners.
const (
	DefaultParkTTL = 30 * time.Second
	DefaultParkMax = 32
)

// Engine is the native engine. It is safe for concurrent use.
type Engine struct {
	cfg Config

	diskMu    sync.Mutex
	diskUsed  int64
	diskByDir map[string]int64

	spareHosts  *spares.Set[*spareHost]
	spareSeq    atomic.Uint64
	spareChecks atomic.Int64 // checks a spare answered (tests)

	parking procpool.Parking[procpool.Key, *hostProc]
	owner   extractOwner // where extraction directories are made (owner.go)

	retiring sync.WaitGroup // check hosts exiting in the background (park)
	// waiting are the check hosts' exits that wait for the node's calls
	// to pause (retireLater).
	waitMu  sync.Mutex
	waiting map[*lull.Timer]func()

	parkedLoads atomic.Int64 // loads that took the host their check loaded (tests)
	spareLoads  atomic.Int64 // loads whose first host was a spare (tests)
}

var _ engines.Engine = (*Engine)(nil)

// New returns a native engine. Nothing is loaded until Check or Load.
func New(cfg Config) *Engine {
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultTimeout
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = DefaultLoadTimeout
	}
	if cfg.HostProcesses <= 0 {
		cfg.HostProcesses = DefaultHostProcesses
	}
	if cfg.MaxAbandonedCalls <= 0 {
		cfg.MaxAbandonedCalls = DefaultMaxAbandonedCalls
	}
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = engines.DefaultMaxReplyBytes
	}
	if cfg.Isolation == "" {
		cfg.Isolation = IsolationInProcess
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ParkTTL == 0 {
		cfg.ParkTTL = DefaultParkTTL
	}
	e := &Engine{cfg: cfg}
	e.spareHosts = e.newSpareHosts()
	if cfg.ParkTTL > 0 {
		e.parking.TTL, e.parking.Max = cfg.ParkTTL, DefaultParkMax
	}
	return e
}

// Close implements engines.Closer: the spare check hosts and the hosts
// parked for a Load exit.
func (e *Engine) Close() error {
	e.spareHosts.Close()
	e.parking.Close()
	e.retireNow()
	e.retiring.Wait()
	e.owner.close()
	return nil
}

// Info implements engines.Engine. With in-process isolation (the default)
// the capabilities are those of in-process workers (at most
// MaxAbandonedCalls calls of one worker in native code at once): a
// worker's manifest may still ask for process isolation, which only makes
// it safer.
func (e *Engine) Info() engines.Info {
	caps := engines.Capabilities{InProcess: true, Interruptible: false, ParallelCalls: e.cfg.MaxAbandonedCalls}
	if e.cfg.Isolation == IsolationProcess {
		caps = engines.Capabilities{InProcess: false, Interruptible: true, ParallelCalls: e.cfg.HostProcesses}
	}
	return engines.Info{Name: "native", MIMETypes: []string{MIMEType}, Capabilities: caps}
}

// isolation is the mode for one worker.
func (e *Engine) isolation(m *Manifest) Isolation {
	if e.cfg.Isolation == IsolationProcess || m.Isolation == IsolationProcess {
		return IsolationProcess
	}
	return IsolationInProcess
}

// Check implements engines.Engine: it checks the package, and loads the
// library (in a host process with process isolation) to check that it links
// and has the ABI's exports, then unloads it. Loading runs the library's
// initialisers.
func (e *Engine) Check(ctx context.Context, spec engines.Spec, code []byte) error {
	spec = spec.WithDefaults(e.cfg.DefaultTimeout, e.cfg.Logger)
	p, err := openPackage(code, hostRID)
	if err != nil {
		return err
	}
	if e.isolation(p.manifest) == IsolationProcess || e.cfg.Sandbox != nil {
		// An uploaded library's constructors must not run in the node
		// before the package is known to load.
		return e.checkInHost(ctx, spec, p, procpool.KeyOf(spec, code))
	}
	dir, libPath, err := e.extract(p, "")
	if err != nil {
		return err
	}
	defer e.removeExtracted(dir)
	env := pushIdentity(spec.WorkerID, spec.Group, spec.Topic)
	defer popIdentity(env)
	lib, err := openLibrary(libPath, p.manifest)
	if err != nil {
		return err
	}
	return lib.Close()
}

// Load implements engines.Engine.
func (e *Engine) Load(ctx context.Context, spec engines.Spec, code []byte) (engines.Instance, error) {
	spec = spec.WithDefaults(e.cfg.DefaultTimeout, e.cfg.Logger)
	p, err := openPackage(code, hostRID)
	if err != nil {
		return nil, err
	}
	abiSpec, _ := loader.LookupABI(p.manifest.ABIVersion)
	if abiSpec.Deprecated {
		spec.Logger.Warn("native worker uses a deprecated ABI version; it will be refused by the next release",
			"worker_id", spec.WorkerID, "abi_version", abiSpec.Version, "current", CurrentABI)
	}
	if e.isolation(p.manifest) == IsolationProcess {
		return e.loadInHost(ctx, spec, p, procpool.KeyOf(spec, code))
	}
	return e.loadInProcess(spec, p, abiSpec)
}

// extract writes the library for this platform into a fresh directory.
// Each load gets its own directory: dlopen returns the existing handle for
// a path that is already loaded, so reusing a path would not load new code.
// extract unpacks p into a fresh directory; owner, when set, is the worker
// whose sandboxed host will read it (it gets the files).
func (e *Engine) extract(p *pkg, owner string) (dir, lib string, err error) {
	dir, err = e.mkdir()
	if err != nil {
		return "", "", fmt.Errorf("native engine: creating the extraction directory: %w", err)
	}
	lib, size, err := p.extract(dir)
	if err == nil {
		err = e.reserveDisk(dir, size)
	}
	if err == nil && owner != "" && e.cfg.Sandbox != nil {
		err = e.cfg.Sandbox.Own(dir, owner)
	}
	if err != nil {
		e.removeExtracted(dir)
		return "", "", err
	}
	return dir, lib, nil
}

// reserveDisk counts size bytes extracted into dir against
// Config.MaxExtractedBytes.
func (e *Engine) reserveDisk(dir string, size int64) error {
	e.diskMu.Lock()
	defer e.diskMu.Unlock()
	if max := e.cfg.MaxExtractedBytes; max > 0 && e.diskUsed+size > max {
		return fmt.Errorf("native engine: the package needs %d bytes on disk, and the packages loaded on this node already use %d of NATIVE_MAX_EXTRACTED_BYTES (%d)",
			size, e.diskUsed, max)
	}
	if e.diskByDir == nil {
		e.diskByDir = map[string]int64{}
	}
	e.diskByDir[dir] = size
	e.diskUsed += size
	return nil
}

// removeExtracted deletes an extraction directory and gives its bytes back.
func (e *Engine) removeExtracted(dir string) error {
	err := os.RemoveAll(dir)
	e.releaseDisk(dir)
	return err
}

// releaseDisk gives back the bytes reserved for dir.
func (e *Engine) releaseDisk(dir string) {
	e.diskMu.Lock()
	e.diskUsed -= e.diskByDir[dir]
	delete(e.diskByDir, dir)
	e.diskMu.Unlock()
}

// openLibrary loads a package's library into this process. A library that
// does not load or lacks an export is invalid code.
func openLibrary(path string, m *Manifest) (*loader.Library, error) {
	lib, err := loader.Open(path, loader.Exports{Library: m.Library, Process: m.EntryPoint, FreeResult: m.FreeResult, ABIVersion: m.ABIVersion})
	var le *loader.LibraryError
	if errors.As(err, &le) {
		return nil, invalidf("%s", le.Error())
	}
	return lib, err
}

func (e *Engine) gatewayTimeout(spec engines.Spec) time.Duration {
	if e.cfg.GatewayTimeout > 0 {
		return e.cfg.GatewayTimeout
	}
	return spec.Timeout
}

// retireLater runs retire (a check host's exit) once the node's calls
// pause (lull.Node: checkRetireSettle, at most checkRetireMax later), not
// beside the rest of the call whose check it ran: a sandboxed host's exit
// and its sandbox's teardown took the CPU that call's store writes and
// load need (an in-process create's, timed in the node on the real stack:
// the code's store write 4.7 → 2.4 ms, the placement's reads 5.2 → 3.1,
// the load 10.5 → 8.8). Close runs the ones still waiting (retireNow).
func (e *Engine) retireLater(retire func()) {
	e.retiring.Add(1)
	e.waitMu.Lock()
	defer e.waitMu.Unlock()
	if e.waiting == nil {
		e.waiting = map[*lull.Timer]func(){}
	}
	var t *lull.Timer
	run := func() {
		e.waitMu.Lock()
		delete(e.waiting, t)
		e.waitMu.Unlock()
		defer e.retiring.Done()
		retire()
	}
	t = lull.Node.After(checkRetireSettle, checkRetireMax, run)
	e.waiting[t] = run
}

// retireNow runs the exits retireLater holds (Close).
func (e *Engine) retireNow() {
	e.waitMu.Lock()
	var now []func()
	for t, run := range e.waiting {
		if t.Stop() {
			now = append(now, run)
		}
	}
	e.waitMu.Unlock()
	for _, run := range now {
		go run()
	}
}

// checkRetireSettle is how long the node's calls pause before a check
// host waiting to exit exits (spares.SettleAfterTake's, as the spare that
// replaces it); checkRetireMax bounds the wait under calls that never
// pause (the host holds about 2 MiB while it waits).
const (
	checkRetireSettle = spares.SettleAfterTake
	checkRetireMax    = time.Second
)
