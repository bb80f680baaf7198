//go:build linux || darwin || freebsd

package native

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/crashjournal"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
)

// inprocInstance is a worker library loaded into this process.
type inprocInstance struct {
	e       *Engine
	spec    engines.Spec
	timeout time.Duration
	log     *slog.Logger // the engine's log for this worker
	wlog    *slog.Logger // the worker's own log lines (worker_id attached)
	lib     *loader.Library
	dir     string
	env     *envEntry

	ctx    context.Context // cancelled by Close: aborts gateway calls
	cancel context.CancelFunc

	mu        sync.Mutex
	closing   bool
	calls     sync.WaitGroup // native calls in flight
	abandoned atomic.Int32   // calls that timed out and still run in native code
	released  chan struct{}  // closed once the library is unloaded
	// slots holds the free call slots: there are MaxAbandonedCalls, a call
	// takes one before it starts and gives it back when the native code
	// returns. Any call may hang, so this is what bounds the calls in
	// native code, running or abandoned, also when many arrive together
	// (a check of abandoned alone let them all in).
	slots chan *callSlot
	all   []*callSlot // every slot, for release
}

// callSlot is a place for one call in native code. Each has its own host
// struct, whose engine_ptr routes the host calls made with it here: a host
// call is known to come from the call that holds the slot (host calls
// cannot tell otherwise), and runs under that call's group lock, not the
// lock of whatever call came last.
type callSlot struct {
	in     *inprocInstance
	sinkID uintptr
	host   *loader.Host
	// call is the call holding the slot and fence its group lock (nil:
	// none). Once that call is abandoned at its timeout the lock no longer
	// covers it, and its gateway calls are refused.
	call  atomic.Pointer[pcall]
	fence atomic.Pointer[engines.Fence]
	// journal is the slot's place in the node's crash journal (none when
	// the engine has no journal or it was full at load).
	journal crashjournal.Slot
}

var (
	_ engines.Instance   = (*inprocInstance)(nil)
	_ engines.Concurrent = (*inprocInstance)(nil)
	_ engines.Lender     = (*inprocInstance)(nil)
)

// MaxCalls implements engines.Concurrent: engines.InProcessCalls, so that
// the delivery record and publishing of one message overlap the others'
// (calls past the thread slots wait, microseconds, for one).
func (in *inprocInstance) MaxCalls() int { return engines.InProcessCalls }

func (e *Engine) loadInProcess(spec engines.Spec, p *pkg, abi loader.ABI) (engines.Instance, error) {
	rt, err := loader.Init()
	if err != nil {
		return nil, err
	}
	dir, libPath, err := e.extract(p, "")
	if err != nil {
		return nil, err
	}
	log := spec.Logger
	in := &inprocInstance{
		e:        e,
		spec:     spec,
		timeout:  spec.Timeout,
		log:      log,
		wlog:     log.With("worker_id", spec.WorkerID),
		dir:      dir,
		released: make(chan struct{}),
		slots:    make(chan *callSlot, e.cfg.MaxAbandonedCalls),
	}
	in.ctx, in.cancel = context.WithCancel(context.Background())
	// The identity variables are set before dlopen so that the library's
	// initialisers see them.
	in.env = pushIdentity(spec.WorkerID, spec.Group, spec.Topic)
	for range e.cfg.MaxAbandonedCalls {
		cs := &callSlot{in: in, journal: -1}
		if j, ok := e.cfg.Journal.Acquire(); ok {
			cs.journal = j
		} else if e.cfg.Journal != nil {
			log.Warn("native engine: crash journal full, this worker's calls are not journaled (raise NATIVE_CRASH_JOURNAL_SLOTS)", "worker_id", spec.WorkerID)
		}
		cs.sinkID = loader.RegisterSink(cs)
		in.all = append(in.all, cs)
		if cs.host = rt.NewHost(abi, cs.sinkID, spec.WorkerID, spec.Group, spec.Topic); cs.host == nil {
			in.release()
			return nil, errors.New("native engine: out of memory allocating the host struct")
		}
		in.slots <- cs
	}
	if in.lib, err = openLibrary(libPath, p.manifest); err != nil {
		in.release()
		return nil, err
	}
	return in, nil
}

// HostLog implements loader.Sink.
func (cs *callSlot) HostLog(level int32, msg string) {
	cs.in.wlog.Log(context.Background(), slogLevel(level), msg)
}

