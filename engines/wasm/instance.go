package wasm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/sys"

	"github.com/virtufin/workmanager/engines"
)

// Instance is one loaded version of a worker: a pool of module instances
// of one compiled module, each running one call at a time, created as
// calls need them up to the worker's concurrency. A call that traps, exits
// or times out drops its module instance (no state of it survives); the
// next call gets a fresh one.
type Instance struct {
	e    *Engine
	spec engines.Spec
	comp *compiled
	wlog *slog.Logger
	mc   wazero.ModuleConfig
	max  int

	// sem holds a token per call that has (or is creating) a module
	// instance: at most max.
	sem chan struct{}

	mu       sync.Mutex
	free     []*slot            // idle module instances, the most recently used last
	busy     map[*slot]struct{} // slots running a call
	inflight int
	closing  bool
	drained  chan struct{} // closed when closing and no call is in flight
	released bool
}

var (
	_ engines.Instance   = (*Instance)(nil)
	_ engines.Concurrent = (*Instance)(nil)
)

func (e *Engine) newInstance(spec engines.Spec, c *compiled, n int) *Instance {
	wlog := spec.Logger.With("worker_id", spec.WorkerID)
	mc := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(). // _initialize is called by the engine, with the call's deadline
		WithEnv("VIRTUFIN_WORKER_ID", spec.WorkerID).
		WithEnv("VIRTUFIN_WORKER_GROUP", spec.Group).
		WithEnv("VIRTUFIN_WORKER_TOPIC", spec.Topic).
		WithSysNanotime().
		WithNanosleep(boundedSleep).
		WithRandSource(rand.Reader)
	return &Instance{e: e, spec: spec, comp: c, wlog: wlog, mc: mc, max: n,
		sem: make(chan struct{}, n), busy: map[*slot]struct{}{}, drained: make(chan struct{})}
}

// boundedSleep serves WASI sleeps (poll_oneoff) a millisecond at a time:
// a sleeping module returns to its code often enough for its deadline to
// stop it (a host function cannot be interrupted).
func boundedSleep(ns int64) {
	time.Sleep(time.Duration(min(ns, int64(time.Millisecond))))
}

// MaxCalls is how many calls the dispatcher hands the instance at once
// (engines.Concurrent): the worker's own max_concurrency, each running in a
// module instance of its own, or engines.InProcessCalls when it sets none
// (calls beyond Config.Instances wait, microseconds, for a module
// instance, honouring a stop's give-back).
func (in *Instance) MaxCalls() int {
	if in.spec.MaxConcurrency > 0 {
		return in.spec.MaxConcurrency
	}
	return engines.InProcessCalls
}

// slot is one module instance and what a call on it needs.
type slot struct {
	in      *Instance
	mod     api.Module
	mem     api.Memory
	process api.Function
	alloc   api.Function
	dealloc api.Function
	// buf is the engine's region in the module's memory (from alloc):
	// out (4 bytes), out_len (4 bytes), then the input event.
	buf, bufCap uint32
	enc         *encoder
	stack       [4]uint64
	stderr      *logWriter
	stdout      *logWriter
	cancel      context.CancelFunc // the running call's
	// gwResp is the last gateway call's response (or error text),
	// until the module copies it (gateway_response).
	gwResp []byte
}

type slotKey struct{}

// slotFrom is the slot whose call (or _initialize) ctx is.
func slotFrom(ctx context.Context) *slot {
	s, _ := ctx.Value(slotKey{}).(*slot)
	return s
}

