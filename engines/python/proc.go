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
	"github.com/virtufin/workmanager/engines/internal/childproc"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// Frame kinds (see README.md and engines/internal/wire).
const (
	kindLoad         = wire.KindLoad   // worker source
	kindSetup        = wire.KindSetup  // a spare runner's worker settings
	kindEvent        = wire.KindEvent  // one CloudEvent, structured JSON
	kindHello        = wire.KindHello  // runner started; payload sys.version
	kindOK           = wire.KindOK     // code loaded
	kindResult       = wire.KindResult // JSON null, one event object or a list
	kindError        = wire.KindError  // JSON {"type", "message", "traceback"}
	kindGateway      = wire.KindGateway
	kindGatewayReply = wire.KindGatewayReply
)

const (
	headerSize = wire.HeaderSize
	maxFrame   = wire.MaxFrame
	// A process's frame buffers start at initBuf and are kept for the
	// next call up to keepBuf: a large event or reply reuses them instead
	// of allocating afresh (the node's largest event by default, 1 MiB of
	// data, makes a frame of up to 1.4 MiB as base64). One grown past
	// keepBuf by a bigger message is dropped after use, so a process holds
	// at most two buffers of keepBuf in the node, and only after calls
	// that big (see README.md, Performance).
	initBuf = 16 << 10
	keepBuf = 16 << 20
	// maxRunnerSpin caps the runner's busy-poll for the next request.
	maxRunnerSpin = 25 * time.Microsecond
)

// errProcessGone: the runner closed its end of a protocol pipe (it died or
// was killed).
var errProcessGone = childproc.ErrGone

// names say what a runner is in messages.
var names = childproc.Names{Engine: "python", Process: "worker process", Runtime: "interpreter", Closed: ErrClosed}

