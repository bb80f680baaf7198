package sandbox

import (
	"runtime"
	"syscall"
	"testing"
)

// Issue 42 item 6: without the namespaces layer a worker shares the
// node's network namespace; its lockdown refuses every socket family but
// AF_UNIX with EPERM (also with upper bits set), and carries the sandbox filter's own
// refusals, which bwrap would install otherwise. The network-only variant
// (for a worker that may start processes) leaves processes alone.
func TestNoNamespacesLockdownDecisions(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("system call numbers below are x86-64's")
	}
	const (
		x8664, i386                           = 0xc000003e, 0x40000003
		allow, eperm, enosys                  = 0x7fff0000, 0x00050000 | uint32(syscall.EPERM), 0x00050000 | uint32(syscall.ENOSYS)
		socket, socketpair, clone, clone3     = 41, 53, 56, 435
		execve, fork, ptrace, unshare, getpid = 59, 57, 101, 272, 39
		threadFlags, sigchld, newUser         = 0x3d0f00 | 0x10000, 17, 0x10000000
	)
	lock, err := NoNamespacesLockdownProgram()
	if err != nil {
		t.Fatal(err)
	}
	network, err := NoNamespacesNetworkProgram()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		arch, nr      uint32
		arg0          uint64
		lock, network uint32
	}{
		{"socket AF_UNIX", x8664, socket, 1, allow, allow},
		{"socket AF_INET", x8664, socket, 2, eperm, eperm},
		{"socket AF_INET6", x8664, socket, 10, eperm, eperm},
		{"socket AF_INET, upper bit set", x8664, socket, 1<<32 | 2, eperm, eperm},
		{"socket AF_UNIX, upper bit set", x8664, socket, 1<<32 | 1, eperm, eperm},
		{"socket AF_NETLINK", x8664, socket, 16, eperm, eperm},
		{"socket AF_PACKET", x8664, socket, 17, eperm, eperm},
		{"socket AF_VSOCK", x8664, socket, 40, eperm, eperm},
		{"socketpair AF_UNIX", x8664, socketpair, 1, allow, allow},
		{"socketpair AF_INET", x8664, socketpair, 2, eperm, eperm},
		{"execve", x8664, execve, 0, eperm, allow},
		{"fork", x8664, fork, 0, eperm, allow},
		{"clone a fork", x8664, clone, sigchld, eperm, allow},
		{"clone a thread", x8664, clone, threadFlags, allow, allow},
		{"clone NEWUSER", x8664, clone, newUser | sigchld, eperm, eperm},
		{"clone3", x8664, clone3, 0, enosys, enosys},
		{"ptrace", x8664, ptrace, 0, eperm, eperm},
		{"unshare", x8664, unshare, newUser, eperm, eperm},
		{"getpid", x8664, getpid, 0, allow, allow},
		{"memfd_create", x8664, 319, 0, eperm, eperm},
		{"shmget", x8664, 29, 0, eperm, eperm},
		{"shmat", x8664, 30, 0, eperm, eperm},
		{"i386 socketcall", i386, 102, 1, enosys, enosys},
	} {
		if got := run(t, lock, c.arch, c.nr, c.arg0); got != c.lock {
			t.Errorf("lockdown %s: %#x, want %#x", c.name, got, c.lock)
		}
		if got := run(t, network, c.arch, c.nr, c.arg0); got != c.network {
			t.Errorf("network %s: %#x, want %#x", c.name, got, c.network)
		}
	}
}
