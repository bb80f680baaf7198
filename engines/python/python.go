// Package python owns the Python engine (MIME type text/x-python): it runs
// worker code in persistent CPython subprocesses driven over a framed binary
// pipe protocol (see README.md and runner.py), forked from a fork server
// where the sandbox allows it (forkserver.go, forkserver.py).
package python

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/spares"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// MIMEType is the worker MIME type this engine serves.
const MIMEType = engines.MIMEPython

//go:embed runner.py
var runnerSource string

// Defaults used when the Config leaves a field zero.
const (
	DefaultProcesses   = 1
	DefaultTimeout     = 30 * time.Second
	DefaultLoadTimeout = 60 * time.Second
	DefaultSpinWait    = 50 * time.Microsecond
	DefaultMaxBatch    = 16
	DefaultSlowEvent   = 2 * time.Millisecond
	DefaultParkTTL     = 30 * time.Second
	// MaxSpares bounds Config.Spares (PYTHON_SPARE_RUNNERS).
	MaxSpares      = 16
	DefaultParkMax = 32
	// DefaultMaxConcurrency bounds the events an async def worker runs at
	// once on its runner's event loop (PYTHON_MAX_CONCURRENCY).
	DefaultMaxConcurrency = 16
	// DefaultMaxProcesses bounds the runners a plain def worker gets on
	// demand (PYTHON_MAX_PROCESSES).
	DefaultMaxProcesses = 4
	// DefaultIdleRetire is how long a runner started on demand stays idle
	// before it is retired.
	DefaultIdleRetire = 30 * time.Second
	// MaxConcurrencyLimit and MaxProcessesLimit bound the per-worker
	// settings (and the cluster defaults).
	MaxConcurrencyLimit = 256
	MaxProcessesLimit   = 16
)

// closeGrace is how long Close lets an idle runner exit on its own (it sees
// EOF on its request pipe) before it is killed.
const closeGrace = 2 * time.Second