// proc is one runner subprocess. At any time it is used by at most one
// goroutine (the owner of its slot); Kill may be called from anywhere.
type proc struct {
	childproc.Proc

	// The parent ends of the protocol pipes are non-blocking, in the
	// runtime poller. Replies are first busy-polled for up to spin (see
	// readSome).
	respRC syscall.RawConn

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
	// maxReply bounds a reply frame's payload (Config.MaxReplyBytes).
	maxReply int
	// rbuf holds the last frame read; rbuf[rstart:rend] are bytes read past it.
	rbuf         []byte
	rstart, rend int

	// async: the runner runs this worker's events concurrently on its
	// event loop (tagged frames, mux.go); reading, from then on the
	// reader goroutine's alone.
	async bool
	// readerOn and readerGone are guarded by the Instance's asyncMux.mu.
	readerOn, readerGone bool
	// wmu serialises the frames of concurrent calls (async only).
	wmu sync.Mutex
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
	// A spare runner (spare.go) said hello already: it gets the worker's
	// settings, then the code.
	p, setup, refill := e.takeSpare(ctx, spec)
	defer refill() // the next spare starts once this runner is loaded
	if p == nil {
		var err error
		if p, err = e.spawn(spec, interp); err != nil {
			return nil, err
		}
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
	var err error
	hello := setup != nil
	if !p.Arm(ctx, deadline) {
		p.MarkTimedOut()
		err = errProcessGone
	} else {
		if setup != nil {
			err = p.writeRaw(setup)
		}
		if err == nil {
			err = p.writeFrame()
		}
		if err == nil && !hello {
			kind, _, err = p.readFrame()
			if err == nil && kind != kindHello {
				err = fmt.Errorf("protocol error: expected a hello frame, got %q", kind)
			}
		}
		if err == nil {
			hello = true
			kind, payload, err = p.readFrame()
		}
		p.Disarm()
	}
	if err == nil && kind == kindOK && p.Healthy() && !p.pending() {
		p.async = string(payload) == asyncOK
		return p, nil
	}
	p.Retire()
	if pool != nil {
		pool.Untrack(p)
	}
	return nil, p.LoadFailure(ctx, names, hello, kind, payload, err, deadline.Sub(start))
}

// spawn starts the runner subprocess.
func (e *Engine) spawn(spec engines.Spec, interp string) (*proc, error) {
	pipes, err := procpool.NewPipes()
	if err != nil {
		return nil, fmt.Errorf("python engine: %w", err)
	}
	p := &proc{maxReply: e.cfg.MaxReplyBytes}
	p.Init(pipes, spec.Logger, spec.WorkerID)
	info, err := e.probe(context.Background(), interp)
	if err != nil {
		pipes.CloseChildEnds()
		pipes.CloseParentEnds()
		return nil, err
	}
	// -I: isolated (no user site, no current directory on sys.path, PYTHON*
	// variables ignored); -S: no site module (the runner sets the sys.path
	// the interpreter's site would, see interpInfo); -B: no bytecode
	// written; -u: unbuffered output.
	own := []string{strconv.Itoa(e.runnerSpinMicros()), strings.Join(e.cfg.AllowedPackages, ","), e.cfg.DevKitDir, info.path,
		strconv.Itoa(e.maxConcurrency(spec))}
	if forked, err := e.forkRunner(p, spec, interp, info, own, pipes); err != nil {
		pipes.CloseChildEnds()
		pipes.CloseParentEnds()
		return nil, fmt.Errorf("python engine: %w", err)
	} else if forked {
		return p.started()
	}
	args := append(append([]string{"-I", "-S", "-B", "-u"}, info.runnerArgs()...), own...)
	var cmd *exec.Cmd
	var release func()
	if e.cfg.Sandbox != nil {
		cmd, release, err = e.cfg.Sandbox.Command(sandbox.Spec{
			Owner: spec.WorkerID, Path: interp, Args: args, Env: e.workerEnv(spec), ReadOnly: info.ro, ExtraFiles: pipes.ChildEnds(),
		})
		if err != nil {
			pipes.CloseChildEnds()
			pipes.CloseParentEnds()
			return nil, fmt.Errorf("python engine: %w", err)
		}
	} else {
		cmd = exec.Command(interp, args...)
		cmd.ExtraFiles = pipes.ChildEnds() // fd 3, fd 4
		cmd.Env = append(os.Environ(), e.workerEnv(spec)...)
	}
	if err := p.Start(cmd, release, pipes); err != nil {
		return nil, fmt.Errorf("python engine: starting %s: %w", interp, err)
	}
	return p.started()
}

// started finishes a spawn once the runner's process runs.
func (p *proc) started() (*proc, error) {
	var err error
	if p.respRC, err = p.RespR.SyscallConn(); err != nil {
		p.Retire()
		return nil, fmt.Errorf("python engine: %w", err)
	}
	p.readFn = p.readRaw
	return p, nil
}

// maxConcurrency is how many events an async def worker of spec runs at
// once (Spec.MaxConcurrency, else Config.MaxConcurrency).
func (e *Engine) maxConcurrency(spec engines.Spec) int {
	if spec.MaxConcurrency > 0 {
		return min(spec.MaxConcurrency, MaxConcurrencyLimit)
	}
	return min(e.cfg.MaxConcurrency, MaxConcurrencyLimit)
}

// maxProcesses is how many runners an Instance of spec may have
// (Spec.MaxProcesses, else Config.MaxProcesses; never below Processes).
func (e *Engine) maxProcesses(spec engines.Spec) int {
	n := e.cfg.MaxProcesses
	if spec.MaxProcesses > 0 {
		n = min(spec.MaxProcesses, MaxProcessesLimit)
	}
	return max(n, e.cfg.Processes)
}

// workerEnv is what the worker gets of the environment: Config.Env and the
// documented VIRTUFIN_WORKER_* variables.
func (e *Engine) workerEnv(spec engines.Spec) []string {
	return childproc.Env(spec, e.cfg.Env, logLevelsEnv)
}

// logLevelsEnv asks the runner to mark each line of a logging record with
// its level (runner.py, _setup_logging), which wire.LineLogger logs at.
const logLevelsEnv = "WORKMANAGER_LOG_LEVELS=1"

// writeFrame fills in the length of the frame prepared in p.wbuf and writes
// it with one write (barring short writes of big frames).
func (p *proc) writeFrame() error {
	b := p.wbuf.b
	binary.LittleEndian.PutUint32(b, uint32(len(b)-headerSize))
	_, err := p.ReqW.Write(b)
	if errors.Is(err, syscall.EPIPE) {
		return errProcessGone
	}
	return err
}

// readFrame reads one frame. The payload aliases p.rbuf and is valid until
// the next readFrame. Bytes read past the frame are kept for the next call
// (only the load handshake sends two frames in a row). A frame over its
// kind's limit (wire.ChildFrameLimit of maxReply) is a
// *wire.FrameTooLargeError, found on its header; the buffer grows only as
// the frame's bytes arrive (at most doubling).
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
			if limit := wire.ChildFrameLimit(buf[4], p.maxReply); int64(size) > int64(limit) {
				return 0, nil, &wire.FrameTooLargeError{Kind: buf[4], Size: int64(size), Limit: limit}
			}
			need = headerSize + int(size)
		}
		if n >= need {
			break
		}
		if n == len(buf) {
			nb := make([]byte, min(need, max(2*len(buf), initBuf)))
			copy(nb, buf[:n])
			buf = nb
			p.rbuf = nb
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

// idle reports whether p can take a call: not timed out or cancelled, no
// reply bytes left unread (a parked runner handed to a Load).
func (p *proc) idle() bool { return p.Healthy() && !p.pending() }

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
