package python

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// Frame kinds (see README.md).
const (
	kindLoad   = 'L' // Go -> Python: worker source
	kindEvent  = 'E' // Go -> Python: one CloudEvent, structured JSON
	kindHello  = 'H' // Python -> Go: runner started; payload sys.version
	kindOK     = 'K' // Python -> Go: code loaded
	kindResult = 'R' // Python -> Go: JSON null, one event object or a list
	kindError  = 'X' // Python -> Go: JSON {"type", "message", "traceback"}
	// During an event: the worker calls a backend through the node.
	kindGateway      = 'G' // Python -> Go: JSON {"service", "method"}, '\n', body
	kindGatewayReply = 'g' // Go -> Python: 0 and the response, or 1 and an error
)

const (
	headerSize = 5
	// maxFrame bounds a frame's payload; a bigger length is a protocol error.
	maxFrame = 1 << 30
	// Buffers grown past keepBuf by one big message are dropped after use.
	initBuf = 16 << 10
	keepBuf = 1 << 20
	// maxRunnerSpin caps the runner's busy-poll for the next request.
	maxRunnerSpin = 25 * time.Microsecond
)

// errProcessGone: the runner closed its end of a protocol pipe (it died or
// was killed).
var errProcessGone = errors.New("worker process is gone")

// proc is one runner subprocess. At any time it is used by at most one
// goroutine (the owner of its slot); Kill may be called from anywhere.
type proc struct {
	// release frees what the sandbox made for the process (its scratch
	// directory), once it has exited; nil without a sandbox.
	release     func()
	releaseDone sync.Once

	cmd *exec.Cmd
	pid int

	// Parent ends of the protocol pipes (non-blocking, in the runtime
	// poller). Replies are first busy-polled for up to spin (see readSome).
	reqW, respR *os.File
	respRC      syscall.RawConn
	reqClosed   bool

	readFn     func(fd uintptr) bool // reads into rdBuf; allocated once
	rdBuf      []byte
	rdN        int
	rdErr      error
	spin       time.Duration // busy-poll budget of the current reply
	spinFrom   time.Time
	spinMissed bool // the current spin ran out
	spinScore  int  // +1 per reply that came while spinning, -1 per miss
	calls      uint32

	wbuf frameBuf
	// rbuf holds the last frame read; rbuf[rstart:rend] are bytes read past it.
	rbuf         []byte
	rstart, rend int

	// timer kills the process when a round trip exceeds its deadline.
	timer     *time.Timer
	timedOut  atomic.Bool
	cancelled atomic.Bool
	stopCtx   func() bool

	mu     sync.Mutex
	exited bool // the leader exited; its pid is not reaped yet or is gone

	done    chan struct{} // closed once the process is reaped
	waitErr error         // valid after done

	stdout, stderr *wire.LineLogger
}

// frameBuf is an io.Writer appending to a reusable buffer whose first
// headerSize bytes are the frame header.
type frameBuf struct{ b []byte }

func (f *frameBuf) Write(p []byte) (int, error) {
	f.b = append(f.b, p...)
	return len(p), nil
}

func (f *frameBuf) reset(kind byte) {
	if cap(f.b) > keepBuf {
		f.b = nil
	}
	if f.b == nil {
		f.b = make([]byte, headerSize, initBuf)
	}
	f.b = f.b[:headerSize]
	f.b[4] = kind
}

