package native

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/childproc"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/native/internal/hostproto"
	"github.com/virtufin/workmanager/engines/native/internal/loader"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// closeGrace is how long Close lets an idle host exit on its own (it sees
// EOF on its request pipe) before it is killed.
const closeGrace = 2 * time.Second

// hostProc is one native-host child process.
type hostProc struct {
	cmd   *exec.Cmd
	reqW  *os.File // engine -> host
	respR *os.File // host -> engine; closed by Retire
	r     *hostproto.Reader
	w     *hostproto.Writer
	enc   *encoder

	done    chan struct{} // closed once the process was reaped
	waitErr error         // valid after done
	tail    *tailLog
	group   childproc.Group // the host and what its library started

	killed    atomic.Bool
	timedOut  atomic.Bool
	cancelled atomic.Bool

	wlog   atomic.Pointer[slog.Logger] // where its output goes (adopt)
	exitFn atomic.Pointer[func()]      // run once it was reaped (onExit)
}

// adopt sends the host's output to l from now on: a host a Check started
// (a spare's, or one of its own) that serves its worker after that.
func (p *hostProc) adopt(l *slog.Logger) { p.wlog.Store(l) }

// onExit runs fn once, after the host was reaped (at once if it was):
// the host owns something that must outlive it no longer, such as the
// package directory a checking host keeps when it is parked.
func (p *hostProc) onExit(fn func()) {
	var once sync.Once
	f := func() { once.Do(fn) }
	p.exitFn.Store(&f)
	select {
	case <-p.done:
		f()
	default:
	}
}

// Kill kills the host process and every process its library started
// (its process group), and closes the engine's ends of the protocol pipes:
// a read or write in progress ends at once. A process the library started
// that left the group (setsid) survives the kill and may hold the host's
// ends for as long as it lives; nothing waits for it to let go (no EOF is
// awaited). Safe from any goroutine.
func (p *hostProc) Kill() {
	p.killed.Store(true)
	p.group.Kill()
	p.reqW.Close()
	p.respR.Close()
}

// CloseRequests closes the request pipe: the host sees EOF and exits.
func (p *hostProc) CloseRequests() { p.reqW.Close() }

// Done is closed once the process was reaped.
func (p *hostProc) Done() <-chan struct{} { return p.done }

// Retire closes the engine's ends and reaps the process (killing it if it
// does not exit within closeGrace).
func (p *hostProc) Retire() {
	p.CloseRequests()
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.Kill()
		<-p.done
	}
	p.respR.Close()
}

// tailLog keeps the last lines the host wrote to stdout/stderr, for error
// messages (a crashing host prints why).
type tailLog struct {
	mu    sync.Mutex
	lines []string
}

const (
	tailLines = 200
	// tailWidth bounds a kept line, as wire.LineLogger's tail does (the
	// whole line is still logged).
	tailWidth = 300
)

func (t *tailLog) add(s string) {
	if len(s) > tailWidth {
		s = s[:tailWidth] + "..." // a copy: the long line is not kept
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == tailLines {
		copy(t.lines, t.lines[1:])
		t.lines = t.lines[:tailLines-1]
	}
	t.lines = append(t.lines, s)
}

// String summarises the output for an error message: the first lines of a
// Go crash report (fatal error, signal) with the few lines the worker wrote
// before it, or else the last lines.
func (t *tailLog) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 0 {
		return ""
	}
	var pick []string
	start := slices.IndexFunc(t.lines, isCrashLine)
	if start < 0 {
		pick = t.lines[max(0, len(t.lines)-4):]
	} else {
		pick = append(pick, t.lines[max(0, start-3):start+1]...)
		for _, l := range t.lines[start+1 : min(len(t.lines), start+3)] {
			if l == "" {
				break
			}
			pick = append(pick, l)
		}
	}
	return "; output: " + strings.Join(pick, " | ")
}

func isCrashLine(l string) bool {
	for _, p := range []string{"fatal error:", "panic:", "SIGSEGV:", "SIGBUS:", "SIGILL:", "SIGFPE:", "SIGABRT:", "SIGTRAP:"} {
		if strings.HasPrefix(l, p) {
			return true
		}
	}
	return false
}