// Config configures the engine. The zero value is usable.
type Config struct {
	// Interpreter is the python executable. Default: the real interpreter
	// behind "python3" on PATH, resolved once with
	// `python3 -c "import sys; print(sys.executable)"` (python3 on PATH may be
	// a pyenv shim that costs ~100 ms per start).
	Interpreter string
	// Processes is the number of subprocesses a loaded Instance starts
	// and keeps (PYTHON_PROCESSES). Default 1.
	Processes int
	// MaxProcesses is how many subprocesses an Instance may have: beyond
	// Processes, one more is started when every process is busy, a call
	// waits and the last event was slow (over SlowEvent), and retired after
	// IdleRetire without a call. Spec.MaxProcesses overrides it per
	// worker. Default 4 (PYTHON_MAX_PROCESSES).
	MaxProcesses int
	// IdleRetire: see MaxProcesses. Default 30s.
	IdleRetire time.Duration
	// ParkAfter, when above 0, stops every runner of a worker that got no
	// event for that long (PYTHON_PARK_AFTER): an idle worker then holds
	// no process, and its next event waits for a runner's start (about
	// 0.4 s sandboxed). 0 (default): a worker keeps Processes runners.
	ParkAfter time.Duration
	// MaxConcurrency is how many events an async def worker runs at once
	// on its runner's event loop (the runner accepts the next event while
	// others await). Spec.MaxConcurrency overrides it per worker. 1: one
	// at a time, as a plain worker. Default 16 (PYTHON_MAX_CONCURRENCY).
	MaxConcurrency int
	// CancelGrace is how long a timed-out or cancelled call of an async
	// worker has to end after its task is cancelled before the runner (and
	// every call in it) is killed. Default 2s.
	CancelGrace time.Duration
	// DefaultTimeout bounds one Process call when Spec.Timeout is 0.
	// Default 30s.
	DefaultTimeout time.Duration
	// LoadTimeout bounds starting one subprocess and loading the code into it
	// (Check, Load and restarts). Default 60s.
	LoadTimeout time.Duration
	// SpinWait is how long a call busy-polls for the worker's reply before
	// it sleeps in the runtime poller. Waking a sleeping thread costs ~10 µs
	// or more on small VMs, twice per call; spinning avoids that for fast
	// workers. It is used only while replies usually come within SpinWait,
	// and by at most NumCPU/2 calls at a time. Default 50µs; negative
	// disables it.
	SpinWait time.Duration
	// MaxBatch is how many of an Instance's calls that wait for a process
	// one process takes at a time: the first caller to get a process sends
	// the waiting calls' events with its own in one write, and the runner
	// answers them in one write (see batch.go). Waking a process costs more
	// than a small event's work on small VMs. Default 16; 1 turns batching
	// off.
	MaxBatch int
	// SlowEvent: after an event that took longer than this, calls go to
	// the process one at a time until one is faster again. Batching gains
	// nothing on slow events, and a batch of them would run (and hold a
	// stopping worker) for their sum. Default 2ms, the runner's hold limit.
	SlowEvent time.Duration
	// AllowedPackages are top-level packages (or dotted modules) a worker may
	// import beyond the safe standard library subset (PYTHON_ALLOWED_PACKAGES;
	// see runner.py's SAFE_STDLIB and docs/security.md). Allowing
	// "subprocess", "socket" or "ctypes" also lifts the audit hook's refusal
	// of processes and signals, sockets, or native code.
	AllowedPackages []string
	// DevKitDir holds the DevKit package (virtufin_worker, sdk/python) that
	// every worker may import without shipping it: appended to the
	// runner's sys.path and bound read-only into the sandbox. Empty: no
	// DevKit.
	DevKitDir string
	// Gateway serves the workers' virtufin_host.call_gateway (nil: calls
	// fail with "no gateway is configured"); calls are held to
	// Spec.GatewayTargets and carry the call's fence (engines.FenceFrom).
	Gateway engines.Gateway
	// Sandbox, when set, wraps every runner process in the OS layers
	// (engines/sandbox); the process then gets only Env and the
	// VIRTUFIN_WORKER_* variables, not the node's environment. Nil: the
	// runner runs as the node, with the node's environment (tests, SANDBOX
	// unset in embedders).
	Sandbox *sandbox.Sandbox
	// Env holds extra KEY=VALUE entries for every worker process, on top of
	// the WorkManager's own environment (and below VIRTUFIN_WORKER_*).
	Env []string
	// Logger receives the engine's own logs (restarts) and, when Spec.Logger
	// is nil, the workers' output. Default slog.Default().
	Logger *slog.Logger
	// OnRestart, when set, learns of each worker process restarted after a
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
	// ParkTTL and ParkMax bound the runners that Check keeps for the Load
	// of the same worker and code (procpool.Parking): a create or a reload
	// then starts one runner instead of two. Defaults 30s and 32;
	// ParkTTL negative turns it off.
	ParkTTL time.Duration
	ParkMax int
	// Spares is how many runners the engine keeps started ahead of need,
	// for no worker yet (spare.go, PYTHON_SPARE_RUNNERS): a create, start
	// or reload takes one instead of starting an interpreter. Each is
	// given to one worker once. 0 (the default here; the node's default
	// is 2): none.
	Spares int
	// NoForkServer starts every runner through the sandbox's chain of
	// programs (PYTHON_FORK_SERVER=false). By default, where the sandbox
	// is Forkable, runners are forked from a fork server that imported
	// the runner's modules once (forkserver.go).
	NoForkServer bool
}

// Engine is the Python engine. It is safe for concurrent use.
type Engine struct {
	cfg Config

	interpMu sync.Mutex
	interp   string

	probeOnce sync.Once
	probed    interpInfo
	probeErr  error

	parking procpool.Parking[procpool.Key, *proc]

	spares *spares.Set[*proc]

	fsMu      sync.Mutex
	fs        *forkServer // nil until the first runner forked
	fsInterp  string
	fsStarted time.Time
	fsClosed  bool
}

var _ engines.Engine = (*Engine)(nil)