// HostGateway implements loader.Sink: the call holding the slot makes a
// gateway call under its own group lock; once that call was abandoned
// (its lock no longer covers it) the gateway call is refused.
func (cs *callSlot) HostGateway(service, method string, req []byte) ([]byte, int32) {
	in := cs.in
	ctx := in.ctx
	if f := cs.fence.Load(); f != nil {
		if c := cs.call.Load(); c == nil || c.state.Load() != callRunning {
			in.log.Warn("native engine: gateway call of an abandoned call refused",
				"worker_id", in.spec.WorkerID, "group", f.Group, "token", f.Token)
			return []byte(fmt.Sprintf("gateway call refused: this call was abandoned at its timeout and no longer holds the lock of group %s (token %d)",
				f.Group, f.Token)), loader.GatewayError
		}
		ctx = engines.WithFence(ctx, f)
	}
	ctx, cancel := context.WithTimeout(ctx, in.e.gatewayTimeout(in.spec))
	defer cancel()
	return gatewayCall(ctx, in.e.cfg.Gateway, in.spec, service, method, req)
}

// pcall is one Process call; calls are pooled. The native call runs on its
// own goroutine so that the caller can return at the deadline (native code
// cannot be interrupted): whoever finishes second recycles the call.
type pcall struct {
	in    *inprocInstance
	slot  *callSlot // held from before the call starts until the native code returns
	enc   *encoder
	input []byte
	// evSource and evID name the event in the crash journal.
	evSource, evID string
	slots          loader.CallSlots
	// lend: the caller takes the outputs lent (ProcessLent); lent: they
	// are, and c is their loan (a single output's context is in one,
	// the worker's buffer is respBuf) until it is returned.
	lend    bool
	lent    bool
	freeing bool // returned: freeLent frees the buffer
	one     oneOutput
	respBuf uintptr
	result  []event.Event
	err     error
	state   atomic.Int32  // callRunning, callDone or callAbandoned
	done    chan struct{} // buffered: the native side never blocks
	timer   *time.Timer
}

const (
	callRunning int32 = iota
	callDone
	callAbandoned
)

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &pcall{enc: newEncoder(), done: make(chan struct{}, 1), timer: t}
}}

func putCall(c *pcall) {
	c.in, c.slot, c.input, c.result, c.err = nil, nil, nil, nil, nil
	c.lend, c.lent, c.freeing, c.one, c.respBuf = false, false, false, oneOutput{}, 0
	c.evSource, c.evID = "", ""
	callPool.Put(c)
}

// Native calls run on long-lived runner goroutines, which keep their grown
// stacks: a fresh goroutine per call measured about 1.4 µs more. A runner
// whose call was abandoned (it hangs in native code) is simply not
// available; new runners are started as needed and at most maxIdleRunners
// wait for work.
const maxIdleRunners = 64

var idleRunners = make(chan chan *pcall, maxIdleRunners)

func dispatch(c *pcall) {
	select {
	case r := <-idleRunners:
		r <- c
	default:
		go runner(c)
	}
}

func runner(c *pcall) {
	work := make(chan *pcall, 1)
	for {
		c.in.run(c)
		select {
		case idleRunners <- work:
		default:
			return // enough idle runners
		}
		c = <-work
	}
}

// Process implements engines.Instance. The worker gets the Spec timeout, or
// less if ctx ends earlier; at the deadline Process returns ErrTimeout but
// the native call keeps running (it cannot be interrupted) and its result is
// dropped when it returns.
func (in *inprocInstance) Process(ctx context.Context, ev *event.Event) ([]event.Event, error) {
	out, _, err := in.process(ctx, ev, false)
	return out, err
}

// ProcessLent implements engines.Lender: Process without copying the
// outputs' data out of the worker's response buffer, which the worker's
// FreeResult frees only when the Loan is returned. The buffer is the
// worker's until then, as the ABI promises (FreeResult, once, after the
// host is done with it).
func (in *inprocInstance) ProcessLent(ctx context.Context, ev *event.Event) ([]event.Event, engines.Loan, error) {
	return in.process(ctx, ev, true)
}