// newSlot instantiates the module once more, runs its _initialize and
// checks its abi_version, all bounded by ctx.
func (in *Instance) newSlot(ctx context.Context) (*slot, error) {
	s := &slot{in: in, enc: newEncoder(),
		stdout: newLogWriter(in.wlog, slog.LevelInfo, "stdout"), stderr: newLogWriter(in.wlog, slog.LevelWarn, "stderr")}
	ctx = context.WithValue(ctx, slotKey{}, s)
	mod, err := in.e.rt.InstantiateModule(ctx, in.comp.cm, in.mc.WithStdout(s.stdout).WithStderr(s.stderr))
	if err != nil {
		return nil, fmt.Errorf("instantiating the module: %w", err)
	}
	s.mod = mod
	if init := mod.ExportedFunction(exportInitialize); init != nil {
		if _, err := init.Call(ctx); err != nil {
			_ = mod.Close(context.Background())
			return nil, fmt.Errorf("the module's %s: %w", exportInitialize, s.describe(err))
		}
	}
	res, err := mod.ExportedFunction(exportABIVersion).Call(ctx)
	if err != nil {
		_ = mod.Close(context.Background())
		return nil, fmt.Errorf("the module's %s: %w", exportABIVersion, s.describe(err))
	}
	if v := int32(uint32(res[0])); v != ABIVersion {
		_ = mod.Close(context.Background())
		return nil, invalidf("the module's abi_version() is %d; this engine supports %d", v, ABIVersion)
	}
	s.mem = mod.ExportedMemory(exportMemory)
	s.process = mod.ExportedFunction(exportProcess)
	s.alloc = mod.ExportedFunction(exportAlloc)
	s.dealloc = mod.ExportedFunction(exportDealloc)
	return s, nil
}

// firstSlot creates the instance a Check or Load starts with: a module
// that does not instantiate is invalid code (unless ctx ended).
func (in *Instance) firstSlot(ctx context.Context) (*slot, error) {
	cctx, cancel := context.WithTimeout(ctx, in.spec.Timeout)
	defer cancel()
	s, err := in.newSlot(cctx)
	if err == nil {
		return s, nil
	}
	if errors.Is(err, engines.ErrInvalidCode) {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("wasm engine: %w", err)
	}
	return nil, &invalidError{msg: err.Error()}
}

// dropSlot closes s's module instance.
func (in *Instance) dropSlot(s *slot) {
	if s != nil && s.mod != nil {
		_ = s.mod.Close(context.Background())
	}
}

// enter counts a call in, unless the instance is closing.
func (in *Instance) enter() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closing {
		return false
	}
	in.inflight++
	return true
}

// leave counts a call out; the last call of a closing instance finishes
// the close.
func (in *Instance) leave() {
	in.mu.Lock()
	in.inflight--
	last := in.closing && in.inflight == 0
	in.mu.Unlock()
	if last {
		in.finish()
	}
}

// Process runs the worker on one event in one of the instance's module
// instances (waiting for one, within the call's deadline, when all are
// busy).
func (in *Instance) Process(ctx context.Context, ev *event.Event) ([]event.Event, error) {
	if !in.enter() {
		return nil, ErrClosed
	}
	defer in.leave()
	cctx, cancel := context.WithTimeout(ctx, in.spec.Timeout)
	defer cancel()
	select {
	case in.sem <- struct{}{}:
	default:
		select {
		case in.sem <- struct{}{}:
		case <-cctx.Done():
			return nil, engines.ContextError(cctx, "wasm", "waiting for a free module instance")
		case <-engines.GiveBack(ctx):
			return nil, fmt.Errorf("wasm engine: %w", engines.ErrGivenBack)
		}
	}
	defer func() { <-in.sem }()
	s, ok := in.start(cancel)
	if !ok {
		return nil, ErrClosed
	}
	if s == nil {
		// Every module instance is busy (or none is left): one more.
		var err error
		if s, err = in.newSlot(cctx); err != nil {
			if cctx.Err() != nil {
				return nil, in.ctxError(cctx, "starting a module instance")
			}
			return nil, &WorkerError{Message: err.Error(), Trap: true}
		}
		in.mu.Lock()
		s.cancel = cancel
		in.busy[s] = struct{}{}
		in.mu.Unlock()
	}
	out, err, keep := s.call(cctx, ev)
	in.stop(s, keep)
	if !keep {
		in.dropSlot(s)
	}
	return out, err
}

