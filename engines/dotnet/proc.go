package dotnet

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// Frame kinds (host/Host.cs has the protocol).
const (
	kindLoad         = 'L'
	kindEvent        = 'E'
	kindHello        = 'H'
	kindOK           = 'K'
	kindResult       = 'R'
	kindError        = 'X'
	kindGateway      = 'G'
	kindGatewayReply = 'g'
)

const (
	headerSize = 5
	maxFrame   = 1 << 30
)

// errProcessGone: the host closed its end of a pipe (it died or was killed).
var errProcessGone = errors.New("worker host process is gone")

// proc is one host process. At any time it is used by at most one
// goroutine (the owner of its slot); Kill may be called from anywhere.
type proc struct {
	release     func()
	releaseDone sync.Once

	cmd *exec.Cmd
	pid int

	reqW      *os.File
	respR     *os.File
	rd        *bufio.Reader
	reqClosed bool
	hdr       [headerSize]byte

	timer     *time.Timer
	timedOut  atomic.Bool
	cancelled atomic.Bool
	stopCtx   func() bool

	mu     sync.Mutex
	exited bool

	done    chan struct{}
	waitErr error

	stdout, stderr *wire.LineLogger
}

// loadRequest is the 'L' payload.
type loadRequest struct {
	Assemblies []string `json:"assemblies"`
	Probe      []string `json:"probe"`
	Lockdown   []byte   `json:"lockdown,omitempty"`
}