func (in *inprocInstance) process(ctx context.Context, ev *event.Event, lend bool) ([]event.Event, engines.Loan, error) {
	if ev == nil {
		return nil, nil, errors.New("native engine: nil event")
	}
	if n := int(in.abandoned.Load()); n >= in.e.cfg.MaxAbandonedCalls {
		return nil, nil, &WorkerError{Message: fmt.Sprintf("%d earlier calls of this worker timed out and are still running in native code "+
			"(each holds a thread; the limit is %d): no new call until one of them returns; "+
			"code that can hang belongs in process isolation (\"isolation\": \"process\")", n, in.e.cfg.MaxAbandonedCalls)}
	}
	if !in.enter() {
		return nil, nil, ErrClosed
	}
	c := callPool.Get().(*pcall)
	c.lend = lend
	var err error
	if c.input, err = c.enc.encode(ev); err != nil {
		in.calls.Done()
		putCall(c)
		return nil, nil, err
	}
	wait := in.timeout
	if dl, ok := ctx.Deadline(); ok {
		if d := time.Until(dl); d < wait {
			wait = d
		}
	}
	if wait <= 0 || ctx.Err() != nil {
		in.calls.Done()
		putCall(c)
		return nil, nil, engines.ContextError(ctx, "native", "before the call started")
	}
	select {
	case c.slot = <-in.slots:
	default:
		if c.slot, err = in.waitSlot(ctx, c.timer, &wait); err != nil {
			in.calls.Done()
			putCall(c)
			return nil, nil, err
		}
	}
	c.in = in
	c.evSource, c.evID = ev.Source(), ev.ID()
	c.state.Store(callRunning)
	c.slot.fence.Store(engines.FenceFrom(ctx))
	c.slot.call.Store(c)
	dispatch(c)
	c.timer.Reset(wait)
	var why string
	select {
	case <-c.done:
		c.timer.Stop()
		return finish(c)
	case <-c.timer.C:
		why = "timeout"
	case <-ctx.Done():
		why = "context"
	}
	c.timer.Stop() // before giving c away
	if !c.state.CompareAndSwap(callRunning, callAbandoned) {
		<-c.done // it finished just now
		return finish(c)
	}
	// c belongs to the native goroutine now; its lock no longer covers it
	// (callSlot.HostGateway).
	in.abandoned.Add(1)
	in.log.Warn("native worker call abandoned; the call keeps running in native code",
		"worker_id", in.spec.WorkerID, "reason", why, "after", wait)
	if why == "timeout" {
		return nil, nil, fmt.Errorf("%w after %v (the native call cannot be interrupted and keeps running)",
			engines.ErrTimeout, wait.Round(time.Millisecond))
	}
	return nil, nil, engines.ContextError(ctx, "native", "during the call (it keeps running in native code)")
}

// waitSlot waits for a call slot (every one is held by a call in native
// code) until the call's deadline (*wait, which it reduces by the time
// spent) or ctx ends. A call that gets none never starts.
func (in *inprocInstance) waitSlot(ctx context.Context, t *time.Timer, wait *time.Duration) (*callSlot, error) {
	start := time.Now()
	t.Reset(*wait)
	defer t.Stop()
	select {
	case cs := <-in.slots:
		if *wait -= time.Since(start); *wait <= 0 {
			in.slots <- cs
			break
		}
		return cs, nil
	case <-t.C:
	case <-ctx.Done():
		return nil, engines.ContextError(ctx, "native", "waiting for a free native call slot (the call did not start)")
	case <-in.ctx.Done(): // Close
		return nil, ErrClosed
	}
	n := in.abandoned.Load()
	return nil, fmt.Errorf("%w after %v waiting for a free native call slot (the call did not start): "+
		"the worker's %d slots (MaxAbandonedCalls) were all held by calls in native code, %d of them abandoned at their timeout",
		engines.ErrTimeout, time.Since(start).Round(time.Millisecond), in.e.cfg.MaxAbandonedCalls, n)
}

func finish(c *pcall) ([]event.Event, engines.Loan, error) {
	out, err := c.result, c.err
	if c.lent {
		return out, c, err // recycled when returned
	}
	putCall(c)
	return out, nil, err
}