// New returns a Python engine. Nothing is started until Check or Load.
func New(cfg Config) *Engine {
	if cfg.Processes <= 0 {
		cfg.Processes = DefaultProcesses
	}
	if cfg.MaxProcesses <= 0 {
		cfg.MaxProcesses = DefaultMaxProcesses
	}
	if cfg.IdleRetire <= 0 {
		cfg.IdleRetire = DefaultIdleRetire
	}
	if cfg.MaxConcurrency <= 0 {
		cfg.MaxConcurrency = DefaultMaxConcurrency
	}
	if cfg.CancelGrace <= 0 {
		cfg.CancelGrace = 2 * time.Second
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultTimeout
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = DefaultLoadTimeout
	}
	if cfg.SpinWait == 0 {
		cfg.SpinWait = DefaultSpinWait
	}
	if cfg.SlowEvent <= 0 {
		cfg.SlowEvent = DefaultSlowEvent
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = engines.DefaultMaxReplyBytes
	}
	if cfg.ParkTTL == 0 {
		cfg.ParkTTL = DefaultParkTTL
	}
	if cfg.ParkMax <= 0 {
		cfg.ParkMax = DefaultParkMax
	}
	e := &Engine{cfg: cfg}
	e.parking.TTL, e.parking.Max = cfg.ParkTTL, cfg.ParkMax
	e.spares = spares.New(cfg.Spares, cfg.Sandbox, func() (*proc, error) { return e.startSpare(e.spareInterp()) },
		cfg.Logger, "python engine: a spare runner")
	return e
}

// Info implements engines.Engine.
func (e *Engine) Info() engines.Info {
	return engines.Info{
		Name:      "python",
		MIMETypes: []string{MIMEType},
		Capabilities: engines.Capabilities{
			InProcess:     false,
			Interruptible: true,
			ParallelCalls: max(e.cfg.Processes, e.cfg.MaxProcesses),
		},
	}
}