// startLoaded starts a runner and loads code into it. On success the process
// is idle and ready for events. pool, which tracks the process, may be nil
// (Check).
func (e *Engine) startLoaded(ctx context.Context, spec engines.Spec, interp string, code []byte, pool *procpool.Pool[*proc]) (*proc, error) {
	start := time.Now()
	deadline := start.Add(e.cfg.LoadTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if len(code) > maxFrame {
		return nil, fmt.Errorf("%w: the code is larger than %d bytes", engines.ErrInvalidCode, maxFrame)
	}
	p, err := e.spawn(spec, interp)
	if err != nil {
		return nil, err
	}
	if pool != nil && !pool.Track(p) {
		p.Retire()
		return nil, ErrClosed
	}
	// The load frame is written at once; the runner reads it after its hello.
	p.wbuf.reset(kindLoad)
	p.wbuf.b = append(p.wbuf.b, code...)
	var kind byte
	var payload []byte
	hello := false
	if !p.arm(ctx, deadline) {
		p.timedOut.Store(true)
		err = errProcessGone
	} else {
		err = p.writeFrame()
		if err == nil {
			kind, _, err = p.readFrame()
			if err == nil && kind != kindHello {
				err = fmt.Errorf("protocol error: expected a hello frame, got %q", kind)
			}
		}
		if err == nil {
			hello = true
			kind, payload, err = p.readFrame()
		}
		p.disarm()
	}
	if err == nil && kind == kindOK && p.healthy() && !p.pending() {
		return p, nil
	}
	p.Retire()
	if pool != nil {
		pool.Untrack(p)
	}
	switch {
	case p.timedOut.Load():
		return nil, fmt.Errorf("%w: starting the runner and loading the code took longer than %v",
			engines.ErrTimeout, deadline.Sub(start).Round(time.Millisecond))
	case p.cancelled.Load():
		return nil, fmt.Errorf("python engine: loading the code: %w", ctx.Err())
	case err != nil && hello:
		// The runner was up and running the worker's top-level code.
		return nil, &Error{Kind: engines.ErrInvalidCode, Message: fmt.Sprintf(
			"the interpreter exited while loading the code (%v)%s", p.waitErr, p.stderr.Tail())}
	case err != nil:
		return nil, fmt.Errorf("python engine: the runner failed to start (%v; %v)%s", err, p.waitErr, p.stderr.Tail())
	case kind == kindError:
		return nil, wire.DecodeError(engines.ErrInvalidCode, payload)
	default:
		return nil, fmt.Errorf("python engine: protocol error: unexpected frame %q in reply to load", kind)
	}
}

// spawn starts the runner subprocess.
func (e *Engine) spawn(spec engines.Spec, interp string) (*proc, error) {
	pipes, err := procpool.NewPipes()
	if err != nil {
		return nil, fmt.Errorf("python engine: %w", err)
	}
	log := spec.Logger
	p := &proc{
		reqW:   pipes.ReqW,
		respR:  pipes.RespR,
		done:   make(chan struct{}),
		stdout: wire.NewLineLogger(log, "stdout", spec.WorkerID, false),
		stderr: wire.NewLineLogger(log, "stderr", spec.WorkerID, true),
	}
	// -I: isolated (no user site, no current directory on sys.path, PYTHON*
	// variables ignored); -B: no bytecode written; -u: unbuffered output.
	args := []string{"-I", "-B", "-u", "-c", runnerSource, strconv.Itoa(e.runnerSpinMicros()), strings.Join(e.cfg.AllowedPackages, ","), e.cfg.DevKitDir}
	var cmd *exec.Cmd
	if e.cfg.Sandbox != nil {
		ro, err := e.readOnly(context.Background(), interp)
		if err != nil {
			pipes.CloseChildEnds()
			pipes.CloseParentEnds()
			return nil, err
		}
		cmd, p.release, err = e.cfg.Sandbox.Command(sandbox.Spec{
			Owner: spec.WorkerID, Path: interp, Args: args, Env: e.workerEnv(spec), ReadOnly: ro, ExtraFiles: pipes.ChildEnds(),
		})
		if err != nil {
			pipes.CloseChildEnds()
			pipes.CloseParentEnds()
			return nil, fmt.Errorf("python engine: %w", err)
		}
	} else {
		// -I: isolated (no user site, no current directory on sys.path,
		// PYTHON* variables ignored); -B: no bytecode written; -u:
		// unbuffered output.
		cmd = exec.Command(interp, args...)
		cmd.ExtraFiles = pipes.ChildEnds() // fd 3, fd 4
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
		return nil, fmt.Errorf("python engine: starting %s: %w", interp, err)
	}
	p.pid = cmd.Process.Pid
	p.timer = time.AfterFunc(time.Hour, p.onTimeout)
	p.timer.Stop()
	go p.wait()
	if p.respRC, err = p.respR.SyscallConn(); err != nil {
		p.Retire()
		return nil, fmt.Errorf("python engine: %w", err)
	}
	p.readFn = p.readRaw
	return p, nil
}

// workerEnv is what the worker gets of the environment: Config.Env and the
// documented VIRTUFIN_WORKER_* variables (exec.Cmd keeps the last value of
// a duplicated key).
func (e *Engine) workerEnv(spec engines.Spec) []string {
	env := append([]string{"LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin"}, e.cfg.Env...)
	return append(env,
		"VIRTUFIN_WORKER_ID="+spec.WorkerID,
		"VIRTUFIN_WORKER_GROUP="+spec.Group,
		"VIRTUFIN_WORKER_TOPIC="+spec.Topic,
	)
}

// wait reaps the process. Once the leader has exited (and before it is
// reaped, so that its pid cannot be reused yet) the whole process group is
// killed: processes the worker forked must not keep the protocol pipes open.
func (p *proc) wait() {
	if canWaitNoReap {
		waitExitedNoReap(p.pid)
		p.mu.Lock()
		p.exited = true
		syscall.Kill(-p.pid, syscall.SIGKILL)
		p.mu.Unlock()
		p.waitErr = p.cmd.Wait()
	} else {
		err := p.cmd.Wait()
		p.mu.Lock()
		p.exited = true
		p.mu.Unlock()
		p.waitErr = err
	}
	p.stdout.Flush()
	p.stderr.Flush()
	p.releaseOnce()
	close(p.done)
}

// Kill SIGKILLs the runner's process group (the runner and anything it
// started), unless the runner is already gone. Safe from any goroutine.
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

// CloseRequests closes the request pipe: the runner sees EOF and exits.
func (p *proc) CloseRequests() {
	if !p.reqClosed {
		p.reqClosed = true
		p.reqW.Close()
	}
}

// Done is closed once the process is reaped.
func (p *proc) Done() <-chan struct{} { return p.done }

// Retire kills the process, reaps it and releases its descriptors. The
// caller must own p (no round trip in progress).
func (p *proc) Retire() {
	p.timer.Stop()
	p.Kill()
	<-p.done
	p.CloseRequests()
	p.respR.Close()
}

// arm starts the deadline timer and ctx watch for a round trip: expiry or
// cancellation kill the process, which ends a blocked read or write (EOF,
// EPIPE). It returns false, doing nothing, when the deadline has passed
// already. A successful arm must be followed by disarm.
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

// disarm stops what arm started. If the timer or ctx fired in the meantime,
// timedOut or cancelled is set and the process is (being) killed.
func (p *proc) disarm() {
	p.timer.Stop()
	if p.stopCtx != nil {
		p.stopCtx()
		p.stopCtx = nil
	}
}

// healthy reports whether p can serve another call.
func (p *proc) healthy() bool {
	return !p.timedOut.Load() && !p.cancelled.Load()
}

// writeFrame fills in the length of the frame prepared in p.wbuf and writes
// it with one write (barring short writes of big frames).
func (p *proc) writeFrame() error {
	b := p.wbuf.b
	binary.LittleEndian.PutUint32(b, uint32(len(b)-headerSize))
	_, err := p.reqW.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		return errProcessGone
	}
	return err
}