// Return implements engines.Loan for a call whose outputs were lent
// (ProcessLent): the worker's FreeResult frees its response buffer, and
// the call, counted in flight until then so that the library is not
// unloaded under the outputs, is done. FreeResult is the worker's code:
// it runs on a goroutine of its own, as the call ran on a runner, so
// that one that hangs holds that goroutine and keeps the library loaded
// (as a call that hangs does), not the caller.
func (c *pcall) Return() {
	if !c.lent || c.in == nil || c.freeing {
		panic("native engine: a loan returned twice")
	}
	c.freeing = true
	go c.in.freeLent(c) // a goroutine of its own: frees and ends (no runner kept idle for it)
}

// freeLent frees a returned loan's buffer (Return) and recycles c.
func (in *inprocInstance) freeLent(c *pcall) {
	in.lib.FreeOut(c.respBuf)
	putCall(c)
	in.calls.Done()
}

// lends says whether a call's result points into its response buffer.
func lends(out []event.Event, err error) bool {
	var answer *engines.ErrorAnswer
	return len(out) > 0 || errors.As(err, &answer) && len(answer.Outputs) > 0
}

// run makes the native call, decodes its result (copied, or lent out of
// the worker's buffer for ProcessLent) and frees the worker's buffer
// unless it is lent, then hands the result to the caller (or recycles c
// if the caller has gone).
func (in *inprocInstance) run(c *pcall) {
	cs := c.slot
	// In the crash journal from before the native code runs until it
	// returns (also when the caller gave up on it): a crash meanwhile
	// names this worker and event at the node's next start.
	j := in.e.cfg.Journal
	j.Enter(cs.journal, in.spec.WorkerID, c.evSource, c.evID)
	rc := in.lib.Call(cs.host.Addr(), c.input, &c.slots)
	j.Leave(cs.journal)
	var out []event.Event
	var err error
	buf, berr := c.slots.Bytes()
	switch {
	case berr != nil:
		err = &WorkerError{Code: rc, Message: berr.Error()}
	case buf != nil && c.lend:
		out, err = decodeLent(buf, in.e.cfg.MaxReplyBytes, &c.one)
	case buf != nil:
		out, err = decodeResponse(buf, in.e.cfg.MaxReplyBytes)
	}
	c.respBuf = c.slots.Out
	c.slots = loader.CallSlots{}
	c.result, c.err = withCode(rc, out, err)
	c.lent = c.lend && buf != nil && lends(c.result, c.err)
	if !c.lent {
		in.lib.FreeOut(c.respBuf)
	}
	if c.state.CompareAndSwap(callRunning, callDone) {
		in.slots <- cs
		if !c.lent {
			in.calls.Done()
		} // else: in flight until the loan is returned
		c.done <- struct{}{}
		return
	}
	// The caller had given up on it: nobody takes the outputs.
	if c.lent {
		in.lib.FreeOut(c.respBuf)
	}
	in.abandoned.Add(-1) // (before its slot is free)
	in.slots <- cs
	in.calls.Done()
	putCall(c)
}

func (in *inprocInstance) enter() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closing {
		return false
	}
	in.calls.Add(1)
	return true
}

// Close implements engines.Instance. It waits for native calls in flight
// until ctx ends, then unloads the library (dlclose), frees the host struct
// and deletes the extracted files. If calls are still running in native
// code when ctx ends, Close returns an error and the unloading happens when
// the last of them returns (code that is running cannot be unmapped).
func (in *inprocInstance) Close(ctx context.Context) error {
	in.mu.Lock()
	first := !in.closing
	in.closing = true
	in.mu.Unlock()
	if first {
		in.cancel()
		go func() {
			in.calls.Wait()
			in.release()
		}()
	}
	select {
	case <-in.released:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("native engine: closed with calls still running in native code (the library is unloaded when they return): %w", ctx.Err())
	}
}

// release unloads everything; it runs once, when no call is in flight.
func (in *inprocInstance) release() {
	in.cancel()
	for _, cs := range in.all {
		loader.UnregisterSink(cs.sinkID)
		in.e.cfg.Journal.Release(cs.journal)
	}
	if in.lib != nil {
		if err := in.lib.Close(); err != nil {
			in.log.Warn("native engine: dlclose failed", "worker_id", in.spec.WorkerID, "error", err)
		}
	}
	popIdentity(in.env)
	for _, cs := range in.all {
		cs.host.Release()
	}
	if err := in.e.removeExtracted(in.dir); err != nil {
		in.log.Warn("native engine: removing the extracted package", "worker_id", in.spec.WorkerID, "error", err)
	}
	close(in.released)
}
