// Package sandboxtest gives tests a real sandbox in strict mode (every OS
// layer of engines/sandbox).
package sandboxtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/virtufin/workmanager/engines/sandbox"
)

// RequireEnv, when set (make test does as root), turns a missing layer into
// a failure instead of a skip.
const RequireEnv = "WM_REQUIRE_SANDBOX"

// Strict returns a strict sandbox with the default limits and /tmp and
// /scratch sizes, except a 16 MiB file size (a test that fills the disk
// writes that much, not 100 MiB). Where the layers cannot exist (not root, no bubblewrap)
// it skips tb, unless RequireEnv is set.
func Strict(tb testing.TB) *sandbox.Sandbox {
	tb.Helper()
	limits := sandbox.DefaultLimits
	limits.FileSize = 16 << 20
	return New(tb, sandbox.Config{Mode: sandbox.Strict, Log: slog.New(slog.DiscardHandler), Limits: limits})
}

// New is sandbox.New with cmd/sandbox-exec (ExecPath) unless cfg names
// one; a strict sandbox that cannot exist here skips tb, unless RequireEnv
// is set.
func New(tb testing.TB, cfg sandbox.Config) *sandbox.Sandbox {
	tb.Helper()
	if cfg.Exec == "" {
		cfg.Exec = ExecPath(tb)
	}
	s, err := sandbox.New(context.Background(), cfg)
	if err != nil {
		if os.Getenv(RequireEnv) != "" {
			tb.Fatal(err)
		}
		tb.Skip(err)
	}
	return s
}

var (
	execOnce sync.Once
	execPath string
	execErr  error
)

// ExecPath is cmd/sandbox-exec built once per test process (the test
// binary has no sandbox-exec beside it, as the node's has), at one path
// in the temporary directory that every test process shares: a test
// process has no hook at its exit to remove a directory of its own, and
// one per process piled up in /tmp. Each build goes to a file of its own
// and is renamed over the shared one (atomic: a process running the
// previous one keeps it).
func ExecPath(tb testing.TB) string {
	tb.Helper()
	execOnce.Do(func() {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("wm-sandbox-exec-%d", os.Getuid()))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			execErr = err
			return
		}
		// 0755 and world-readable: it runs before the user layer, but keep
		// it usable from anywhere.
		_ = os.Chmod(dir, 0o755)
		p := filepath.Join(dir, "sandbox-exec")
		tmp := fmt.Sprintf("%s.%d", p, os.Getpid())
		out, err := exec.Command("go", "build", "-o", tmp, "github.com/virtufin/workmanager/cmd/sandbox-exec").CombinedOutput()
		if err == nil {
			err = os.Rename(tmp, p)
		}
		if err != nil {
			os.Remove(tmp)
			execErr = fmt.Errorf("building cmd/sandbox-exec: %v\n%s", err, out)
			return
		}
		execPath = p
	})
	if execErr != nil {
		tb.Fatal(execErr)
	}
	return execPath
}

// Leak is what a node holds without close-on-exec (as its own parent, or
// an in-process native library, leaves it): a TCP connection to a
// loopback listener and an open file. A test makes one before it starts
// worker processes and checks, while they run, that none of them holds
// either and that nothing reached the listener.
type Leak struct {
	File     string // the open file's path
	sock     int
	inode    string // "socket:[N]"
	received chan []byte
	ln       net.Listener
}

// NodeDescriptors makes a Leak in this process, closed when tb ends.
func NodeDescriptors(tb testing.TB) *Leak {
	tb.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	l := &Leak{ln: ln, received: make(chan []byte, 1)}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var buf bytes.Buffer
		_, _ = io.Copy(&buf, c)
		l.received <- buf.Bytes()
	}()
	// syscall.Socket, not net.Dial: no SOCK_CLOEXEC, as C code opens them.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	if err := syscall.Connect(fd, &syscall.SockaddrInet4{Port: addr.Port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	l.sock = fd
	l.inode, _ = os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	l.File = filepath.Join(tb.TempDir(), "node-secret")
	if err := os.WriteFile(l.File, []byte("secret"), 0o600); err != nil {
		tb.Fatal(err)
	}
	ffd, err := syscall.Open(l.File, syscall.O_RDWR, 0) // no O_CLOEXEC
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Close(fd); syscall.Close(ffd); ln.Close() })
	return l
}

// Holders lists the other processes that hold the leaked socket or file
// ("pid fd -> target"), found in /proc/*/fd.
func (l *Leak) Holders() []string {
	var found []string
	self := strconv.Itoa(os.Getpid())
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil || p.Name() == self {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name()))
			if err == nil && (target == l.inode || target == l.File) {
				found = append(found, p.Name()+" "+fd.Name()+" -> "+target)
			}
		}
	}
	return found
}

// Reached shuts this process's side of the connection and returns what
// the listener received through it and what the file holds ("secret"
// unless something wrote it). Once only.
func (l *Leak) Reached(tb testing.TB) (received []byte, file string) {
	tb.Helper()
	_ = syscall.Shutdown(l.sock, syscall.SHUT_WR)
	select {
	case received = <-l.received:
	case <-time.After(time.Minute):
		tb.Fatal("the listener's connection did not end")
	}
	b, _ := os.ReadFile(l.File)
	return received, string(b)
}

// Check fails tb if another process holds the leaked socket or file, or
// anything reached the listener or the file changed. Call it while the
// worker's processes run; once only.
func (l *Leak) Check(tb testing.TB) {
	tb.Helper()
	if h := l.Holders(); len(h) > 0 {
		tb.Errorf("a node descriptor reached a worker process: %s", strings.Join(h, "; "))
	}
	got, file := l.Reached(tb)
	if len(got) > 0 {
		tb.Errorf("the node's loopback listener received %q from a worker", got)
	}
	if file != "secret" {
		tb.Errorf("the node's open file was written: %q", file)
	}
}
