package childproc

import (
	"os/exec"
	"sync"
	"syscall"
)

// Group is the process group of a child started with Setpgid (SetGroup):
// Kill ends the child and everything it started, and Wait kills the
// group once the child has exited, before reaping it (so that its pid,
// the group's id, cannot be reused yet). Proc does the same for the
// Python and .NET children; the native host uses a Group directly.
type Group struct {
	mu     sync.Mutex
	pid    int
	exited bool
}

// SetGroup makes cmd start in a process group of its own (keeping the rest
// of its SysProcAttr).
func SetGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// Started records the pid of the started child.
func (g *Group) Started(pid int) {
	g.mu.Lock()
	g.pid = pid
	g.mu.Unlock()
}

// Kill SIGKILLs the group unless the child is gone already. Safe from any
// goroutine.
func (g *Group) Kill() {
	g.mu.Lock()
	if g.pid > 0 && !g.exited {
		syscall.Kill(-g.pid, syscall.SIGKILL)
	}
	g.mu.Unlock()
}

// Wait waits for cmd (started, its pid given to Started) and reaps it;
// once the child has exited, what it started is killed with it: nothing it
// forked keeps its pipes open.
func (g *Group) Wait(cmd *exec.Cmd) error {
	if canWaitNoReap {
		waitExitedNoReap(g.pid)
		g.mu.Lock()
		g.exited = true
		syscall.Kill(-g.pid, syscall.SIGKILL)
		g.mu.Unlock()
		return cmd.Wait()
	}
	err := cmd.Wait()
	g.mu.Lock()
	g.exited = true
	g.mu.Unlock()
	return err
}