// startHost starts a native-host process for the extracted library and
// waits until it has loaded it (bounded by ctx and Config.LoadTimeout).
func (e *Engine) startHost(ctx context.Context, spec engines.Spec, libPath string, m *Manifest, wlog *slog.Logger) (*hostProc, error) {
	p, err := e.spawnHost(spec, libPath, m, "", "", wlog)
	if err != nil {
		return nil, err
	}
	if err := p.awaitLoad(ctx, e.cfg.LoadTimeout); err != nil {
		return nil, err // awaitLoad retired it
	}
	return p, nil
}

// spawnHost starts a host process: for libPath (in its extraction
// directory, bound into the sandbox), or, with libPath "" and dir set, a
// spare (-await) that sees dir as its package directory and waits for
// what to load (hostproto.FrameLoad), as spareOwner in the sandbox.
func (e *Engine) spawnHost(spec engines.Spec, libPath string, m *Manifest, dir, spareOwner string, wlog *slog.Logger) (*hostProc, error) {
	if e.cfg.HostPath == "" {
		return nil, errors.New("native engine: process isolation needs Config.HostPath (the native-host executable)")
	}
	pipes, err := procpool.NewPipes()
	if err != nil {
		return nil, fmt.Errorf("native engine: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		pipes.CloseChildEnds()
		pipes.CloseParentEnds()
		return nil, fmt.Errorf("native engine: %w", err)
	}
	sb := e.cfg.Sandbox
	args := append([]string(nil), e.cfg.HostArgs...)
	workerEnv := append([]string(nil), e.cfg.HostEnv...)
	owner := spec.WorkerID
	if libPath == "" { // a spare: its worker comes with the load frame
		args = append(args, "-await")
		owner = spareOwner
	} else {
		dir = extractRoot(libPath)
		library := libPath
		if sb != nil {
			// Inside, the package is bound at sandboxPackageDir.
			rel, _ := filepath.Rel(dir, libPath)
			library = path.Join(sandboxPackageDir, filepath.ToSlash(rel))
		}
		args = append(args, "-library", library, "-entry", m.EntryPoint, "-free", m.FreeResult, "-abi", strconv.Itoa(m.ABIVersion))
		workerEnv = append(workerEnv, hostproto.EnvWorkerID+"="+spec.WorkerID, hostproto.EnvWorkerGroup+"="+spec.Group, hostproto.EnvWorkerTopic+"="+spec.Topic)
	}
	var cmd *exec.Cmd
	release := func() {}
	if sb != nil {
		// The library's directory (given to the worker's uid by extract)
		// and the host binary are all it sees of the node's files.
		cmd, release, err = sb.Command(sandbox.Spec{Owner: owner, Path: sandboxHostPath, Args: args,
			Env:        append([]string{"LANG=C.UTF-8", "PATH=/usr/bin:/bin"}, workerEnv...),
			Binds:      []sandbox.Bind{{Src: e.cfg.HostPath, Dst: sandboxHostPath}, {Src: dir, Dst: sandboxPackageDir}},
			ExtraFiles: pipes.ChildEnds()})
		if err != nil {
			pipes.CloseChildEnds()
			pipes.CloseParentEnds()
			outR.Close()
			outW.Close()
			return nil, fmt.Errorf("native engine: %w", err)
		}
	} else {
		cmd = exec.Command(e.cfg.HostPath, args...)
		cmd.Env = append(os.Environ(), workerEnv...)
		cmd.ExtraFiles = pipes.ChildEnds()
	}
	cmd.Stdout, cmd.Stderr = outW, outW
	// Wait never waits for what the host's children hold open.
	cmd.WaitDelay = time.Second
	// A process group of its own: a timeout or Close kills whatever the
	// library forked too, which would otherwise keep the reply pipe open
	// (without a PID namespace nothing else ends it). What escapes the
	// group (setsid) is not waited for: Kill closes the pipes, and the
	// output reader is closed once the host was reaped.
	childproc.SetGroup(cmd)
	err = cmd.Start()
	pipes.CloseChildEnds()
	outW.Close()
	if err != nil {
		release()
		pipes.CloseParentEnds()
		outR.Close()
		return nil, fmt.Errorf("native engine: starting the native host %s: %w", e.cfg.HostPath, err)
	}
	respR := pipes.RespR
	p := &hostProc{cmd: cmd, reqW: pipes.ReqW, respR: respR, r: hostproto.NewReader(respR), w: hostproto.NewWriter(pipes.ReqW), enc: newEncoder(),
		done: make(chan struct{}), tail: &tailLog{}}
	p.r.Limit = e.hostFrameLimit
	p.wlog.Store(wlog)
	p.group.Started(cmd.Process.Pid)
	outDone := make(chan struct{})
	go func() { // the host's stdout/stderr: the worker's printf and crash reports
		defer close(outDone)
		forwardLines(outR, loader.MaxLogLine, func(line string) {
			p.tail.add(line)
			p.wlog.Load().Info(line, "stream", "host-output")
		})
		outR.Close()
	}()
	go func() {
		p.waitErr = p.group.Wait(cmd)
		release()
		// Output written just before the exit (a crash report) is part of
		// the error message: give the reader a moment to take it in. The
		// response pipe stays open (reads get EOF after the frames the host
		// wrote before exiting) until Retire closes it.
		select {
		case <-outDone:
		case <-time.After(200 * time.Millisecond):
			// A process that left the host's group still holds the
			// output pipe: stop reading it.
			outR.Close()
		}
		close(p.done)
		if f := p.exitFn.Load(); f != nil {
			(*f)()
		}
	}()

	return p, nil
}

// awaitLoad waits, at most timeout, for the host to say that it loaded its
// library ('Y'); any other end retires it and says why.
func (p *hostProc) awaitLoad(ctx context.Context, timeout time.Duration) error {
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := context.AfterFunc(lctx, p.Kill)
	kind, payload, err := p.r.ReadFrame()
	timedOut := !stop()
	switch {
	case err == nil && kind == hostproto.FrameReady && !timedOut:
		return nil
	case err == nil && kind == hostproto.FrameLoadError && len(payload) >= 1:
		msg := string(payload[1:])
		p.Retire()
		if payload[0] == 1 {
			return invalidf("%s", msg)
		}
		return fmt.Errorf("native engine: the native host could not start: %s", msg)
	case timedOut:
		p.Kill()
		p.Retire()
		return fmt.Errorf("native engine: the native host did not load the library within %v: %w", timeout, lctx.Err())
	default:
		p.Kill()
		p.Retire()
		return invalidf("the native host exited while loading the library (%v)%s", p.waitErr, p.tail)
	}
}

// forwardLines calls emit with each line read from r until EOF; a line
// longer than max is emitted in pieces of max bytes (it does not end the
// output: a crash report after it is still seen).
func forwardLines(r io.Reader, max int, emit func(string)) {
	br := bufio.NewReaderSize(r, max)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			emit(strings.TrimRight(string(line), "\r\n"))
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		default:
			return
		}
	}
}

