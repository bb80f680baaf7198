// Package childproc owns one worker child process of the engines that run
// workers out of process (Python's runner, the .NET host): starting it in
// its own process group (or taking over one a fork server started,
// External), its protocol pipes' parent ends, its output
// lines, the deadline and cancellation of a round trip (both kill it),
// reaping it together with whatever it started, and saying why a round
// trip or a load failed. What travels on the pipes is the engine's.
package childproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
)

// ErrGone: the child closed its end of a protocol pipe (it died or was
// killed).
var ErrGone = errors.New("worker process is gone")

// Proc is one child process. At any time it is used by at most one
// goroutine (the owner of its slot); Kill may be called from anywhere.
// Engines embed it in their process type.
type Proc struct {
	Cmd *exec.Cmd
	Pid int
	// ReqW and RespR are the parent's ends of the protocol pipes.
	ReqW, RespR    *os.File
	Stdout, Stderr *wire.LineLogger

	// release frees what the sandbox made for the process, once it exited.
	release     func()
	releaseDone sync.Once
	reqClosed   bool

	// timer kills the process when a round trip exceeds its deadline.
	timer     *time.Timer
	timedOut  atomic.Bool
	cancelled atomic.Bool
	stopCtx   func() bool

	// armMu orders the deadline's and ctx's kill against Disarm: they
	// act only while the round trip they were armed for is in progress
	// (armed, same gen; deadline passed), so once Disarm returns, Healthy
	// is final for it.
	armMu    sync.Mutex
	armed    bool
	gen      uint64
	deadline time.Time

	// ext is the process when the node did not start it itself (a fork
	// server's child; StartExternal), with the read ends of its output.
	ext            External
	extOut, extErr *os.File

	mu     sync.Mutex
	exited bool // the leader exited; its pid is not reaped yet or is gone

	done    chan struct{} // closed once the process is reaped
	waitErr error         // valid after done
}

// Init prepares p for the child of workerID whose pipes are pipes: its
// output lines go to log.
func (p *Proc) Init(pipes *procpool.Pipes, log *slog.Logger, workerID string) {
	p.ReqW, p.RespR = pipes.ReqW, pipes.RespR
	p.done = make(chan struct{})
	p.Stdout = wire.NewLineLogger(log, "stdout", workerID, false)
	p.Stderr = wire.NewLineLogger(log, "stderr", workerID, true)
}

// Start starts cmd (built by the engine, with the child's pipe ends in
// ExtraFiles) in a process group of its own, its output to the log; release
// (may be nil) runs once the process has exited. On failure every pipe end
// is closed and release has run.
func (p *Proc) Start(cmd *exec.Cmd, release func(), pipes *procpool.Pipes) error {
	cmd.Stdout = p.Stdout
	cmd.Stderr = p.Stderr
	cmd.WaitDelay = time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.Cmd, p.release = cmd, release
	err := cmd.Start()
	pipes.CloseChildEnds()
	if err != nil {
		p.ReleaseOnce()
		pipes.CloseParentEnds()
		return err
	}
	p.Pid = cmd.Process.Pid
	p.timer = time.AfterFunc(time.Hour, p.onTimeout)
	p.timer.Stop()
	go p.wait()
	return nil
}

// External is a child process the node did not start itself (a fork
// server's child): Kill ends it and everything it started (safe from any
// goroutine, a no-op once it has exited), and Wait returns once it has
// exited, with how it ended (nil: exit status 0).
type External interface {
	Pid() int
	Kill()
	Wait() error
}

// StartExternal takes over proc, started with the child's ends of pipes
// (closed here) and the write ends of stdout and stderr, whose read ends
// are given here: its output goes to the log, release (may be nil) runs
// once it has exited, as with Start.
func (p *Proc) StartExternal(proc External, stdout, stderr *os.File, release func(), pipes *procpool.Pipes) {
	pipes.CloseChildEnds()
	p.ext, p.extOut, p.extErr, p.release = proc, stdout, stderr, release
	p.Pid = proc.Pid()
	p.timer = time.AfterFunc(time.Hour, p.onTimeout)
	p.timer.Stop()
	go p.wait()
}

// waitExternal waits for an External process and for its output: once it
// has exited, its output is read to the end (everything that held the
// pipes was in its PID namespace and went with it) or for a second at
// most, as exec.Cmd's WaitDelay.
func (p *Proc) waitExternal() error {
	var copies sync.WaitGroup
	for _, c := range []struct {
		r *os.File
		w io.Writer
	}{{p.extOut, p.Stdout}, {p.extErr, p.Stderr}} {
		copies.Add(1)
		go func() {
			defer copies.Done()
			_, _ = io.Copy(c.w, c.r)
		}()
	}
	err := p.ext.Wait()
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
	copied := make(chan struct{})
	go func() { copies.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(time.Second):
		p.extOut.Close()
		p.extErr.Close()
		<-copied
	}
	p.extOut.Close()
	p.extErr.Close()
	return err
}