// Check implements engines.Engine: it starts one runner and loads the code
// into it, then parks the runner for a Load of the same worker and code
// (Config.ParkTTL; retired if none comes).
func (e *Engine) Check(ctx context.Context, spec engines.Spec, code []byte) error {
	spec = spec.WithDefaults(e.cfg.DefaultTimeout, e.cfg.Logger)
	interp, err := e.interpreter(ctx)
	if err != nil {
		return err
	}
	p, err := e.startLoaded(ctx, spec, interp, code, nil)
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

// Close retires the runners parked by Check and the spares
// (engines.Closer). Loaded
// Instances are closed by their owners.
func (e *Engine) Close() error {
	e.parking.Close()
	e.spares.Close()
	e.fsMu.Lock()
	e.fsClosed = true
	if e.fs != nil {
		e.fs.stop()
	}
	e.fsMu.Unlock()
	return nil
}

// Load implements engines.Engine: it starts Config.Processes runners with the
// code loaded and keeps them running until the Instance is closed; more
// start on demand (Config.MaxProcesses).
func (e *Engine) Load(ctx context.Context, spec engines.Spec, code []byte) (engines.Instance, error) {
	spec = spec.WithDefaults(e.cfg.DefaultTimeout, e.cfg.Logger)
	interp, err := e.interpreter(ctx)
	if err != nil {
		return nil, err
	}
	in := newInstance(e, spec, interp, code)
	if spec.Parked && e.cfg.ParkAfter > 0 {
		in.pool.FillParked() // its first event starts a runner
		return in, nil
	}
	// An invalid-code error says what is wrong with the code: it is
	// preferred over start-up failures.
	if err := procpool.FirstError(in.pool.Fill(ctx), engines.ErrInvalidCode); err != nil {
		return nil, err
	}
	return in, nil
}

// interpreter returns the python executable, resolving the default once.
func (e *Engine) interpreter(ctx context.Context) (string, error) {
	if e.cfg.Interpreter != "" {
		return e.cfg.Interpreter, nil
	}
	e.interpMu.Lock()
	defer e.interpMu.Unlock()
	if e.interp != "" {
		return e.interp, nil
	}
	p, err := resolveDefaultInterpreter(ctx)
	if err != nil {
		return "", err
	}
	e.interp = p
	return p, nil
}

// interpInfo is what the engine asks its interpreter once (probe).
type interpInfo struct {
	// ro are the host paths a sandboxed runner must read: sys.prefix and
	// sys.base_prefix (a virtualenv and its base), the directory of the
	// executable and of the real one behind it, and the DevKit.
	ro []string
	// path is the interpreter's sys.path as a normal isolated start (-I)
	// makes it: the standard library, site-packages and the directories
	// that site-packages' .pth files list. The runner starts with -S (no
	// site module: a start costs ~0.1 CPU-second less where a .pth file
	// imports packages, and no .pth code runs in a worker's process) and
	// sets this path itself; it is the runner's argument, as JSON.
	path string
	// runner is runner.py compiled by this interpreter, as marshal
	// writes the code object: runners start from it (runnerArgs) instead
	// of compiling the source each time, about 7 ms of CPU per runner
	// start here. nil when the probe could not make it: runners then get
	// the source.
	runner []byte
	// hexversion is the probed interpreter's sys.hexversion.
	hexversion int64
	// runnerFile, when set, holds runner in the DevKit's directory, which
	// every runner reads anyway: runners then read the code from it and
	// their command line stays short (instead of 85 KB of base64 in every
	// `ps` line and through every exec of the sandbox's chain).
	runnerFile string
}

// runnerFileName is the name of the compiled runner in the DevKit's
// directory: what it was compiled from and by which interpreter version
// (nodes of other builds or interpreters may share the directory).
func runnerFileName(hexversion int64) string {
	sum := sha256.Sum256([]byte(runnerSource))
	return fmt.Sprintf(".runner-%x-%x.marshal", sum[:8], hexversion)
}

// writeRunnerFile writes code to path (atomically: another node sharing
// the directory may be writing the same file), readable by every user.
func writeRunnerFile(path string, code []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".runner-tmp-")
	if err != nil {
		return err
	}
	_, werr := f.Write(code)
	cerr := f.Close()
	if err := errors.Join(werr, cerr, os.Chmod(f.Name(), 0o644)); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// runnerFileReady reports whether info's runner file can be used, writing
// it again when it went missing (a temporary directory cleaned under the
// node).
func (info interpInfo) runnerFileReady() bool {
	if info.runnerFile == "" {
		return false
	}
	if _, err := os.Stat(info.runnerFile); err == nil {
		return true
	}
	return writeRunnerFile(info.runnerFile, info.runner) == nil
}

// probeScript is what the probe runs (-I, as a runner, without -S): the
// interpreter's prefixes and sys.path, and runner.py (read from stdin)
// compiled as `python -c` compiles it (file name "<string>", the
// interpreter's own optimisation level, no inherited future flags).
const probeScript = `import binascii, json, marshal, sys
try:
    code = compile(sys.stdin.buffer.read(), "<string>", "exec", dont_inherit=True)
    runner = binascii.b2a_base64(marshal.dumps(code), newline=False).decode("ascii")
except Exception:
    runner = ""
print(json.dumps({"prefix": sys.prefix, "base_prefix": sys.base_prefix, "path": sys.path, "runner": runner, "hexversion": sys.hexversion}))`

// maxRunnerArg bounds the compiled runner on the command line (in
// base64): one argument of a process may hold at most 128 KiB on Linux
// (MAX_ARG_STRLEN).
const maxRunnerArg = 120 << 10

// runnerBootstrap is the program a runner starts with when it has the
// compiled runner: load is the Python expression that reads the
// marshalled code, hexversion sys.hexversion of the interpreter that
// compiled it. It runs the code in the same namespace (__main__'s) as `-c
// <source>` would, binding no name of its own. A code object is only good
// for the interpreter version that made it: an interpreter replaced under
// the running node (a virtualenv upgraded in place) exits saying so,
// instead of failing on the code.
func runnerBootstrap(load string, hexversion int64) string {
	return fmt.Sprintf(`exec(__import__("marshal").loads(%s)) if __import__("sys").hexversion == %d else __import__("sys").exit("the Python interpreter changed since the node compiled its runner with it (version %#x, now %%#x): restart the node" %% __import__("sys").hexversion)`, load, hexversion, hexversion)
}

// runnerArgs are the interpreter's arguments that start runner.py (-c and
// what follows, before the runner's own arguments): the compiled runner
// read from runnerFile, or taken (in base64) from the first argument,
// which the bootstrap removes, leaving the arguments as runner.py reads
// them; else the source.
func (info interpInfo) runnerArgs() []string {
	if info.runnerFileReady() {
		path, _ := json.Marshal(info.runnerFile) // a JSON string is a Python string literal
		return []string{"-c", runnerBootstrap(fmt.Sprintf(`open(%s, "rb").read()`, path), info.hexversion)}
	}
	if arg := base64.StdEncoding.EncodeToString(info.runner); info.runner != nil && len(arg) <= maxRunnerArg {
		return []string{"-c", runnerBootstrap(`__import__("binascii").a2b_base64(__import__("sys").argv.pop(1))`, info.hexversion), arg}
	}
	return []string{"-c", runnerSource}
}

// probe asks interp, once per Engine, for its prefixes and sys.path.
func (e *Engine) probe(ctx context.Context, interp string) (interpInfo, error) {
	e.probeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		probe := exec.CommandContext(ctx, interp, "-I", "-c", probeScript)
		probe.Stdin = strings.NewReader(runnerSource)
		out, err := probe.Output()
		if err != nil {
			e.probeErr = fmt.Errorf("python engine: asking %s for its prefix and path: %w", interp, err)
			return
		}
		var got struct {
			Prefix     string   `json:"prefix"`
			BasePrefix string   `json:"base_prefix"`
			Path       []string `json:"path"`
			Runner     string   `json:"runner"`
			HexVersion int64    `json:"hexversion"`
		}
		if err := json.Unmarshal(out, &got); err != nil {
			e.probeErr = fmt.Errorf("python engine: %s answered %q to the prefix and path probe: %w", interp, out, err)
			return
		}
		path, err := json.Marshal(got.Path)
		if err != nil {
			e.probeErr = fmt.Errorf("python engine: %w", err)
			return
		}
		e.probed.path = string(path)
		if code, err := base64.StdEncoding.DecodeString(got.Runner); err == nil && len(code) > 0 && got.HexVersion > 0 {
			e.probed.runner, e.probed.hexversion = code, got.HexVersion
			if e.cfg.DevKitDir != "" {
				path := filepath.Join(e.cfg.DevKitDir, runnerFileName(got.HexVersion))
				if err := writeRunnerFile(path, code); err != nil {
					e.cfg.Logger.Warn("python engine: the compiled runner could not be written next to the DevKit; runners get it on their command line", "err", err)
				} else {
					e.probed.runnerFile = path
				}
			}
		}
		seen := map[string]bool{}
		add := func(p string) {
			if p = filepath.Clean(p); p != "/" && p != "." && !seen[p] {
				seen[p] = true
				e.probed.ro = append(e.probed.ro, p)
			}
		}
		add(got.Prefix)
		add(got.BasePrefix)
		add(filepath.Dir(interp))
		if real, err := filepath.EvalSymlinks(interp); err == nil {
			add(filepath.Dir(real))
		}
		if e.cfg.DevKitDir != "" {
			add(e.cfg.DevKitDir)
		}
	})
	return e.probed, e.probeErr
}

// The default interpreter is resolved once per process (not per Engine): the
// pyenv shim lookup costs ~100 ms.
var defaultInterp struct {
	mu   sync.Mutex
	path string
}

func resolveDefaultInterpreter(ctx context.Context) (string, error) {
	defaultInterp.mu.Lock()
	defer defaultInterp.mu.Unlock()
	if defaultInterp.path != "" {
		return defaultInterp.path, nil
	}
	shim, err := exec.LookPath("python3")
	if err != nil {
		return "", fmt.Errorf("python engine: no python3 on PATH: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, shim, "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		return "", fmt.Errorf("python engine: resolving the python3 interpreter: %w", err)
	}
	p := strings.TrimSpace(string(out))
	if p == "" {
		p = shim // sys.executable can be empty in odd embeddings
	}
	defaultInterp.path = p
	return p, nil
}

// ValidatePackages checks PYTHON_ALLOWED_PACKAGES entries: dotted Python
// identifiers such as "numpy" or "xml.etree".
func ValidatePackages(names []string) error {
	for _, n := range names {
		if !packageName.MatchString(n) {
			return fmt.Errorf("%q is not a Python module name (letters, digits and _ separated by dots, not starting with a digit)", n)
		}
	}
	return nil
}

var packageName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
