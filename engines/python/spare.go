package python

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/childproc"
)

// Spare runners (Config.Spares, PYTHON_SPARE_RUNNERS): runners started
// ahead of need, past their hello, with no worker's settings or code, so
// that a create, a start or a reload takes one instead of starting an
// interpreter inside the sandbox (most of a Python runner's start: issue
// 48's fork server, without forking). A spare is given to one worker,
// once: it then gets that worker's settings (a setup frame: the
// VIRTUFIN_WORKER_* variables and its async concurrency) and code, and
// is never given back; it runs under a user id of its own (the sandbox's
// anonymous lease), not its worker's. Spares are started in the
// background, one at a time up to Config.Spares, after a Check or a Load
// took one (or found none); a spare that died while it waited is
// retired, never given out.

// spareSet holds the spare runners; Engine.spareMu guards it.
type spareSet struct {
	idle     []*proc
	starting bool
	closed   bool
}

// takeSpare returns a spare runner bound to spec's worker, or nil when
// none is ready (Config.Spares 0: never); either way it starts the next
// ones in the background.
func (e *Engine) takeSpare(spec engines.Spec, interp string) *proc {
	if e.cfg.Spares <= 0 || interp != e.spareInterp() {
		return nil
	}
	var dead []*proc
	e.spareMu.Lock()
	var p *proc
	for p == nil && len(e.spares.idle) > 0 {
		p = e.spares.idle[0]
		e.spares.idle = e.spares.idle[1:]
		if p.Exited() || !p.Healthy() {
			dead = append(dead, p)
			p = nil
		}
	}
	e.spareMu.Unlock()
	for _, d := range dead {
		d.Retire()
	}
	e.refillSpares(interp)
	if p != nil {
		p.Stdout.Rebind(spec.Logger, spec.WorkerID)
		p.Stderr.Rebind(spec.Logger, spec.WorkerID)
	}
	return p
}

// spareInterp is the interpreter spares run: the engine's (resolved once).
func (e *Engine) spareInterp() string {
	if e.cfg.Interpreter != "" {
		return e.cfg.Interpreter
	}
	e.interpMu.Lock()
	defer e.interpMu.Unlock()
	return e.interp
}

// refillSpares starts spares in the background, one after another, until
// Config.Spares wait (or the engine is closed).
func (e *Engine) refillSpares(interp string) {
	e.spareMu.Lock()
	if e.spares.starting || e.spares.closed || len(e.spares.idle) >= e.cfg.Spares {
		e.spareMu.Unlock()
		return
	}
	e.spares.starting = true
	e.spareMu.Unlock()
	go func() {
		for {
			p, err := e.startSpare(interp)
			e.spareMu.Lock()
			switch {
			case err != nil:
				e.spares.starting = false
				e.spareMu.Unlock()
				e.cfg.Logger.Warn("python engine: a spare runner did not start; creates and starts start their own", "error", err)
				return
			case e.spares.closed:
				e.spares.starting = false
				e.spareMu.Unlock()
				p.Retire()
				return
			}
			e.spares.idle = append(e.spares.idle, p)
			if len(e.spares.idle) >= e.cfg.Spares {
				e.spares.starting = false
				e.spareMu.Unlock()
				return
			}
			e.spareMu.Unlock()
		}
	}()
}

// startSpare starts a runner for no worker yet and reads its hello.
func (e *Engine) startSpare(interp string) (*proc, error) {
	p, err := e.spawn(engines.Spec{Logger: e.cfg.Logger}, interp)
	if err != nil {
		return nil, err
	}
	ok := p.Arm(context.Background(), time.Now().Add(e.cfg.LoadTimeout))
	if ok {
		var kind byte
		kind, _, err = p.readFrame()
		if err == nil && kind != kindHello {
			err = fmt.Errorf("protocol error: expected a hello frame, got %q", kind)
		}
		p.Disarm()
	}
	if !ok || err != nil || !p.Healthy() || p.pending() {
		p.Retire()
		return nil, fmt.Errorf("python engine: spare runner: no hello within %s: %v", e.cfg.LoadTimeout, err)
	}
	return p, nil
}

// closeSpares retires the spares and starts no more.
func (e *Engine) closeSpares() {
	e.spareMu.Lock()
	idle := e.spares.idle
	e.spares.idle, e.spares.closed = nil, true
	e.spareMu.Unlock()
	for _, p := range idle {
		p.Retire()
	}
}

// setupFrame is the frame that gives a spare runner spec's settings.
func (e *Engine) setupFrame(spec engines.Spec) ([]byte, error) {
	env := map[string]string{}
	for _, kv := range childproc.Env(spec, nil) {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "VIRTUFIN_WORKER_") {
			env[k] = v
		}
	}
	payload, err := json.Marshal(struct {
		Env            map[string]string `json:"env"`
		MaxConcurrency int               `json:"max_concurrency"`
	}{env, e.maxConcurrency(spec)})
	if err != nil {
		return nil, err
	}
	f := make([]byte, headerSize, headerSize+len(payload))
	f[4] = kindSetup
	f = append(f, payload...)
	binary.LittleEndian.PutUint32(f, uint32(len(payload)))
	return f, nil
}

// writeRaw writes a whole frame (header filled in) to the runner.
func (p *proc) writeRaw(f []byte) error {
	_, err := p.ReqW.Write(f)
	if errors.Is(err, syscall.EPIPE) {
		return errProcessGone
	}
	return err
}

// spareCount is how many spares wait (tests).
func (e *Engine) spareCount() int {
	e.spareMu.Lock()
	defer e.spareMu.Unlock()
	return len(e.spares.idle)
}