// wait reaps the process. Once the leader has exited (and before it is
// reaped, so that its pid cannot be reused yet) the whole process group is
// killed: processes the worker forked must not keep the protocol pipes open.
// An External process is waited for through its Wait (its supervisor's
// PID namespace takes what it started with it).
func (p *Proc) wait() {
	if p.ext != nil {
		p.waitErr = p.waitExternal()
	} else if canWaitNoReap {
		waitExitedNoReap(p.Pid)
		p.mu.Lock()
		p.exited = true
		syscall.Kill(-p.Pid, syscall.SIGKILL)
		p.mu.Unlock()
		p.waitErr = p.Cmd.Wait()
	} else {
		err := p.Cmd.Wait()
		p.mu.Lock()
		p.exited = true
		p.mu.Unlock()
		p.waitErr = err
	}
	p.Stdout.Flush()
	p.Stderr.Flush()
	p.ReleaseOnce()
	close(p.done)
}

// Exited reports whether the process has exited (it may not be reaped
// yet, nor Done closed: Done waits for its output to be flushed too).
func (p *Proc) Exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Kill SIGKILLs the process group (the child and anything it started),
// unless the child is already gone. Safe from any goroutine.
func (p *Proc) Kill() {
	p.mu.Lock()
	if !p.exited {
		if p.ext != nil {
			p.ext.Kill()
		} else {
			syscall.Kill(-p.Pid, syscall.SIGKILL)
		}
	}
	p.mu.Unlock()
}

// onTimeout runs on the timer's goroutine. A timer that fired for an
// earlier round trip (its Stop came too late) or before a Rearm finds the
// deadline not passed and does nothing: the timer is set again.
func (p *Proc) onTimeout() {
	p.armMu.Lock()
	defer p.armMu.Unlock()
	if !p.armed || time.Now().Before(p.deadline) {
		return
	}
	p.timedOut.Store(true)
	p.Kill()
}

func (p *Proc) onCancel(gen uint64) {
	p.armMu.Lock()
	defer p.armMu.Unlock()
	if !p.armed || p.gen != gen {
		return
	}
	p.cancelled.Store(true)
	p.Kill()
}

// CloseRequests closes the request pipe: the child sees EOF and exits.
func (p *Proc) CloseRequests() {
	if !p.reqClosed {
		p.reqClosed = true
		p.ReqW.Close()
	}
}

// Done is closed once the process is reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// WaitErr is how the process ended; valid once Done is closed.
func (p *Proc) WaitErr() error { return p.waitErr }

// Retire kills the process, reaps it and releases its descriptors. The
// caller must own p (no round trip in progress).
func (p *Proc) Retire() {
	p.timer.Stop()
	p.Kill()
	<-p.done
	p.CloseRequests()
	p.RespR.Close()
}

// Arm starts the deadline timer and ctx watch for a round trip: expiry or
// cancellation kill the process, which ends a blocked read or write (EOF,
// EPIPE). It returns false, doing nothing, when the deadline has passed
// already. A successful Arm must be followed by Disarm.
func (p *Proc) Arm(ctx context.Context, deadline time.Time) bool {
	d := time.Until(deadline)
	if d <= 0 {
		return false
	}
	p.armMu.Lock()
	p.armed = true
	p.gen++
	gen := p.gen
	p.deadline = deadline
	p.armMu.Unlock()
	p.timer.Reset(d)
	if ctx.Done() != nil {
		p.stopCtx = context.AfterFunc(ctx, func() { p.onCancel(gen) })
	}
	return true
}

// Rearm moves the deadline of the round trip in progress.
func (p *Proc) Rearm(deadline time.Time) {
	p.armMu.Lock()
	p.deadline = deadline
	p.armMu.Unlock()
	p.timer.Reset(time.Until(deadline))
}

// Disarm stops what Arm started. If the timer or ctx fired in the
// meantime, TimedOut or Cancelled is set and the process is (being)
// killed; otherwise they are not set later for this round trip: a caller
// that sees Healthy after Disarm may give the process to the next call.
func (p *Proc) Disarm() {
	p.armMu.Lock()
	p.armed = false
	p.armMu.Unlock()
	p.timer.Stop()
	if p.stopCtx != nil {
		p.stopCtx()
		p.stopCtx = nil
	}
}

// TimedOut reports whether a deadline killed the process.
func (p *Proc) TimedOut() bool { return p.timedOut.Load() }

// MarkTimedOut records a deadline that passed before a round trip began.
func (p *Proc) MarkTimedOut() { p.timedOut.Store(true) }

// Cancelled reports whether a cancelled ctx killed the process.
func (p *Proc) Cancelled() bool { return p.cancelled.Load() }

// Healthy reports whether p can serve another call.
func (p *Proc) Healthy() bool { return !p.timedOut.Load() && !p.cancelled.Load() }

// ReleaseOnce runs the sandbox's release function, once.
func (p *Proc) ReleaseOnce() {
	if p.release != nil {
		p.releaseDone.Do(p.release)
	}
}

// Names say what a child is in the messages of one engine.
type Names struct {
	Engine  string // "python"
	Process string // "worker process"
	Runtime string // "interpreter": what runs the code while it loads
	// Closed is the engine's ErrClosed.
	Closed error
}

