package dotnet

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/childproc"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// Frame kinds (host/Host.cs has the protocol).
const (
	kindLoad         = wire.KindLoad
	kindSetup        = wire.KindSetup
	kindEvent        = wire.KindEvent
	kindHello        = wire.KindHello
	kindOK           = wire.KindOK
	kindResult       = wire.KindResult
	kindError        = wire.KindError
	kindGateway      = wire.KindGateway
	kindGatewayReply = wire.KindGatewayReply
)

// names say what a host is in messages.
var names = childproc.Names{Engine: "dotnet", Process: ".NET worker host", Runtime: ".NET host", Closed: ErrClosed}

// proc is one host process: the shared child process with a buffered
// reader on its reply pipe.
type proc struct {
	childproc.Proc
	rd  *bufio.Reader
	hdr [wire.HeaderSize]byte
	// maxReply bounds a reply frame's payload (Config.MaxReplyBytes).
	maxReply int
	// wbuf is the event frame being written (header, then the event's
	// JSON, encoded in place); rbuf the last frame read. Both are kept
	// for the next call unless one big message grew them past keepBuf.
	wbuf, rbuf []byte
	// slot is a spare host's directory of worker files (spare.go); "" for
	// a host started for its worker.
	slot string
}

// keepBuf caps the frame buffers a host keeps between calls. A buffer up
// to it is reused by the next call, so a large event or reply costs no
// new buffer each time (the node's largest event by default, 1 MiB of
// data, makes a frame of up to 1.4 MiB as base64); one grown past it by a
// bigger message is dropped after use. A host thus holds at most two
// buffers of keepBuf in the node, and only after calls that big.
const keepBuf = 16 << 20

// frameWriter appends to p.wbuf (an io.Writer for event.WriteJson).
type frameWriter struct{ p *proc }

func (w frameWriter) Write(b []byte) (int, error) {
	w.p.wbuf = append(w.p.wbuf, b...)
	return len(b), nil
}

// startFrame starts an event frame of kind in p.wbuf; the payload is
// appended through frameWriter{p} and sent with sendFrame.
func (p *proc) startFrame(kind byte) {
	if cap(p.wbuf) > keepBuf {
		p.wbuf = nil
	}
	p.wbuf = append(p.wbuf[:0], 0, 0, 0, 0, kind)
}

// sendFrame writes the frame built in p.wbuf with one write.
func (p *proc) sendFrame() error {
	n := len(p.wbuf) - wire.HeaderSize
	if n > wire.MaxFrame {
		return fmt.Errorf("frame of %d bytes is too large", n)
	}
	binary.LittleEndian.PutUint32(p.wbuf, uint32(n))
	_, err := p.ReqW.Write(p.wbuf)
	if errors.Is(err, syscall.EPIPE) {
		return childproc.ErrGone
	}
	return err
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
	// A spare host (spare.go) said hello already: it gets the worker's
	// files in its slot, its variables, then the load request.
	p, onSpare, setup, refill := e.takeSpare(ctx, spec, w)
	defer refill() // the next spare starts once this host is loaded
	if p != nil {
		w = onSpare
	} else if p, err = e.spawn(spec, rt, w.dir, false, nil); err != nil {
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
	hello := setup != nil
	if !p.Arm(ctx, deadline) {
		p.MarkTimedOut()
		err = childproc.ErrGone
	} else {
		if !hello {
			kind, payload, err = p.readFrame()
			if err == nil && kind != kindHello {
				err = fmt.Errorf("protocol error: expected a hello frame, got %q", kind)
			}
		} else {
			err = p.writeFrame(kindSetup, setup)
		}
		if err == nil {
			hello = true
			if err = p.writeFrame(kindLoad, req); err == nil {
				kind, payload, err = p.readFrame()
			}
		}
		p.Disarm()
	}
	if err == nil && kind == kindOK && p.Healthy() {
		return p, nil
	}
	p.Retire()
	if pool != nil {
		pool.Untrack(p)
	}
	return nil, p.LoadFailure(ctx, names, hello, kind, payload, err, deadline.Sub(start))
}

// spawn starts a host process that reads the worker's files from dir
// (bound read-only into its sandbox), warming the host's code before its
// hello when warm (a spare's start, off any call's path); cleanup, when
// set, runs once the process has exited.
func (e *Engine) spawn(spec engines.Spec, rt *runtime, dir string, warm bool, cleanup func()) (*proc, error) {
	pipes, err := procpool.NewPipes()
	if err != nil {
		return nil, fmt.Errorf("dotnet engine: %w", err)
	}
	p := &proc{maxReply: e.cfg.MaxReplyBytes}
	p.Init(pipes, spec.Logger, spec.WorkerID)
	p.rd = bufio.NewReaderSize(p.RespR, 16<<10)
	// --debug: file and line numbers in the worker's stack traces; a
	// spare (no worker yet) warms the host's code first (Host.cs, Warm).
	args := []string{"--debug", rt.host()}
	if warm {
		args = append(args, "--warm")
		if len(e.lockdown) > 0 {
			// The spare installs the lockdown filter before its hello;
			// the load request names it again (Host.cs, LockdownEarly).
			args = append(args, "--lockdown="+base64.StdEncoding.EncodeToString(e.lockdown))
		}
	}
	var cmd *exec.Cmd
	var release func()
	if e.cfg.Sandbox != nil {
		cmd, release, err = e.cfg.Sandbox.Command(sandbox.Spec{
			Owner: spec.WorkerID, Path: rt.mono, Args: args, Env: e.workerEnv(spec),
			ReadOnly:   []string{"/etc/mono", rt.dir, dir},
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
	if cleanup != nil {
		sandboxRelease := release
		release = func() {
			if sandboxRelease != nil {
				sandboxRelease()
			}
			cleanup()
		}
	}
	if err := p.Start(cmd, release, pipes); err != nil {
		return nil, fmt.Errorf("dotnet engine: starting %s: %w", rt.mono, err)
	}
	return p, nil
}

// workerEnv is what the host gets of the environment: Config.Env, the
// documented VIRTUFIN_WORKER_* variables and Mono's settings.
func (e *Engine) workerEnv(spec engines.Spec) []string {
	// No shared memory area (performance counters): nothing in the sandbox
	// reads it.
	return childproc.Env(spec, e.cfg.Env, "MONO_DISABLE_SHARED_AREA=1")
}

// writeFrame sends one frame of kind with payload.
func (p *proc) writeFrame(kind byte, payload []byte) error {
	p.startFrame(kind)
	p.wbuf = append(p.wbuf, payload...)
	return p.sendFrame()
}

// readFrame reads one frame; the payload is valid until the next read. A
// frame over its kind's limit (wire.ChildFrameLimit of maxReply) is a
// *wire.FrameTooLargeError, found on its header before anything is
// allocated; the buffer grows only as the frame's bytes arrive.
func (p *proc) readFrame() (byte, []byte, error) {
	if _, err := io.ReadFull(p.rd, p.hdr[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, os.ErrClosed) {
			return 0, nil, childproc.ErrGone
		}
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(p.hdr[:])
	kind := p.hdr[4]
	if limit := wire.ChildFrameLimit(kind, p.maxReply); int64(n) > int64(limit) {
		return 0, nil, &wire.FrameTooLargeError{Kind: kind, Size: int64(n), Limit: limit}
	}
	if cap(p.rbuf) > keepBuf {
		p.rbuf = nil
	}
	b, err := wire.ReadPayload(p.rd, p.rbuf, int(n))
	if err != nil {
		return 0, nil, childproc.ErrGone
	}
	p.rbuf = b
	return kind, b, nil
}
