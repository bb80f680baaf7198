package python

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/childproc"
)

// Spare runners (Config.Spares, PYTHON_SPARE_RUNNERS; engines/internal/
// spares): runners started ahead of need, past their hello, with no
// worker's settings or code, so that a create, a start or a reload takes
// one instead of starting a runner (forked from the fork server where
// there is one, forkserver.go, else an interpreter inside the sandbox). A
// spare is given to one worker, once: it then gets that worker's settings
// (a setup frame: the VIRTUFIN_WORKER_* variables and its async
// concurrency) and code, and is never given back; it runs under a user id
// of its own (the sandbox's anonymous lease), not its worker's.

// takeSpare returns a ready spare runner given to spec's worker, and the
// setup frame that gives it the worker's settings; nil when none is ready
// (Config.Spares 0: never). Either way the next ones start in the
// background once the caller calls refill (when its runner is loaded).
func (e *Engine) takeSpare(spec engines.Spec) (p *proc, setup []byte, refill func()) {
	p, ok, refill := e.spares.TakeDeferred()
	if !ok {
		return nil, nil, refill
	}
	p.Adopt(spec, spareNames)
	return p, e.setupFrame(spec), refill
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

// startSpare starts a runner for no worker yet and reads its hello.
func (e *Engine) startSpare(interp string) (*proc, error) {
	p, err := e.spawn(engines.Spec{Logger: e.cfg.Logger}, interp)
	if err != nil {
		return nil, err
	}
	if err := p.AwaitHello(p.readFrame, e.cfg.LoadTimeout); err != nil || p.pending() {
		p.Retire()
		return nil, fmt.Errorf("python engine: spare runner: %v", err)
	}
	return p, nil
}

// spareNames name a spare in the node's log.
var spareNames = childproc.Names{Engine: "python", Process: "runner"}

// setupFrame is the frame that gives a spare runner spec's settings.
func (e *Engine) setupFrame(spec engines.Spec) []byte {
	env := map[string]string{}
	for _, kv := range childproc.Env(spec, nil) {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "VIRTUFIN_WORKER_") {
			env[k] = v
		}
	}
	payload, _ := json.Marshal(struct { // strings and an int: cannot fail
		Env            map[string]string `json:"env"`
		MaxConcurrency int               `json:"max_concurrency"`
	}{env, e.maxConcurrency(spec)})
	f := make([]byte, headerSize, headerSize+len(payload))
	f[4] = kindSetup
	f = append(f, payload...)
	binary.LittleEndian.PutUint32(f, uint32(len(payload)))
	return f
}

// writeRaw writes a whole frame (header filled in) to the runner.
func (p *proc) writeRaw(f []byte) error {
	_, err := p.ReqW.Write(f)
	if errors.Is(err, syscall.EPIPE) {
		return errProcessGone
	}
	return err
}