// hostFrameLimit bounds what the engine reads of each frame kind from a
// host: a result by the reply limit, a log line by loader.MaxLogLine (the
// host's own cut), a gateway call's request by the reply limit; the rest
// are small.
func (e *Engine) hostFrameLimit(kind byte) int {
	switch kind {
	case hostproto.FrameResult:
		return 9 + e.cfg.MaxReplyBytes
	case hostproto.FrameLog:
		return 4 + loader.MaxLogLine
	case hostproto.FrameGatewayCall:
		return 8 + 2*loader.MaxLogLine + e.cfg.MaxReplyBytes
	default:
		return 64 << 10
	}
}

// Where a sandboxed host sees its binary and its package.
const (
	sandboxHostPath   = "/opt/workmanager/native-host"
	sandboxPackageDir = "/opt/workmanager/package"
)

// extractRoot is the extraction directory holding libPath (the
// "virtufin-native-*" directory extract made).
func extractRoot(libPath string) string {
	for d := filepath.Dir(libPath); d != "/" && d != "."; d = filepath.Dir(d) {
		if strings.HasPrefix(filepath.Base(d), "virtufin-native-") {
			return d
		}
	}
	return filepath.Dir(libPath)
}

func (e *Engine) checkInHost(ctx context.Context, spec engines.Spec, pk *pkg, key procpool.Key) error {
	if done, err := e.checkInSpare(ctx, spec, pk, key); done {
		return err
	}
	dir, libPath, err := e.extract(pk, spec.WorkerID)
	if err != nil {
		return err
	}
	p, err := e.startHost(ctx, spec, libPath, pk.manifest, spec.Logger.With("worker_id", spec.WorkerID))
	if err != nil {
		e.removeExtracted(dir)
		return err
	}
	e.park(spec, pk, key, p, func() { e.removeExtracted(dir) })
	return nil
}

