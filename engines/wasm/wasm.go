// Package wasm owns the WebAssembly engine (MIME type application/wasm):
// worker code is a WebAssembly core module run inside the node's process
// by wazero (pure Go, no cgo), sandboxed: a module reaches only its own
// linear memory and the host functions the engine offers (logging and
// gateway calls, plus WASI without files, sockets or the node's
// environment), its memory is capped, and a call that exceeds its timeout
// is really stopped. Messages cross the boundary as the native engine's
// FlatBuffers (sdk/native/worker_api.fbs) through the module's memory. See
// README.md.
package wasm

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/virtufin/workmanager/engines"
)

// MIMEType is the worker MIME type this engine serves.
const MIMEType = engines.MIMEWasm

// Defaults used when the Config leaves a field zero.
const (
	DefaultTimeout = 30 * time.Second
	// DefaultMaxMemoryPages caps each instance's linear memory at 64 MiB
	// (pages of 64 KiB).
	DefaultMaxMemoryPages = 1024
	// DefaultMaxModuleBytes bounds the module bytes Check and Load
	// compile.
	DefaultMaxModuleBytes = 32 << 20
	// DefaultInstances is a worker's instances (calls at once) when its
	// Spec.MaxConcurrency is 0.
	DefaultInstances = 4
	// keepCompiled is how many compiled modules no Instance uses are kept
	// (most recent first) for the next Load of the same bytes.
	keepCompiled = 8
	// maxLogLine bounds one log line of a worker.
	maxLogLine = 64 << 10
)

// Config configures the engine. The zero value is usable.
type Config struct {
	// DefaultTimeout bounds one Process call when Spec.Timeout is 0.
	// Default 30s.
	DefaultTimeout time.Duration
	// Gateway serves the workers' gateway_call host function. Nil: the
	// call returns GatewayUnavailable.
	Gateway engines.Gateway
	// Logger receives the engine's own logs and, when Spec.Logger is nil,
	// the workers' log lines. Default slog.Default().
	Logger *slog.Logger
	// MaxReplyBytes bounds one call's response: its bytes and what
	// decoding it allocates (engines.ErrReplyTooLarge beyond). Default
	// engines.DefaultMaxReplyBytes.
	MaxReplyBytes int
	// MaxMemoryPages caps the linear memory of every instance, in pages
	// of 64 KiB (WASM_MAX_MEMORY_PAGES; default DefaultMaxMemoryPages, at
	// most 65536): a memory.grow past it fails (returns -1) and a module
	// whose declared minimum is above it does not load. A worker holds at
	// most its instances times this.
	MaxMemoryPages uint32
	// CacheDir is where compiled modules are kept on disk (wazero's
	// compilation cache; WASM_CACHE_DIR), shared by the node's restarts
	// and by nodes that share the directory. "": in memory only.
	CacheDir string
	// MaxModuleBytes bounds the module Check and Load compile, checked
	// before compiling. Default DefaultMaxModuleBytes.
	MaxModuleBytes int
	// Instances is a worker's instances, i.e. its calls at once, when
	// its Spec.MaxConcurrency is 0. Default DefaultInstances.
	Instances int
}

// Engine is the WebAssembly engine. It is safe for concurrent use.
type Engine struct {
	cfg Config

	once    sync.Once
	initErr error
	rt      wazero.Runtime
	cache   wazero.CompilationCache
	wasi    map[string]api.FunctionDefinition

	mu       sync.Mutex
	compiled map[[32]byte]*compiled
	unused   []*compiled // compiled modules no one holds, oldest first
	closed   bool
}

var (
	_ engines.Engine = (*Engine)(nil)
	_ engines.Closer = (*Engine)(nil)
)

// New returns a WebAssembly engine. The runtime is created at the first
// Check or Load.
func New(cfg Config) *Engine {
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = engines.DefaultMaxReplyBytes
	}
	if cfg.MaxMemoryPages == 0 || cfg.MaxMemoryPages > 65536 {
		cfg.MaxMemoryPages = DefaultMaxMemoryPages
	}
	if cfg.MaxModuleBytes <= 0 {
		cfg.MaxModuleBytes = DefaultMaxModuleBytes
	}
	if cfg.Instances <= 0 {
		cfg.Instances = DefaultInstances
	}
	return &Engine{cfg: cfg, compiled: map[[32]byte]*compiled{}}
}

