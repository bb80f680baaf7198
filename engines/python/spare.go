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

// Spare runners (Config.Spares, PYTHON_SPARE_RUNNERS; engines/internal/
// spares): runners started ahead of need, past their hello, with no
// worker's settings or code, so that a create, a start or a reload takes
// one instead of starting a runner (forked from the fork server where
// there is one, forkserver.go, else an interpreter inside the sandbox). A
// spare is given to one worker, once: it then gets that worker's settings
// (a setup frame: the VIRTUFIN_WORKER_* variables and its async
// concurrency) and code, and is never given back; it runs under a user id
// of its own (the sandbox's anonymous lease), not its worker's.

// spareRunnerWait bounds how long a runner start waits for a spare being
// started (spares.Set.TakeAwaiting) before it starts a runner itself.
// A spare being started is well under way, and a second start beside it
// would take the CPU that both need: a start right behind the call that
// took the last spare (a stop and a start back to back after a create and
// a reload, each of whose checks took one) forked a runner of its own
// beside the spare started for it, 80 ms on a slow machine where a
// forked runner's start alone is about 50 (docs/performance.md, "A start
// right behind the calls that took the spares").
var spareRunnerWait = 100 * time.Millisecond // a variable for tests

// takeSpare returns a ready spare runner given to spec's worker (or, none
// ready, the one being started, at most spareRunnerWait), and the setup
// frame that gives it the worker's settings; nil when none is ready
// (Config.Spares 0: never). Either way the next ones start in the
// background once the caller calls refill (when its runner is loaded).
func (e *Engine) takeSpare(ctx context.Context, spec engines.Spec) (p *proc, setup []byte, refill func()) {
	p, ok, refill := e.spares.TakeAwaiting(ctx, spareRunnerWait)
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