// startLoaded starts a host and loads w into it; on success the host is
// idle and ready for events. pool, which tracks the process, may be nil
// (Check).
func (e *Engine) startLoaded(ctx context.Context, spec engines.Spec, w *workerCode, pool *procpool.Pool[*proc]) (*proc, error) {
	start := time.Now()
	deadline := start.Add(e.cfg.LoadTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	rt, err := e.runtimeFor(ctx)
	if err != nil {
		return nil, err
	}
	p, err := e.spawn(spec, rt, w)
	if err != nil {
		return nil, err
	}
	if pool != nil && !pool.Track(p) {
		p.Retire()
		return nil, ErrClosed
	}
	req, err := json.Marshal(loadRequest{Assemblies: w.assemblies, Probe: w.probe, Lockdown: e.lockdown})
	if err != nil {
		p.Retire()
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	var kind byte
	var payload []byte
	hello := false
	if !p.arm(ctx, deadline) {
		p.timedOut.Store(true)
		err = errProcessGone
	} else {
		kind, payload, err = p.readFrame()
		if err == nil && kind != kindHello {
			err = fmt.Errorf("protocol error: expected a hello frame, got %q", kind)
		}
		if err == nil {
			hello = true
			if err = p.writeFrame(kindLoad, req); err == nil {
				kind, payload, err = p.readFrame()
			}
		}
		p.disarm()
	}
	if err == nil && kind == kindOK && p.healthy() {
		return p, nil
	}
	p.Retire()
	if pool != nil {
		pool.Untrack(p)
	}
	switch {
	case p.timedOut.Load():
		return nil, fmt.Errorf("%w: starting the .NET host and loading the code took longer than %v",
			engines.ErrTimeout, deadline.Sub(start).Round(time.Millisecond))
	case p.cancelled.Load():
		return nil, fmt.Errorf("dotnet engine: loading the code: %w", ctx.Err())
	case err != nil && hello:
		return nil, &wire.Error{Kind: engines.ErrInvalidCode, Message: fmt.Sprintf(
			"the .NET host exited while loading the code (%v)%s", p.waitErr, p.stderr.Tail())}
	case err != nil:
		return nil, fmt.Errorf("dotnet engine: the .NET host failed to start (%v; %v)%s", err, p.waitErr, p.stderr.Tail())
	case kind == kindError:
		return nil, wire.DecodeError(engines.ErrInvalidCode, payload)
	default:
		return nil, fmt.Errorf("dotnet engine: protocol error: unexpected frame %q in reply to load", kind)
	}
}

// spawn starts a host process.
func (e *Engine) spawn(spec engines.Spec, rt *runtime, w *workerCode) (*proc, error) {
	pipes, err := procpool.NewPipes()
	if err != nil {
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	p := &proc{
		reqW:   pipes.ReqW,
		respR:  pipes.RespR,
		done:   make(chan struct{}),
		stdout: wire.NewLineLogger(spec.Logger, "stdout", spec.WorkerID, false),
		stderr: wire.NewLineLogger(spec.Logger, "stderr", spec.WorkerID, true),
	}
	p.rd = bufio.NewReaderSize(p.respR, 16<<10)
	// --debug: file and line numbers in the worker's stack traces.
	args := []string{"--debug", rt.host()}
	var cmd *exec.Cmd
	if e.cfg.Sandbox != nil {
		cmd, p.release, err = e.cfg.Sandbox.Command(sandbox.Spec{
			Owner: spec.WorkerID, Path: rt.mono, Args: args, Env: e.workerEnv(spec),
			ReadOnly:   []string{"/etc/mono", rt.dir, w.dir},
			ExtraFiles: pipes.ChildEnds(),
		})
		if err != nil {
			pipes.CloseChildEnds()
			pipes.CloseParentEnds()
			return nil, fmt.Errorf("dotnet engine: %w", err)
		}
	} else {
		cmd = exec.Command(rt.mono, args...)
		cmd.ExtraFiles = pipes.ChildEnds()
		cmd.Env = append(os.Environ(), e.workerEnv(spec)...)
	}
	cmd.Stdout = p.stdout
	cmd.Stderr = p.stderr
	cmd.WaitDelay = time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd = cmd
	err = cmd.Start()
	pipes.CloseChildEnds()
	if err != nil {
		p.releaseOnce()
		pipes.CloseParentEnds()
		return nil, fmt.Errorf("dotnet engine: starting %s: %w", rt.mono, err)
	}
	p.pid = cmd.Process.Pid
	p.timer = time.AfterFunc(time.Hour, p.onTimeout)
	p.timer.Stop()
	go p.wait()
	return p, nil
}

// workerEnv is what the host gets of the environment: Config.Env, the
// documented VIRTUFIN_WORKER_* variables and Mono's settings.
func (e *Engine) workerEnv(spec engines.Spec) []string {
	env := []string{"LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin",
		// No shared memory area (performance counters): nothing in the
		// sandbox reads it and /dev/shm is private there anyway.
		"MONO_DISABLE_SHARED_AREA=1"}
	env = append(env, e.cfg.Env...)
	return append(env,
		"VIRTUFIN_WORKER_ID="+spec.WorkerID,
		"VIRTUFIN_WORKER_GROUP="+spec.Group,
		"VIRTUFIN_WORKER_TOPIC="+spec.Topic,
	)
}

// wait reaps the host and kills its process group (what the worker
// started must not keep the pipes open).
func (p *proc) wait() {
	err := p.cmd.Wait()
	p.mu.Lock()
	p.exited = true
	syscall.Kill(-p.pid, syscall.SIGKILL)
	p.mu.Unlock()
	p.waitErr = err
	p.stdout.Flush()
	p.stderr.Flush()
	p.releaseOnce()
	close(p.done)
}

// Kill SIGKILLs the host's process group unless it is gone already.
func (p *proc) Kill() {
	p.mu.Lock()
	if !p.exited {
		syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	p.mu.Unlock()
}

func (p *proc) onTimeout() {
	p.timedOut.Store(true)
	p.Kill()
}

func (p *proc) onCancel() {
	p.cancelled.Store(true)
	p.Kill()
}

// CloseRequests closes the request pipe: an idle host sees EOF and exits.
func (p *proc) CloseRequests() {
	if !p.reqClosed {
		p.reqClosed = true
		p.reqW.Close()
	}
}

// Done is closed once the process is reaped.
func (p *proc) Done() <-chan struct{} { return p.done }

// Retire kills the process, reaps it and releases its descriptors.
func (p *proc) Retire() {
	p.timer.Stop()
	p.Kill()
	<-p.done
	p.CloseRequests()
	p.respR.Close()
}

// arm starts the deadline timer and the ctx watch of a round trip; false
// (doing nothing) when the deadline has passed. disarm must follow.
func (p *proc) arm(ctx context.Context, deadline time.Time) bool {
	d := time.Until(deadline)
	if d <= 0 {
		return false
	}
	p.timer.Reset(d)
	if ctx.Done() != nil {
		p.stopCtx = context.AfterFunc(ctx, p.onCancel)
	}
	return true
}

func (p *proc) disarm() {
	p.timer.Stop()
	if p.stopCtx != nil {
		p.stopCtx()
		p.stopCtx = nil
	}
}

func (p *proc) healthy() bool { return !p.timedOut.Load() && !p.cancelled.Load() }

func (p *proc) writeFrame(kind byte, payload []byte) error {
	if len(payload) > maxFrame {
		return fmt.Errorf("frame of %d bytes is too large", len(payload))
	}
	b := make([]byte, headerSize+len(payload))
	binary.LittleEndian.PutUint32(b, uint32(len(payload)))
	b[4] = kind
	copy(b[headerSize:], payload)
	_, err := p.reqW.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		return errProcessGone
	}
	return err
}

func (p *proc) readFrame() (byte, []byte, error) {
	if _, err := io.ReadFull(p.rd, p.hdr[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, os.ErrClosed) {
			return 0, nil, errProcessGone
		}
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(p.hdr[:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("protocol error: frame of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(p.rd, b); err != nil {
		return 0, nil, errProcessGone
	}
	return p.hdr[4], b, nil
}

func (p *proc) releaseOnce() {
	if p.release != nil {
		p.releaseDone.Do(p.release)
	}
}