// Info describes the engine.
func (e *Engine) Info() engines.Info {
	return engines.Info{
		Name:      "wasm",
		MIMETypes: []string{MIMEType},
		Capabilities: engines.Capabilities{
			InProcess:     true,
			Interruptible: true,
			ParallelCalls: e.cfg.Instances,
		},
	}
}

// runtime creates, once, the runtime every module of the engine runs in,
// with the memory cap, close-on-context-done and the compilation cache,
// and the host modules offered to them.
func (e *Engine) runtime() (wazero.Runtime, error) {
	e.once.Do(func() {
		ctx := context.Background()
		if e.cfg.CacheDir != "" {
			c, err := wazero.NewCompilationCacheWithDir(e.cfg.CacheDir)
			if err != nil {
				e.cfg.Logger.Warn("wasm engine: the compilation cache directory is not usable; compiled modules are kept in memory only",
					"dir", e.cfg.CacheDir, "error", err)
			} else {
				e.cache = c
			}
		}
		if e.cache == nil {
			e.cache = wazero.NewCompilationCache()
		}
		rc := wazero.NewRuntimeConfig().
			WithCloseOnContextDone(true).
			WithMemoryLimitPages(e.cfg.MaxMemoryPages).
			WithCompilationCache(e.cache)
		rt := wazero.NewRuntimeWithConfig(ctx, rc)
		if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
			e.initErr = fmt.Errorf("wasm engine: instantiating WASI: %w", err)
			return
		}
		if err := e.instantiateHost(ctx, rt); err != nil {
			e.initErr = fmt.Errorf("wasm engine: instantiating the %q host module: %w", HostModule, err)
			return
		}
		e.wasi = rt.Module(WASIModule).ExportedFunctionDefinitions()
		e.rt = rt
	})
	if e.initErr != nil {
		return nil, e.initErr
	}
	return e.rt, nil
}

// compiled is one module compiled in the engine's runtime, shared by the
// Checks and Loads of the same bytes.
type compiled struct {
	key   [32]byte
	ready chan struct{} // closed once cm or err is set
	cm    wazero.CompiledModule
	err   error
	refs  int
}

// acquire returns the compiled module of code, compiling it (once) when
// no one holds it; release gives it back.
func (e *Engine) acquire(ctx context.Context, code []byte) (*compiled, error) {
	if len(code) > e.cfg.MaxModuleBytes {
		return nil, invalidf("the module is %d bytes, more than the limit of %d", len(code), e.cfg.MaxModuleBytes)
	}
	if why := describeHeader(code); why != "" {
		return nil, invalidf("%s", why)
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return nil, errors.New("wasm engine: closed")
	}
	rt, err := e.runtime()
	if err != nil {
		return nil, err
	}
	key := sha256.Sum256(code)
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, errors.New("wasm engine: closed")
	}
	c, ok := e.compiled[key]
	if ok {
		c.refs++
		for i, u := range e.unused {
			if u == c {
				e.unused = append(e.unused[:i], e.unused[i+1:]...)
				break
			}
		}
		e.mu.Unlock()
		select {
		case <-c.ready:
		case <-ctx.Done():
			e.release(c)
			return nil, engines.ContextError(ctx, "wasm", "waiting for the module's compilation")
		}
		if c.err != nil {
			e.release(c)
			return nil, c.err
		}
		return c, nil
	}
	// The compilation holds a reference of its own and runs on even when
	// ctx ends first (wazero's compiler cannot be interrupted): its result
	// is kept for the next Check or Load of the same bytes.
	c = &compiled{key: key, ready: make(chan struct{}), refs: 2}
	e.compiled[key] = c
	e.mu.Unlock()
	go func() {
		c.cm, c.err = compile(context.WithoutCancel(ctx), rt, code, e.wasi)
		close(c.ready)
		e.release(c)
	}()
	select {
	case <-c.ready:
	case <-ctx.Done():
		e.release(c)
		return nil, engines.ContextError(ctx, "wasm", "compiling the module")
	}
	if c.err != nil {
		e.release(c)
		return nil, c.err
	}
	return c, nil
}