// park keeps p, the host that checked pk for spec's worker, for the Load
// of the same worker and code (a process-isolated worker's: it takes p
// as its first host instead of starting one); release frees what p
// holds (its package directory) once p has exited. Any other checking
// host (an in-process worker's, or one whose Load runs on another node:
// engines.Spec.LoadsElsewhere) exits in the background once the node's
// calls pause (retireLater): the check's answer is in, and waiting for
// the host's exit (its sandbox's teardown) was 3 ms of every in-process
// create and reload (BenchmarkNativeCreateOnSpares), and that exit run
// beside the rest of the call still cost a create 7 ms; its package
// directory and extracted bytes go once it has exited, and Close makes
// it exit and waits for it.
func (e *Engine) park(spec engines.Spec, pk *pkg, key procpool.Key, p *hostProc, release func()) {
	if e.isolation(pk.manifest) != IsolationProcess || spec.LoadsElsewhere {
		e.retireLater(func() {
			p.Retire()
			release()
		})
		return
	}
	p.onExit(release)
	p.adopt(spec.Logger.With("worker_id", spec.WorkerID))
	e.parking.Park(key, p)
}

// hostInstance is a worker served by native-host child processes.
type hostInstance struct {
	e       *Engine
	spec    engines.Spec
	pk      *pkg
	m       *Manifest
	key     procpool.Key
	timeout time.Duration
	wlog    *slog.Logger
	pool    *procpool.Pool[*hostProc]
	started atomic.Bool // its first start: the host its Check parked, if any

	extractMu sync.Mutex
	dir       string // the package extracted for hosts started for it ("": not yet)
	libPath   string
}

var _ engines.Instance = (*hostInstance)(nil)

func (e *Engine) loadInHost(ctx context.Context, spec engines.Spec, pk *pkg, key procpool.Key) (engines.Instance, error) {
	log := spec.Logger
	in := &hostInstance{
		e: e, spec: spec, pk: pk, m: pk.manifest, key: key,
		timeout: spec.Timeout, wlog: log.With("worker_id", spec.WorkerID),
	}
	in.pool = procpool.New(procpool.Config[*hostProc]{
		Size:             e.cfg.HostProcesses,
		Start:            in.start,
		Grace:            closeGrace,
		GraceOutlastsCtx: true, // idle hosts get the whole grace period to exit on EOF
		Cleanup:          in.removeExtracted,
		Logger:           log,
		Name:             "native host",
		LogAttrs:         []any{"worker_id", spec.WorkerID},
		OnRestart:        e.cfg.OnRestart,
	})
	// An invalid-code error says what is wrong: it is preferred.
	if err := procpool.FirstError(in.pool.Fill(ctx), engines.ErrInvalidCode); err != nil {
		in.removeExtracted()
		return nil, err
	}
	return in, nil
}

// extracted is the library extracted for the hosts started for the
// worker (once, on the first such start; a host its Check parked has a
// package directory of its own).
func (in *hostInstance) extracted() (string, error) {
	in.extractMu.Lock()
	defer in.extractMu.Unlock()
	if in.dir == "" {
		dir, libPath, err := in.e.extract(in.pk, in.spec.WorkerID)
		if err != nil {
			return "", err
		}
		in.dir, in.libPath = dir, libPath
	}
	return in.libPath, nil
}

// removeExtracted removes what extracted made (the pool's Cleanup).
func (in *hostInstance) removeExtracted() {
	in.extractMu.Lock()
	defer in.extractMu.Unlock()
	if in.dir != "" {
		in.e.removeExtracted(in.dir)
		in.dir, in.libPath = "", ""
	}
}

func (in *hostInstance) start(ctx context.Context) (*hostProc, error) {
	first := !in.started.Swap(true)
	if first {
		// The first start of a Load: the host its Check loaded, waiting
		// (TakeFor has the pool track it).
		if p, ok := in.e.parking.TakeFor(in.key, in.pool, nil); ok {
			p.adopt(in.wlog)
			in.e.parkedLoads.Add(1)
			return p, nil
		}
	}
	p, err := in.launch(ctx, first)
	if err != nil {
		return nil, err
	}
	if !in.pool.Track(p) {
		p.Kill()
		go p.Retire()
		return nil, ErrClosed
	}
	return p, nil
}

