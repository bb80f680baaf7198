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

	"golang.org/x/sys/unix"

	"github.com/virtufin/workmanager/engines"
	"github.com/virtufin/workmanager/engines/internal/procpool"
	"github.com/virtufin/workmanager/engines/internal/wire"
	"github.com/virtufin/workmanager/engines/sandbox"
)

// The fork server (forkserver.py, Config.NoForkServer, PYTHON_FORK_SERVER):
// one Python process per engine that imports what every runner imports
// once and forks a runner per spawn, each child sandboxing itself by the
// sandbox's Plan before it runs anything of a worker's, instead of an
// interpreter started behind bwrap, prlimit and setpriv. A runner costs
// less CPU to start and shares the server's pages. Used when the sandbox
// is Forkable (root, the namespaces and user layers) and the interpreter
// is the engine's; otherwise, and whenever the server cannot be reached,
// runners start through the sandbox's chain as before.
//
// Each runner is the second process of a PID namespace of its own, whose
// first is its supervisor (forked by a short-lived child of the server and
// adopted by the server, a subreaper, with nothing tying its life to the
// server's): it reaps what ends in the namespace and talks
// to the node on a socket of its own (its pid, a kill, how the runner
// ended). Nothing of a worker's passes through the server: the plan goes
// to the runner on a pipe. The server's death takes no runner with it (the
// node starts another server on the next spawn); the node's death takes
// every runner (the life pipe, whose only write end the node holds).

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
	f := &forkServer{cmd: cmd, ctrl: ctrl, lifeW: lifeW, done: make(chan struct{})}
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
	// Ours non-blocking: os.File then uses the runtime poller (deadlines,
	// no thread blocked per runner).
	if err := syscall.SetNonblock(sp[0], true); err != nil {
		syscall.Close(sp[0])
		syscall.Close(sp[1])
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
	if !strings.HasPrefix(reply, "o ") {
		status.Close()
		return nil, fmt.Errorf("python fork server: %s", strings.TrimPrefix(reply, "e "))
	}
	h := &forked{server: f, status: status, r: bufio.NewReaderSize(status, 64), pidfd: -1}
	if err := h.start(time.Now().Add(forkServerRequestTimeout)); err != nil {
		h.Kill()
		status.Close() // the supervisor, if any, kills its runner at this EOF
		if h.pidfd >= 0 {
			unix.Close(h.pidfd)
		}
		return nil, err
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
	r      *bufio.Reader
	// pid is the supervisor's (the first process of the runner's PID
	// namespace: killing it ends them all), and pidStart its start time
	// (0: unknown), for reap.
	pid      int
	pidStart uint64
	// pidfd refers to the supervisor (-1: none): readable once it has
	// exited, which Wait waits for after its socket closed (the socket
	// closes while the process is still on its way out).
	pidfd int

	mu     sync.Mutex
	exited bool

	waitOnce sync.Once
	err      error
}

// start reads the supervisor's first line, its pid, by deadline.
func (h *forked) start(deadline time.Time) error {
	if err := h.status.SetReadDeadline(deadline); err != nil {
		return fmt.Errorf("python fork server: %w", err)
	}
	kind, n, err := h.next()
	if err != nil || kind != "p" {
		return fmt.Errorf("python fork server: the runner's supervisor did not start (%v)", err)
	}
	h.pid, h.pidStart = n, startTime(n)
	if h.pidfd, err = unix.PidfdOpen(n, 0); err != nil {
		h.pidfd = -1 // Wait then returns at the socket's close
	}
	return h.status.SetReadDeadline(time.Time{})
}

// next reads one of the supervisor's lines: a kind and a number.
func (h *forked) next() (string, int, error) {
	for {
		line, err := h.r.ReadString('\n')
		if err != nil {
			return "", 0, err
		}
		kind, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		if n, err := strconv.Atoi(arg); err == nil {
			return kind, n, nil
		}
	}
}

// Pid is the supervisor's pid (the node's PID namespace).
func (h *forked) Pid() int { return h.pid }

// Kill asks the supervisor to SIGKILL the runner, and with it everything
// the runner started (its PID namespace ends with the supervisor).
func (h *forked) Kill() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.exited {
		_, _ = h.status.Write([]byte("k"))
	}
}

// Wait reads the supervisor's socket until it closes, then waits (a
// second at most) until the supervisor has exited, not only closed its
// descriptors on the way out (the runner and its namespace are gone by
// then), and says how the runner ended; the first call reads, later ones
// return the same.
func (h *forked) Wait() error {
	h.waitOnce.Do(func() {
		h.err = errors.New("the runner's supervisor exited without saying how the runner ended")
		for {
			kind, n, err := h.next()
			if err != nil {
				break
			}
			if kind == "x" {
				h.err = waitStatusError(syscall.WaitStatus(n))
			}
		}
		if h.pidfd >= 0 {
			fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}}
			for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
				if n, err := unix.Poll(fds, 100); n > 0 || (err != nil && err != unix.EINTR) {
					break
				}
			}
			unix.Close(h.pidfd)
		}
		h.mu.Lock()
		h.exited = true
		h.mu.Unlock()
		h.status.Close()
		h.reap()
	})
	return h.err
}

// reap reaps the supervisor once it has closed its socket (it exited),
// when the node is its parent: the fork server adopts and reaps its
// supervisors, but once the server has died they belong to the next
// reaper, which is the node itself where the node is its container's first
// process (deploy/k8s runs it so), and a zombie there stays until the node
// reaps it. Otherwise Wait4 finds no child of the node's and it returns.
// The pid is reaped only while /proc shows it is still the supervisor (its
// start time), not a process that took its number.
func (h *forked) reap() {
	if h.pid <= 0 || h.pidStart == 0 {
		return
	}
	for range 50 {
		if startTime(h.pid) != h.pidStart {
			return // reaped by its parent
		}
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(h.pid, &ws, syscall.WNOHANG, nil)
		if wpid == h.pid || errors.Is(err, syscall.ECHILD) {
			return // reaped here, or not the node's child
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