// compile compiles and validates code, unless its functions would take
// the compiler too long (scan.go).
func compile(ctx context.Context, rt wazero.Runtime, code []byte, wasi map[string]api.FunctionDefinition) (wazero.CompiledModule, error) {
	st, err := scanCode(code)
	if err != nil {
		// Most likely not a valid module: wazero's interpreter (a linear
		// pass) says what is wrong with it.
		irt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
		defer irt.Close(ctx)
		if _, ierr := irt.CompileModule(ctx, code); ierr != nil {
			return nil, invalidf("the module does not compile: %v", ierr)
		}
		return nil, invalidf("the module's code cannot be read: %v", err)
	}
	if st.cost > maxCompileCost {
		return nil, invalidf("the module's functions nest their blocks too deeply to compile in bounded time (deepest %d; nesting x blocks summed over its %d functions: %d, limit %d)",
			st.maxDepth, st.functions, st.cost, maxCompileCost)
	}
	cm, err := rt.CompileModule(ctx, code)
	if err != nil {
		return nil, invalidf("the module does not compile: %v", err)
	}
	if err := validate(cm, wasi); err != nil {
		_ = cm.Close(context.Background())
		return nil, err
	}
	return cm, nil
}

// release gives back a compiled module: the last holder keeps it among
// the unused ones (the oldest beyond keepCompiled are closed), or drops it
// when it failed.
func (e *Engine) release(c *compiled) {
	e.mu.Lock()
	c.refs--
	if c.refs > 0 {
		e.mu.Unlock()
		return
	}
	var drop []*compiled
	if c.err != nil || e.closed {
		delete(e.compiled, c.key)
		if c.cm != nil {
			drop = append(drop, c)
		}
	} else {
		e.unused = append(e.unused, c)
		for len(e.unused) > keepCompiled {
			old := e.unused[0]
			e.unused = e.unused[1:]
			delete(e.compiled, old.key)
			drop = append(drop, old)
		}
	}
	e.mu.Unlock()
	for _, d := range drop {
		_ = d.cm.Close(context.Background())
	}
}

// Check compiles code, checks it against the ABI and instantiates it
// once (its _initialize runs, abi_version is asked), then drops it.
func (e *Engine) Check(ctx context.Context, spec engines.Spec, code []byte) error {
	spec = spec.WithDefaults(e.cfg.DefaultTimeout, e.cfg.Logger)
	c, err := e.acquire(ctx, code)
	if err != nil {
		return err
	}
	defer e.release(c)
	in := e.newInstance(spec, c, 1)
	s, err := in.firstSlot(ctx)
	if err != nil {
		return err
	}
	in.dropSlot(s)
	return nil
}

// Load compiles code (or takes the compiled module a Check or another
// Load left) and returns an Instance with its first instance running.
func (e *Engine) Load(ctx context.Context, spec engines.Spec, code []byte) (engines.Instance, error) {
	spec = spec.WithDefaults(e.cfg.DefaultTimeout, e.cfg.Logger)
	c, err := e.acquire(ctx, code)
	if err != nil {
		return nil, err
	}
	n := spec.MaxConcurrency
	if n <= 0 {
		n = e.cfg.Instances
	}
	in := e.newInstance(spec, c, n)
	s, err := in.firstSlot(ctx)
	if err != nil {
		e.release(c)
		return nil, err
	}
	in.free = append(in.free, s)
	return in, nil
}

// Close closes the runtime, the compiled modules and the compilation
// cache (the directory stays). Close the Instances first.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	unused := e.unused
	e.unused = nil
	for _, c := range unused {
		delete(e.compiled, c.key)
	}
	e.mu.Unlock()
	ctx := context.Background()
	for _, c := range unused {
		_ = c.cm.Close(ctx)
	}
	var errs []error
	if e.rt != nil {
		errs = append(errs, e.rt.Close(ctx))
	}
	if e.cache != nil {
		errs = append(errs, e.cache.Close(ctx))
	}
	return errors.Join(errs...)
}
