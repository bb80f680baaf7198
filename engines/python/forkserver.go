package python

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// The fork server (forkserver.py, Config.ForkServer, PYTHON_FORK_SERVER):
// one Python process per engine that imports what every runner imports
// once and forks a runner per spawn, each child sandboxing itself by the
// sandbox's Plan before it runs anything of a worker's, instead of an
// interpreter started behind bwrap, prlimit and setpriv. A runner costs
// less CPU to start and shares the server's pages. Used when the sandbox
// is Forkable (root, the namespaces and user layers) and the interpreter
// is the engine's; otherwise, and whenever the server cannot be reached,
// runners start through the sandbox's chain as before.
//
// Each child is a supervisor (the server's child, in a session of its
// own) and the runner it forked as the first process of a new PID
// namespace. The node talks to the supervisor on a socket of that child's
// own: the runner's pid, a kill, and how the runner ended. Nothing of a
// worker's passes through the server: the plan goes to the supervisor on
// a pipe. The server's death takes no child with it (the node starts
// another on the next spawn); the node's death takes every child (the
// life pipe, whose only write end the node holds).

//go:embed forkserver.py
var forkServerSource string

// forkServerBootstrap is the server's -c: it runs the source that comes
// first on its stdin.
const forkServerBootstrap = `import sys; s = sys.stdin.buffer; exec(compile(s.read(int(s.readline())), "<workmanager fork server>", "exec"))`

// forkServerRequestTimeout bounds one request's round trip to the server
// (a fork and a write: milliseconds); past it the server is taken for hung,
// killed, and the spawn goes through the chain.
const forkServerRequestTimeout = 10 * time.Second

// maxPlan bounds a plan's JSON (the server's child refuses more).
const maxPlan = 1 << 20

// forkServer is one running fork server.
type forkServer struct {
	log   *slog.Logger
	mu    sync.Mutex // one request at a time
	cmd   *exec.Cmd
	ctrl  *net.UnixConn
	lifeW *os.File // never closed by the node: its exit closes it
	done  chan struct{}
}

// startForkServer starts a fork server on interp with the runner's
// compiled code (or its source when runner is nil).
func startForkServer(interp string, hexversion int64, runner []byte, log *slog.Logger) (*forkServer, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("python fork server: %w", err)
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "fork-server"), os.NewFile(uintptr(fds[1]), "fork-server")
	defer theirs.Close()
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, fmt.Errorf("python fork server: %w", err)
	}
	ctrl, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, errors.New("python fork server: not a unix socket")
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("python fork server: %w", err)
	}
	defer lifeR.Close()
	// On stdin: the server's source (its length on a line first), then
	// the runner's code: the command line, which every child shows in ps,
	// stays short.
	in := append([]byte(strconv.Itoa(len(forkServerSource))+"\n"), forkServerSource...)
	if runner != nil {
		in = append(append(in, 'M'), runner...)
	} else {
		in = append(append(in, 'S'), runnerSource...)
	}
	cmd := exec.Command(interp, "-I", "-S", "-B", "-u", "-c", forkServerBootstrap, strconv.FormatInt(hexversion, 10))
	cmd.Stdin = bytes.NewReader(in)
	cmd.Env = []string{"LANG=C.UTF-8"}
	cmd.Dir = "/"
	cmd.ExtraFiles = []*os.File{theirs, lifeR}
	out := wire.NewLineLogger(log, "stderr", "python-fork-server", true)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = time.Second
	// Its own process group (a worker's kill never reaches it), and it
	// dies with the node.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		ctrl.Close()
		lifeW.Close()
		return nil, fmt.Errorf("python fork server: starting %s: %w", interp, err)
	}
	f := &forkServer{log: log, cmd: cmd, ctrl: ctrl, lifeW: lifeW, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		out.Flush()
		log.Info("python fork server exited", "pid", cmd.Process.Pid, "status", fmt.Sprint(err))
		close(f.done)
	}()
	return f, nil
}

// alive reports whether the server has not exited.
func (f *forkServer) alive() bool {
	select {
	case <-f.done:
		return false
	default:
		return true
	}
}

// stop kills the server; its children go on (they die with the node).
func (f *forkServer) stop() {
	f.ctrl.Close()
	if f.cmd.Process != nil {
		_ = f.cmd.Process.Kill()
	}
}

