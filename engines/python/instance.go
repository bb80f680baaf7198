package python

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
)

// Instance is one loaded worker: Config.Processes runner subprocesses with the
// same code, each serving one call at a time.
type Instance struct {
	e       *Engine
	spec    engines.Spec
	interp  string
	code    []byte
	timeout time.Duration
	log     *slog.Logger

	slots []*slot
	// free holds the slots no call is using; its capacity is len(slots), so
	// sending a slot back never blocks.
	free chan *slot

	ctx       context.Context // cancelled by Close: aborts restarts
	cancel    context.CancelFunc
	closed    chan struct{} // closed when Close starts
	closeDone chan struct{} // closed when Close has finished

	mu      sync.Mutex
	closing bool
	killAll bool               // Close gave up waiting: kill every process
	procs   map[*proc]struct{} // live processes, for Close
	wg      sync.WaitGroup     // calls in flight and restarts
}

// slot is one place for a runner process. It is owned by whoever took it from
// Instance.free.
type slot struct {
	p   *proc // nil when the process could not be (re)started
	err error // why p is nil
}

var _ engines.Instance = (*Instance)(nil)

func newInstance(e *Engine, spec engines.Spec, interp string, code []byte) *Instance {
	in := &Instance{
		e:         e,
		spec:      spec,
		interp:    interp,
		code:      append([]byte(nil), code...),
		timeout:   e.timeout(spec),
		log:       e.logger(spec),
		slots:     make([]*slot, e.cfg.Processes),
		free:      make(chan *slot, e.cfg.Processes),
		closed:    make(chan struct{}),
		closeDone: make(chan struct{}),
		procs:     map[*proc]struct{}{},
	}
	in.ctx, in.cancel = context.WithCancel(context.Background())
	for i := range in.slots {
		in.slots[i] = &slot{}
	}
	return in
}

// Process implements engines.Instance. The call waits for a free process
// (bounded by ctx); the worker then gets at most the Spec timeout, or less if
// ctx ends earlier. A timed-out or crashed process is killed and restarted in
// the background with the same code.
func (in *Instance) Process(ctx context.Context, ev *event.Event) ([]event.Event, error) {
	if ev == nil {
		return nil, errors.New("python engine: nil event")
	}
	if !in.enter() {
		return nil, ErrClosed
	}
	defer in.wg.Done()
	var s *slot
	select {
	case s = <-in.free:
	default:
		select {
		case s = <-in.free:
		case <-ctx.Done():
			return nil, ctxError(ctx, "waiting for a free worker process")
		case <-in.closed:
			return nil, ErrClosed
		}
	}
	return in.run(ctx, s, ev)
}