// start takes the most recently used idle module instance (nil: none)
// and marks it busy with a call whose cancel is given; false when the
// instance is closing (a call that has not started by then is refused).
func (in *Instance) start(cancel context.CancelFunc) (*slot, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closing {
		return nil, false
	}
	n := len(in.free)
	if n == 0 {
		return nil, true
	}
	s := in.free[n-1]
	in.free = in.free[:n-1]
	s.cancel = cancel
	in.busy[s] = struct{}{}
	return s, true
}

// stop ends s's call; keep puts it back among the idle ones.
func (in *Instance) stop(s *slot, keep bool) {
	in.mu.Lock()
	delete(in.busy, s)
	s.cancel = nil
	if keep {
		in.free = append(in.free, s)
	}
	in.mu.Unlock()
}

func (in *Instance) isClosing() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.closing
}

// ctxError is the error of a call that ended because its context did (or
// because Close cut it off).
func (in *Instance) ctxError(ctx context.Context, what string) error {
	if in.isClosing() && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s", ErrClosed, what)
	}
	return engines.ContextError(ctx, "wasm", what)
}

// call runs process on ev; keep is false when the module instance must be
// dropped (it trapped, exited or was stopped).
func (s *slot) call(ctx context.Context, ev *event.Event) (out []event.Event, err error, keep bool) {
	if ctx.Err() != nil {
		return nil, s.in.ctxError(ctx, "before the call"), true
	}
	s.stderr.resetTail()
	input, err := s.enc.encode(ev)
	if err != nil {
		return nil, err, true
	}
	if len(input) > math.MaxInt32-64 {
		return nil, fmt.Errorf("wasm engine: the input event needs %d bytes, more than the 2 GiB the ABI can pass", len(input)), true
	}
	cctx := context.WithValue(ctx, slotKey{}, s)
	need := uint32(8 + len(input))
	if need > s.bufCap {
		if err := s.grow(cctx, need); err != nil {
			return nil, err, false
		}
	}
	if !s.mem.WriteUint64Le(s.buf, 0) || !s.mem.Write(s.buf+8, input) {
		return nil, &WorkerError{Message: fmt.Sprintf("the input buffer [%d, %d) from alloc is outside the module's memory of %d bytes", s.buf, uint64(s.buf)+uint64(need), s.mem.Size())}, false
	}
	st := s.stack[:4]
	st[0], st[1], st[2], st[3] = uint64(s.buf+8), uint64(len(input)), uint64(s.buf), uint64(s.buf+4)
	if err := s.process.CallWithStack(cctx, st); err != nil {
		return nil, s.callError(ctx, err), false
	}
	rc := int32(uint32(st[0]))
	outPtr, _ := s.mem.ReadUint32Le(s.buf)
	outLen, _ := s.mem.ReadUint32Le(s.buf + 4)
	if outPtr == 0 {
		out, err := withCode(rc, nil, nil)
		return out, err, true
	}
	limit := s.in.e.cfg.MaxReplyBytes
	var derr error
	if int64(outLen) > int64(limit) {
		derr = engines.ReplyTooLarge("the worker's response", int64(outLen), limit)
	} else if view, ok := s.mem.Read(outPtr, outLen); !ok {
		derr = &WorkerError{Message: fmt.Sprintf("the response [%d, %d) is outside the module's memory of %d bytes", outPtr, uint64(outPtr)+uint64(outLen), s.mem.Size())}
	} else {
		out, derr = decodeResponse(view, limit)
	}
	// The response stays the module's: it releases it at its next process
	// call (one call into the module per event: each call costs wazero a
	// goroutine that watches the deadline).
	out, err = withCode(rc, out, derr)
	return out, err, true
}