// readFrame reads one frame. The payload aliases p.rbuf and is valid until
// the next readFrame. Bytes read past the frame are kept for the next call
// (only the load handshake sends two frames in a row).
func (p *proc) readFrame() (byte, []byte, error) {
	n := 0
	if p.rend > p.rstart {
		n = copy(p.rbuf, p.rbuf[p.rstart:p.rend])
	} else if cap(p.rbuf) > keepBuf || p.rbuf == nil {
		p.rbuf = make([]byte, initBuf)
	}
	p.rstart, p.rend = 0, 0
	buf := p.rbuf[:cap(p.rbuf)]
	need := headerSize
	for {
		if need == headerSize && n >= headerSize {
			size := binary.LittleEndian.Uint32(buf)
			if size > maxFrame {
				return 0, nil, fmt.Errorf("protocol error: frame of %d bytes", size)
			}
			need = headerSize + int(size)
			if need > len(buf) {
				nb := make([]byte, need)
				copy(nb, buf[:n])
				buf = nb
				p.rbuf = nb
			}
		}
		if n >= need {
			break
		}
		m, err := p.readSome(buf[n:])
		if err != nil {
			return 0, nil, err
		}
		if m == 0 {
			return 0, nil, errProcessGone
		}
		n += m
	}
	p.rstart, p.rend = need, n
	return buf[4], buf[headerSize:need], nil
}