// launch starts a host loaded with the worker's library: for its first
// host with no check's host parked (a start, a node's reconcile, a Load
// on another node than its check), a spare host when one is ready;
// otherwise one started for it from the package extracted for it.
func (in *hostInstance) launch(ctx context.Context, first bool) (*hostProc, error) {
	if first {
		if p, release, ok, err := in.e.loadInSpare(ctx, in.spec, in.pk); ok {
			if err != nil {
				return nil, err
			}
			p.onExit(release)
			p.adopt(in.wlog)
			in.e.spareLoads.Add(1)
			return p, nil
		}
	}
	libPath, err := in.extracted()
	if err != nil {
		return nil, err
	}
	return in.e.startHost(ctx, in.spec, libPath, in.m, in.wlog)
}

// Process implements engines.Instance. A call that times out kills its host
// process (the native code really stops); a host that crashes fails the call
// in progress. Either way a new host is started in the background.
func (in *hostInstance) Process(ctx context.Context, ev *event.Event) ([]event.Event, error) {
	if ev == nil {
		return nil, errors.New("native engine: nil event")
	}
	s, err := in.pool.Acquire(ctx)
	if errors.Is(err, procpool.ErrClosed) {
		return nil, ErrClosed
	}
	if err != nil {
		return nil, engines.ContextError(ctx, "native", "waiting for a free native host")
	}
	return in.run(ctx, s, ev)
}

func (in *hostInstance) run(ctx context.Context, s *procpool.Slot[*hostProc], ev *event.Event) ([]event.Event, error) {
	start := time.Now()
	wait := in.timeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		wait = time.Until(dl)
	}
	p, err := in.pool.ProcBy(ctx, s, start.Add(wait))
	if err != nil {
		in.pool.Release(s)
		return nil, fmt.Errorf("%w: the native host could not be restarted: %w", engines.ErrWorkerFailed, err)
	}
	// The call's own time starts now (a host replaced meanwhile is not
	// charged to it).
	start = time.Now()
	wait = in.timeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
		wait = time.Until(dl)
	}
	input, err := p.enc.encode(ev)
	if err != nil {
		in.pool.Release(s)
		return nil, err
	}
	if wait <= 0 || ctx.Err() != nil {
		in.pool.Release(s)
		return nil, engines.ContextError(ctx, "native", "before the call started")
	}
	// At the deadline the host is killed (the native code really stops) and
	// a gateway call in progress is cancelled, in that order: whatever
	// returns first, the call ends as a timeout.
	// The guard makes "the call is over" and "the deadline killed the
	// host" exclusive: once the call has ended (g.end), a timer or ctx
	// that fired late does nothing, so a host that looks healthy here is
	// never killed afterwards (under the next call).
	gwCtx, gwCancel := context.WithCancel(ctx)
	g := &callGuard{}
	timer := time.AfterFunc(wait, func() {
		g.fire(func() { p.timedOut.Store(true); p.Kill(); gwCancel() })
	})
	stopCtx := context.AfterFunc(ctx, func() {
		g.fire(func() { p.cancelled.Store(true); p.Kill() })
	})
	out, callErr := in.exchange(gwCtx, p, input)
	g.end()
	timer.Stop()
	stopCtx()
	gwCancel()

	if callErr == nil && !p.killed.Load() {
		in.pool.Release(s)
		return out.events, out.err
	}
	if callErr == nil { // the reply came in as the deadline fired: keep it, replace the host
		in.pool.Replace(s, "killed at the deadline")
		return out.events, out.err
	}
	var reason string
	var cerr error
	var tooLarge *hostproto.FrameTooLargeError
	switch {
	case p.timedOut.Load():
		reason = "timeout"
		cerr = fmt.Errorf("%w after %v (the native host was killed)", engines.ErrTimeout, time.Since(start).Round(time.Millisecond))
	case p.cancelled.Load() || ctx.Err() != nil:
		reason = "call cancelled"
		cerr = engines.ContextError(ctx, "native", "during the call (the native host was killed)")
	case in.pool.Killed():
		reason = "instance closed"
		cerr = fmt.Errorf("%w: the call was interrupted", ErrClosed)
	case errors.As(callErr, &tooLarge) && tooLarge.Kind == hostproto.FrameResult:
		reason = "reply too large"
		cerr = engines.ReplyTooLarge("the native worker's response", tooLarge.Size-9, in.e.cfg.MaxReplyBytes)
	case errors.As(callErr, &tooLarge):
		reason = "protocol error"
		cerr = &WorkerError{Message: fmt.Sprintf("the native host sent a frame over its limit: %v", tooLarge)}
	default:
		reason = "host exited"
		p.Kill()
		<-p.done
		cerr = &WorkerError{Message: fmt.Sprintf("the native host process exited during the call (%v)%s", p.waitErr, p.tail)}
		if !errors.Is(callErr, io.EOF) && !errors.Is(callErr, io.ErrUnexpectedEOF) && !errors.Is(callErr, os.ErrClosed) {
			cerr = &WorkerError{Message: fmt.Sprintf("talking to the native host: %v", callErr)}
		}
	}
	in.pool.Replace(s, reason)
	return nil, cerr
}