// run makes one call on the slot's process; it gives the slot back (possibly
// after a restart) before it returns.
func (in *Instance) run(ctx context.Context, s *slot, ev *event.Event) ([]event.Event, error) {
	start := time.Now()
	deadline := start.Add(in.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	p := s.p
	if p == nil {
		var err error
		if p, err = in.restartNow(ctx); err != nil {
			s.err = err
			in.free <- s
			return nil, fmt.Errorf("%w: the worker process could not be restarted: %w", engines.ErrWorkerFailed, err)
		}
		s.p, s.err = p, nil
	}

	p.wbuf.reset(kindEvent)
	if err := event.WriteJson(ev, &p.wbuf); err != nil {
		in.free <- s
		return nil, fmt.Errorf("python engine: encoding the input event: %w", err)
	}
	if !p.arm(ctx, deadline) {
		in.free <- s
		return nil, fmt.Errorf("%w: the deadline passed before the call started", engines.ErrTimeout)
	}
	spun := p.startSpin(in.e.cfg.SpinWait)
	err := p.writeFrame()
	var kind byte
	var payload []byte
	if err == nil {
		kind, payload, err = p.readFrame()
	}
	p.endSpin(spun)
	p.disarm()

	if err == nil && (kind == kindResult || kind == kindError) && !p.pending() {
		var out []event.Event
		var werr error
		if kind == kindResult {
			out, werr = decodeOutputs(payload)
		} else {
			werr = decodeError(engines.ErrWorkerFailed, payload)
		}
		if p.healthy() {
			in.free <- s
		} else {
			// The deadline or ctx fired just as the reply came in: the reply
			// is good, the process is being killed.
			in.replace(s, "killed at the deadline")
		}
		return out, werr
	}

	// The process is unusable: say why, and replace it.
	var cerr error
	var reason string
	switch {
	case p.timedOut.Load():
		reason = "timeout"
		cerr = fmt.Errorf("%w after %v", engines.ErrTimeout, deadline.Sub(start).Round(time.Millisecond))
		if ctx.Err() != nil {
			cerr = fmt.Errorf("%w (%w)", cerr, ctx.Err())
		}
	case p.cancelled.Load():
		reason = "call cancelled"
		cerr = ctxError(ctx, "the call was cancelled")
	case in.killed():
		reason = "instance closed"
		cerr = fmt.Errorf("%w: the call was interrupted", ErrClosed)
	case err == nil:
		reason = "protocol error"
		cerr = fmt.Errorf("%w: protocol error: unexpected frame %q or bytes after it", engines.ErrWorkerFailed, kind)
	case errors.Is(err, errProcessGone):
		reason = "process exited"
		p.kill()
		<-p.done
		cerr = &Error{Kind: engines.ErrWorkerFailed, Message: fmt.Sprintf(
			"the worker process exited during the call (%v)%s", p.waitErr, p.stderr.tail())}
	default:
		reason = "I/O error"
		cerr = fmt.Errorf("%w: talking to the worker process: %w", engines.ErrWorkerFailed, err)
	}
	in.replace(s, reason)
	return nil, cerr
}

// replace retires the slot's process and starts a new one in the background;
// the slot goes back to the free list once that is done (or failed).
func (in *Instance) replace(s *slot, reason string) {
	old := s.p
	s.p = nil
	in.wg.Add(1) // the caller's call holds the group open: no race with Wait
	go func() {
		defer in.wg.Done()
		old.retire()
		in.untrack(old)
		if in.ctx.Err() != nil {
			s.err = ErrClosed
			in.free <- s
			return
		}
		p, err := in.e.startLoaded(in.ctx, in.spec, in.interp, in.code, in)
		s.p, s.err = p, err
		if err != nil {
			if in.ctx.Err() == nil {
				in.log.Error("python worker process could not be restarted",
					"worker_id", in.spec.WorkerID, "reason", reason, "error", err)
			}
		} else {
			in.log.Warn("python worker process restarted",
				"worker_id", in.spec.WorkerID, "reason", reason)
		}
		in.free <- s
	}()
}

// restartNow starts a process for a slot whose last restart failed, bounded
// by ctx and by Close.
func (in *Instance) restartNow(ctx context.Context) (*proc, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(in.ctx, cancel)
	defer stop()
	return in.e.startLoaded(ctx, in.spec, in.interp, in.code, in)
}

// Close implements engines.Instance. It waits for calls in flight until ctx
// ends, then kills their processes; idle runners get EOF on their request
// pipe and a short grace period to exit before they are killed. Every process
// is reaped before Close returns.
func (in *Instance) Close(ctx context.Context) error {
	in.mu.Lock()
	if in.closing {
		in.mu.Unlock()
		select {
		case <-in.closeDone:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	in.closing = true
	close(in.closed)
	in.cancel()
	in.mu.Unlock()
	defer close(in.closeDone)

	var err error
	idle := make(chan struct{})
	go func() {
		in.wg.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-ctx.Done():
		err = fmt.Errorf("python engine: closed with calls in flight: %w", ctx.Err())
		in.mu.Lock()
		in.killAll = true
		for p := range in.procs {
			p.kill()
		}
		in.mu.Unlock()
		<-idle // killed calls return at once
	}

	in.mu.Lock()
	procs := make([]*proc, 0, len(in.procs))
	for p := range in.procs {
		procs = append(procs, p)
	}
	in.procs = map[*proc]struct{}{}
	in.mu.Unlock()
	for _, p := range procs {
		p.closeRequests()
	}
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	killRest := func() {
		for _, p := range procs {
			p.kill()
		}
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-grace.C:
			killRest()
		case <-ctx.Done():
			killRest()
		}
	}
	for _, p := range procs {
		p.retire()
	}
	return err
}

func (in *Instance) enter() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closing {
		return false
	}
	in.wg.Add(1)
	return true
}

func (in *Instance) killed() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.killAll
}

// track registers a new process; it refuses (false) once Close has started
// killing everything.
func (in *Instance) track(p *proc) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.killAll {
		return false
	}
	in.procs[p] = struct{}{}
	return true
}

func (in *Instance) untrack(p *proc) {
	in.mu.Lock()
	delete(in.procs, p)
	in.mu.Unlock()
}

func ctxError(ctx context.Context, what string) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %s: %w", engines.ErrTimeout, what, err)
	}
	return fmt.Errorf("python engine: %s: %w", what, err)
}

// decodeOutputs turns an 'R' payload (null, one event object or a list of
// them) into events. Outputs need not have an id or source: the caller fills
// those in.
func decodeOutputs(payload []byte) ([]event.Event, error) {
	i := 0
	for i < len(payload) && (payload[i] == ' ' || payload[i] == '\n' || payload[i] == '\t' || payload[i] == '\r') {
		i++
	}
	if i == len(payload) {
		return nil, outputError(-1, errors.New("empty result"))
	}
	switch payload[i] {
	case 'n':
		return nil, nil
	case '{':
		out := make([]event.Event, 1)
		if err := decodeOutput(&out[0], payload[i:]); err != nil {
			return nil, outputError(0, err)
		}
		return out, nil
	case '[':
		var raws []json.RawMessage
		if err := json.Unmarshal(payload[i:], &raws); err != nil {
			return nil, outputError(-1, err)
		}
		if len(raws) == 0 {
			return nil, nil
		}
		out := make([]event.Event, len(raws))
		for j, raw := range raws {
			if err := decodeOutput(&out[j], raw); err != nil {
				return nil, outputError(j, err)
			}
		}
		return out, nil
	default:
		return nil, outputError(-1, fmt.Errorf("unexpected result %.40q", payload[i:]))
	}
}

func decodeOutput(ev *event.Event, b []byte) error {
	if err := ev.UnmarshalJSON(b); err != nil {
		return err
	}
	if ev.Type() == "" {
		return errors.New(`missing required attribute "type"`)
	}
	return nil
}

func outputError(i int, err error) error {
	msg := err.Error()
	if i >= 0 {
		msg = fmt.Sprintf("output %d: %s", i, msg)
	} else {
		msg = "decoding the outputs: " + msg
	}
	return &Error{Kind: engines.ErrWorkerFailed, Message: msg}
}