// pending reports whether bytes beyond the last frame were read.
func (p *proc) pending() bool { return p.rend > p.rstart }

// readSome reads what is available, waiting for at least one byte. While
// p.spin lasts it busy-polls the non-blocking pipe (a reply from a fast worker
// then costs no thread wake-up on either side, which dominates the round
// trip on small VMs); after that it parks in the runtime poller.
func (p *proc) readSome(b []byte) (int, error) {
	p.rdBuf = b
	err := p.respRC.Read(p.readFn)
	p.rdBuf = nil
	if err != nil {
		return 0, err
	}
	return p.rdN, p.rdErr
}

func (p *proc) readRaw(fd uintptr) bool {
	for {
		n, err := syscall.Read(int(fd), p.rdBuf)
		switch err {
		case nil:
			p.rdN, p.rdErr = n, nil
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if p.spin <= 0 {
				return false
			}
			if time.Since(p.spinFrom) > p.spin {
				p.spin = 0 // spin once per reply
				p.spinMissed = true
				return false
			}
		default:
			p.rdN, p.rdErr = 0, err
			return true
		}
	}
}

// spinners counts callers busy-polling right now, across all instances:
// they are kept below the number of CPUs so that the workers they wait for
// still get CPU time.
var spinners atomic.Int32

var maxSpinners = int32(runtime.NumCPU() / 2)

// runnerSpinMicros is how long the runner busy-polls for the next request
// after a reply: long enough to cover the Go side's turnaround.
func (e *Engine) runnerSpinMicros() int {
	if e.cfg.SpinWait <= 0 || maxSpinners == 0 {
		return 0
	}
	return int(min(e.cfg.SpinWait, maxRunnerSpin) / time.Microsecond)
}

// startSpin enables busy-polling for the next reply unless recent spins
// mostly ran out (a slow worker: then it only probes now and then) or enough
// callers spin already. endSpin must follow.
func (p *proc) startSpin(budget time.Duration) bool {
	if budget <= 0 || maxSpinners == 0 {
		return false
	}
	p.calls++
	if p.spinScore <= -4 && p.calls%32 != 0 {
		return false
	}
	if spinners.Add(1) > maxSpinners {
		spinners.Add(-1)
		return false
	}
	p.spin = budget
	p.spinFrom = time.Now()
	p.spinMissed = false
	return true
}

// endSpin ends busy-polling and scores whether it paid off.
func (p *proc) endSpin(spun bool) {
	if !spun {
		return
	}
	spinners.Add(-1)
	p.spin = 0
	if p.spinMissed {
		p.spinScore = max(p.spinScore-1, -8)
	} else {
		p.spinScore = min(p.spinScore+1, 8)
	}
}

var _ io.Writer = (*frameBuf)(nil)

func (p *proc) releaseOnce() {
	if p.release != nil {
		p.releaseDone.Do(p.release)
	}
}