// callGuard orders the end of a call against its deadline and ctx: fire
// runs kill only while the call is not over, end marks it over; both hold
// mu, so after end returns the kill either happened or never will.
type callGuard struct {
	mu   sync.Mutex
	over bool
}

func (g *callGuard) fire(kill func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.over {
		kill()
	}
}

func (g *callGuard) end() {
	g.mu.Lock()
	g.over = true
	g.mu.Unlock()
}

type hostResult struct {
	events []event.Event
	err    error
}

// exchange sends one event and serves the host's log lines and gateway calls
// until its result comes in. An error means the process is unusable.
// errAborted: the call was cut off (deadline, ctx, Close) during a gateway
// call.
var errAborted = errors.New("call aborted")

func (in *hostInstance) exchange(ctx context.Context, p *hostProc, input []byte) (hostResult, error) {
	if err := p.w.WriteFrame(hostproto.FrameProcess, input); err != nil {
		return hostResult{}, err
	}
	for {
		kind, payload, err := p.r.ReadFrame()
		if err != nil {
			return hostResult{}, err
		}
		switch kind {
		case hostproto.FrameLog:
			if level, msg, ok := hostproto.ParseInt32Prefixed(payload); ok {
				in.wlog.Log(context.Background(), slogLevel(level), string(msg))
			}
		case hostproto.FrameGatewayCall:
			service, method, req, err := hostproto.ParseGatewayCall(payload)
			var resp []byte
			code := int32(loader.GatewayBadArgs)
			if err == nil {
				// Bounded by the gateway timeout, and cancelled at the call's
				// deadline (ctx) and by Close.
				gctx, cancel := context.WithTimeout(ctx, in.e.gatewayTimeout(in.spec))
				stop := context.AfterFunc(in.pool.Context(), cancel)
				resp, code = gatewayCall(gctx, in.e.cfg.Gateway, in.spec, service, method, req)
				stop()
				cancel()
				if p.killed.Load() || ctx.Err() != nil {
					return hostResult{}, errAborted
				}
			}
			if err := p.w.WriteFrame(hostproto.FrameGatewayReply, hostproto.Int32(code), resp); err != nil {
				return hostResult{}, err
			}
		case hostproto.FrameResult:
			rc, hasOut, outLen, buf, err := hostproto.ParseResult(payload)
			if err != nil {
				return hostResult{}, err
			}
			var res hostResult
			switch {
			case hasOut && outLen <= 0:
				res.err = &WorkerError{Code: rc, Message: fmt.Sprintf("the worker returned a response buffer with length %d", outLen)}
			case hasOut:
				res.events, res.err = decodeResponse(buf, in.e.cfg.MaxReplyBytes)
			}
			res.events, res.err = withCode(rc, res.events, res.err)
			return res, nil
		default:
			return hostResult{}, fmt.Errorf("unexpected frame %q from the native host", kind)
		}
	}
}

// Close implements engines.Instance: it waits for calls in flight until ctx
// ends, then kills their hosts; idle hosts get EOF and exit. Every process
// is reaped and the extracted files removed before Close returns.
func (in *hostInstance) Close(ctx context.Context) error {
	err := in.pool.Close(ctx)
	if errors.Is(err, procpool.ErrInFlight) {
		return fmt.Errorf("native engine: %w", err)
	}
	return err
}