// CallFailure says why a round trip on p failed (err from the pipes, or
// nil after an unexpected frame of kind), as a restart reason and the
// call's error; budget is how long the call was given, killed whether the
// pool killed its processes (Close gave up waiting).
func (p *Proc) CallFailure(ctx context.Context, n Names, killed bool, kind byte, err error, budget time.Duration) (string, error) {
	var tooLarge *wire.FrameTooLargeError
	switch {
	case p.timedOut.Load():
		cerr := fmt.Errorf("%w after %v", engines.ErrTimeout, budget.Round(time.Millisecond))
		if ctx.Err() != nil {
			cerr = fmt.Errorf("%w (%w)", cerr, ctx.Err())
		}
		return "timeout", cerr
	case p.cancelled.Load():
		return "call cancelled", engines.ContextError(ctx, n.Engine, "the call was cancelled")
	case killed:
		return "instance closed", fmt.Errorf("%w: the call was interrupted", n.Closed)
	case errors.As(err, &tooLarge):
		// Not read: the process is replaced, the node held none of it.
		return "reply too large", fmt.Errorf("%w: %w", engines.ErrWorkerFailed, err)
	case err == nil:
		return "protocol error", fmt.Errorf("%w: protocol error: unexpected frame %q or bytes after it", engines.ErrWorkerFailed, kind)
	case errors.Is(err, ErrGone):
		p.Kill()
		<-p.done
		return "process exited", &wire.Error{Kind: engines.ErrWorkerFailed, Message: fmt.Sprintf(
			"the %s exited during the call (%v)%s", n.Process, p.waitErr, p.Stderr.Tail())}
	default:
		return "I/O error", fmt.Errorf("%w: talking to the %s: %w", engines.ErrWorkerFailed, n.Process, err)
	}
}

// LoadFailure says why starting a child and loading code into it failed:
// err from the pipes (hello: the child had said hello, so it was running
// the worker's code), or the load's reply frame otherwise; budget is how
// long the load was given. p must have been retired.
func (p *Proc) LoadFailure(ctx context.Context, n Names, hello bool, kind byte, payload []byte, err error, budget time.Duration) error {
	switch {
	case p.timedOut.Load():
		return fmt.Errorf("%w: starting the %s and loading the code took longer than %v",
			engines.ErrTimeout, n.Process, budget.Round(time.Millisecond))
	case p.cancelled.Load():
		return fmt.Errorf("%s engine: loading the code: %w", n.Engine, ctx.Err())
	case err != nil && hello:
		return &wire.Error{Kind: engines.ErrInvalidCode, Message: fmt.Sprintf(
			"the %s exited while loading the code (%v)%s", n.Runtime, p.waitErr, p.Stderr.Tail())}
	case err != nil:
		return fmt.Errorf("%s engine: the %s failed to start (%v; %v)%s", n.Engine, n.Process, err, p.waitErr, p.Stderr.Tail())
	case kind == wire.KindError:
		return wire.DecodeError(engines.ErrInvalidCode, payload)
	default:
		return fmt.Errorf("%s engine: protocol error: unexpected frame %q in reply to load", n.Engine, kind)
	}
}

// Env is what a sandboxed child gets of the environment: base (the
// engine's own settings), then extra (Config.Env: WORKER_ENV), then the
// documented VIRTUFIN_WORKER_* variables (exec.Cmd keeps the last value
// of a duplicated key).
func Env(spec engines.Spec, extra []string, base ...string) []string {
	env := append([]string{"LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin"}, base...)
	env = append(env, extra...)
	return append(env,
		"VIRTUFIN_WORKER_ID="+spec.WorkerID,
		"VIRTUFIN_WORKER_GROUP="+spec.Group,
		"VIRTUFIN_WORKER_TOPIC="+spec.Topic,
	)
}

// Adopt gives a spare process, started for no worker yet, to spec's
// worker: its output is logged as that worker's from now on.
func (p *Proc) Adopt(spec engines.Spec, n Names) {
	p.Stdout.Rebind(spec.Logger, spec.WorkerID)
	p.Stderr.Rebind(spec.Logger, spec.WorkerID)
	spec.Logger.Debug(n.Engine+" engine: a spare "+n.Process+" taken", "worker_id", spec.WorkerID, "pid", p.Pid)
}

// AwaitHello reads the hello frame of a child just started, with read (the
// engine's frame reader), within timeout; on any failure the child is
// killed and the error says what came instead.
func (p *Proc) AwaitHello(read func() (byte, []byte, error), timeout time.Duration) error {
	var err error
	ok := p.Arm(context.Background(), time.Now().Add(timeout))
	if ok {
		var kind byte
		kind, _, err = read()
		if err == nil && kind != wire.KindHello {
			err = fmt.Errorf("protocol error: expected a hello frame, got %q", kind)
		}
		p.Disarm()
	}
	if !ok || err != nil || !p.Healthy() {
		// Said as it happened: a process that died at once did not
		// wait for the timeout.
		timedOut := !ok || p.TimedOut()
		p.Kill()
		if timedOut || err == nil {
			return fmt.Errorf("no hello within %s", timeout)
		}
		return fmt.Errorf("no hello: %w", err)
	}
	return nil
}