// grow replaces the engine's region in the module's memory by one of at
// least need bytes.
func (s *slot) grow(ctx context.Context, need uint32) error {
	if s.buf != 0 {
		s.stack[0] = uint64(s.buf)
		if err := s.dealloc.CallWithStack(ctx, s.stack[:1]); err != nil {
			return s.callError(ctx, fmt.Errorf("dealloc of the input buffer: %w", err))
		}
		s.buf, s.bufCap = 0, 0
	}
	size := uint64(need+4095) &^ 4095
	s.stack[0] = size
	if err := s.alloc.CallWithStack(ctx, s.stack[:1]); err != nil {
		return s.callError(ctx, fmt.Errorf("alloc(%d): %w", size, err))
	}
	ptr := uint32(s.stack[0])
	if ptr == 0 {
		return &WorkerError{Message: fmt.Sprintf("alloc(%d) returned 0: the module is out of memory (its cap is %d pages of 64 KiB)", size, s.in.e.cfg.MaxMemoryPages)}
	}
	if uint64(ptr)+size > uint64(s.mem.Size()) {
		return &WorkerError{Message: fmt.Sprintf("alloc(%d) returned %d, outside the module's memory of %d bytes", size, ptr, s.mem.Size())}
	}
	s.buf, s.bufCap = ptr, uint32(size)
	return nil
}

// callError describes a call into the module that failed: a deadline or
// a stop (the module was closed by its context), an exit, or a trap.
func (s *slot) callError(ctx context.Context, err error) error {
	var ee *sys.ExitError
	if errors.As(err, &ee) {
		switch ee.ExitCode() {
		case sys.ExitCodeDeadlineExceeded, sys.ExitCodeContextCanceled:
			return s.in.ctxError(ctx, "during the call")
		}
	}
	if ctx.Err() != nil {
		return s.in.ctxError(ctx, "during the call")
	}
	return &WorkerError{Message: s.describe(err).Error(), Trap: true}
}

// describe is a trap or exit with what the module wrote to stderr last.
func (s *slot) describe(err error) error {
	var ee *sys.ExitError
	if errors.As(err, &ee) {
		switch ee.ExitCode() {
		case sys.ExitCodeDeadlineExceeded:
			err = fmt.Errorf("stopped at the deadline (the worker's timeout is %v)", s.in.spec.Timeout)
		case sys.ExitCodeContextCanceled:
			err = errors.New("stopped: its context was cancelled")
		default:
			err = fmt.Errorf("the module exited with code %d", ee.ExitCode())
		}
	}
	if tail := s.stderr.tail(); tail != "" {
		return fmt.Errorf("%w; its stderr ended with: %s", err, tail)
	}
	return err
}

// Close stops new calls, waits for the running ones until ctx ends (then
// stops them: their modules are closed at their next instruction
// boundary check), and closes every module instance.
func (in *Instance) Close(ctx context.Context) error {
	in.mu.Lock()
	first := !in.closing
	in.closing = true
	idle := in.inflight == 0
	in.mu.Unlock()
	if first && idle {
		in.finish()
	}
	select {
	case <-in.drained:
		return nil
	case <-ctx.Done():
	}
	in.mu.Lock()
	for s := range in.busy {
		if s.cancel != nil {
			s.cancel()
		}
	}
	in.mu.Unlock()
	return fmt.Errorf("wasm engine: closing worker %s: calls still running were stopped: %w", in.spec.WorkerID, ctx.Err())
}

// finish closes the idle module instances and gives the compiled module
// back, once no call is in flight.
func (in *Instance) finish() {
	in.mu.Lock()
	if in.released {
		in.mu.Unlock()
		return
	}
	in.released = true
	in.mu.Unlock()
	in.mu.Lock()
	free := in.free
	in.free = nil
	in.mu.Unlock()
	for _, s := range free {
		in.dropSlot(s)
	}
	in.e.release(in.comp)
	close(in.drained)
}