// spawn forks a runner that carries out plan, with files as its fds 0-4
// (stdin, stdout, stderr, requests, responses; the caller closes its
// copies afterwards). The runner is sandboxed before its code runs; spawn
// returns once its supervisor has said its pid.
func (f *forkServer) spawn(plan *sandbox.Plan, files [5]*os.File) (*forked, error) {
	planJSON, err := json.Marshal(plan)
	if err != nil {
		return nil, fmt.Errorf("python fork server: %w", err)
	}
	if len(planJSON) > maxPlan {
		return nil, fmt.Errorf("python fork server: the plan is %d bytes, more than %d", len(planJSON), maxPlan)
	}
	planR, planW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("python fork server: %w", err)
	}
	defer planR.Close()
	go func() { // a plan larger than the pipe's buffer must not block the request
		_, _ = planW.Write(planJSON)
		planW.Close()
	}()
	sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("python fork server: %w", err)
	}
	status, theirs := os.NewFile(uintptr(sp[0]), "runner-status"), os.NewFile(uintptr(sp[1]), "runner-status")
	defer theirs.Close()
	fds := []int{int(planR.Fd()), int(theirs.Fd())}
	for _, fl := range files {
		fds = append(fds, int(fl.Fd()))
	}
	f.mu.Lock()
	reply, err := f.request(syscall.UnixRights(fds...))
	f.mu.Unlock()
	if err != nil {
		status.Close()
		f.stop()
		return nil, err
	}
	supervisor, convErr := strconv.Atoi(strings.TrimPrefix(reply, "o "))
	if !strings.HasPrefix(reply, "o ") || convErr != nil {
		status.Close()
		return nil, fmt.Errorf("python fork server: %s", strings.TrimPrefix(reply, "e "))
	}
	h := &forked{server: f, status: status, supervisor: supervisor, supervisorStart: startTime(supervisor), done: make(chan struct{})}
	started := make(chan error, 1)
	go h.read(started)
	timer := time.NewTimer(forkServerRequestTimeout)
	defer timer.Stop()
	select {
	case err := <-started:
		if err != nil {
			h.Kill()
			<-h.done
			return nil, err
		}
	case <-timer.C:
		h.Kill()
		status.Close()
		<-h.done
		return nil, errors.New("python fork server: the runner's supervisor did not start")
	}
	return h, nil
}

// request sends one fork request and reads the server's answer.
func (f *forkServer) request(oob []byte) (string, error) {
	if err := f.ctrl.SetDeadline(time.Now().Add(forkServerRequestTimeout)); err != nil {
		return "", fmt.Errorf("python fork server: %w", err)
	}
	if _, _, err := f.ctrl.WriteMsgUnix([]byte("F"), oob, nil); err != nil {
		return "", fmt.Errorf("python fork server: sending a request: %w", err)
	}
	buf := make([]byte, 256)
	n, err := f.ctrl.Read(buf)
	if err != nil {
		return "", fmt.Errorf("python fork server: reading its answer: %w", err)
	}
	return string(buf[:n]), nil
}

// forked is one runner forked by a fork server, seen through its
// supervisor's status socket (childproc.External).
type forked struct {
	server *forkServer // keeps the life pipe's write end open while a child runs
	status *os.File
	pid    int
	// supervisor is its supervisor's pid, and supervisorStart that
	// process's start time (0: unknown), for reapOrphan.
	supervisor      int
	supervisorStart uint64

	mu     sync.Mutex
	exited bool
	err    error
	done   chan struct{}
}

// read reads the supervisor's lines: the runner's pid (reported on
// started), then how it ended.
func (h *forked) read(started chan<- error) {
	r := bufio.NewReaderSize(h.status, 64)
	var err error = errors.New("the runner's supervisor exited without saying how the runner ended")
	gotPid := false
	for {
		line, rerr := r.ReadString('\n')
		if rerr != nil {
			break
		}
		kind, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		n, convErr := strconv.Atoi(arg)
		if convErr != nil {
			continue
		}
		switch kind {
		case "p":
			if !gotPid {
				gotPid = true
				h.pid = n
				started <- nil
			}
		case "x":
			err = waitStatusError(syscall.WaitStatus(n))
		}
	}
	if !gotPid {
		started <- errors.New("python fork server: the runner's supervisor failed before starting it")
	}
	h.mu.Lock()
	h.exited, h.err = true, err
	h.mu.Unlock()
	h.status.Close()
	close(h.done)
	h.reapOrphan()
}

// reapOrphan reaps the supervisor, which has closed its socket (it exited),
// when the fork server that forked it has died and cannot: the supervisor
// is then the child of the nearest subreaper or of its PID namespace's
// first process, which is the node in a container (deploy/k8s runs the
// node as its container's first process), and a zombie there stays until
// the node reaps it. While the server lives it reaps its own children and
// the node touches none of them; the pid is reaped only while /proc shows
// it is still the supervisor (its start time), not a process that took its
// number.
func (h *forked) reapOrphan() {
	if h.supervisor <= 0 || h.supervisorStart == 0 {
		return
	}
	select {
	case <-h.server.done:
	case <-time.After(2 * time.Second): // the server's next reaping round is within a second
		if h.server.alive() {
			return
		}
	}
	for range 20 {
		if startTime(h.supervisor) != h.supervisorStart {
			return // reaped (by the server before it died, or by init)
		}
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(h.supervisor, &ws, syscall.WNOHANG, nil)
		if wpid == h.supervisor || errors.Is(err, syscall.ECHILD) {
			return // reaped here, or another's child (init's: it reaps)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startTime is pid's start time in clock ticks since boot (/proc/<pid>/stat
// field 22; a zombie keeps it), 0 when pid does not exist.
func startTime(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64) // field 22: the 20th after the name
	return n
}

// Pid is the runner's pid (the node's PID namespace).
func (h *forked) Pid() int { return h.pid }

// Kill asks the supervisor to SIGKILL the runner: the first process of
// its PID namespace, so everything it started goes with it.
func (h *forked) Kill() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.exited {
		_, _ = h.status.Write([]byte("k"))
	}
}

// Wait waits until the runner has exited and says how.
func (h *forked) Wait() error {
	<-h.done
	return h.err
}

// waitStatusError describes a wait status as os/exec does (nil: exit 0).
func waitStatusError(ws syscall.WaitStatus) error {
	switch {
	case ws.Exited() && ws.ExitStatus() == 0:
		return nil
	case ws.Exited():
		return fmt.Errorf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return fmt.Errorf("signal: %v", ws.Signal())
	}
	return fmt.Errorf("wait status %#x", int(ws))
}

// forkServerRetry is how long after a fork server's start a dead one is
// not started again (runners start through the chain meanwhile): a server
// that cannot run is not restarted for every runner.
var forkServerRetry = 5 * time.Second

// forkRunner starts p's runner from the fork server, when the sandbox
// allows it (Forkable) and a server runs or starts for interp: false
// (nothing done) when the runner must start through the chain. own are
// the runner's own arguments. An error is the sandbox's refusal (as
// Command's), not the server's: a server that fails is stopped and the
// runner starts through the chain.
func (e *Engine) forkRunner(p *proc, spec engines.Spec, interp string, info interpInfo, own []string, pipes *procpool.Pipes) (bool, error) {
	sb := e.cfg.Sandbox
	if e.cfg.NoForkServer || sb == nil || !sb.Forkable() {
		return false, nil
	}
	fs := e.forkServerFor(interp, info)
	if fs == nil {
		return false, nil
	}
	plan, release, err := sb.Plan(sandbox.Spec{Owner: spec.WorkerID, Env: e.workerEnv(spec), ReadOnly: info.ro, Args: own})
	if err != nil {
		return false, err
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		release()
		return false, err
	}
	defer devNull.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		release()
		return false, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		release()
		outR.Close()
		outW.Close()
		return false, err
	}
	h, err := fs.spawn(plan, [5]*os.File{devNull, outW, errW, pipes.ReqR, pipes.RespW})
	outW.Close()
	errW.Close()
	if err != nil {
		release()
		outR.Close()
		errR.Close()
		e.cfg.Logger.Warn("python engine: the fork server failed; this runner starts through the sandbox's programs", "error", err)
		return false, nil
	}
	p.StartExternal(h, outR, errR, release, pipes)
	return true, nil
}

// forkServerFor returns the running fork server for interp, starting one
// if there is none (or it died); nil when none can run now.
func (e *Engine) forkServerFor(interp string, info interpInfo) *forkServer {
	e.fsMu.Lock()
	defer e.fsMu.Unlock()
	if e.fsClosed {
		return nil
	}
	if e.fs != nil && e.fs.alive() && e.fsInterp == interp {
		return e.fs
	}
	if !e.fsStarted.IsZero() && time.Since(e.fsStarted) < forkServerRetry {
		return nil
	}
	if e.fs != nil {
		e.fs.stop()
	}
	fs, err := startForkServer(interp, info.hexversion, info.runner, e.cfg.Logger)
	e.fs, e.fsInterp, e.fsStarted = fs, interp, time.Now()
	if err != nil {
		e.cfg.Logger.Warn("python engine: no fork server; runners start through the sandbox's programs", "error", err)
		return nil
	}
	e.cfg.Logger.Info("python fork server started", "pid", fs.cmd.Process.Pid, "interpreter", interp)
	return fs
}
