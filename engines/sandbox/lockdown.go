package sandbox

import (
	"os"
	"strconv"
	"sync"
	"syscall"

	seccomp "github.com/elastic/go-seccomp-bpf"
)

// NetworkLockdownFDEnv names the second inherited pipe a sandbox without
// the namespaces layer gives every process (next to LockdownFDEnv's):
// NoNamespacesNetworkProgram, for a process that may start processes (the
// Python runner of a worker with the subprocess capability), which does
// not install the process lockdown but must not reach the node's network
// either.
const NetworkLockdownFDEnv = "WORKMANAGER_NETWORK_LOCKDOWN_FD"

// NoNamespacesLockdownProgram is what a sandbox without the namespaces
// layer (SANDBOX=standard where bubblewrap cannot run) hands every process
// on $LockdownFDEnv instead of ProcessLockdownProgram: the same process
// rules (execve, execveat, fork, vfork and clone without CLONE_THREAD get
// EPERM, clone3 ENOSYS) plus NoNamespacesNetworkProgram's.
func NoNamespacesLockdownProgram() ([]byte, error) { return noNamespacesPrograms.lockdown() }

// NoNamespacesNetworkProgram is the filter a process without the
// namespaces layer installs when it may start processes (on
// $NetworkLockdownFDEnv): such a process shares the node's network
// namespace, so every socket but AF_UNIX gets EPERM (AF_INET, AF_INET6,
// netlink, packet, vsock, ...; a family with upper bits set that the
// kernel's int would drop too), and so do the
// system calls the sandbox's own filter refuses (deniedSyscalls, clone
// with namespace flags) and memorySyscalls (memfd and SysV shared memory:
// without an IPC namespace of its own a segment outlives the process),
// which bwrap would install otherwise. Filters are
// inherited: the processes it starts get it too.
func NoNamespacesNetworkProgram() ([]byte, error) { return noNamespacesPrograms.network() }

var noNamespacesPrograms = struct {
	lockdown, network func() ([]byte, error)
}{
	lockdown: sync.OnceValues(func() ([]byte, error) { return lockdownWithoutNamespaces(true) }),
	network:  sync.OnceValues(func() ([]byte, error) { return lockdownWithoutNamespaces(false) }),
}

func lockdownWithoutNamespaces(processes bool) ([]byte, error) {
	const afUnix, cloneThread = 1, 0x10000
	// memorySyscalls too, memory cgroup or not: without an IPC namespace
	// of its own a SysV segment outlives the process that made it.
	names := append(append([]string(nil), deniedSyscalls...), memorySyscalls...)
	// NotEqual compares all 64 bits: a family with an upper bit set (which
	// the kernel's int drops) is refused too. One group holds every rule
	// on socket: the library's program loads an argument over the system
	// call number when a conditional rule does not match, so a later group
	// could not test the same call again.
	notUnix := seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.NotEqual, Value: afUnix}}
	eperm := []seccomp.NameWithConditions{
		{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNamespaces}}},
		{Name: "socket", Conditions: notUnix},
		{Name: "socketpair", Conditions: notUnix},
	}
	if processes {
		names = append(names, "execve", "execveat", "fork", "vfork")
		eperm = append(eperm, seccomp.NameWithConditions{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsNotSet, Value: cloneThread}}})
	}
	return assemble(seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: names, NamesWithCondtions: eperm},
			{Action: seccomp.ActionErrno | seccomp.Action(syscall.ENOSYS), Names: []string{"clone3"}},
		},
	})
}

// offerLockdownWithoutNamespaces gives a process of a sandbox without the
// namespaces layer its lockdown filters, on two inherited pipes after
// extra (the fds named by LockdownFDEnv and NetworkLockdownFDEnv in the
// env returned): NoNamespacesLockdownProgram and
// NoNamespacesNetworkProgram. The Python runner installs the first, or
// the second when its worker may start processes, and closes both before
// any worker code runs. The function returned closes the node's ends.
func (s *Sandbox) offerLockdownWithoutNamespaces(extra []*os.File, env []string) ([]*os.File, []string, func(), error) {
	lock, err := NoNamespacesLockdownProgram()
	if err != nil {
		return nil, nil, nil, err
	}
	network, err := NoNamespacesNetworkProgram()
	if err != nil {
		return nil, nil, nil, err
	}
	l, err := pipeWith(lock)
	if err != nil {
		return nil, nil, nil, err
	}
	n, err := pipeWith(network)
	if err != nil {
		l.Close()
		return nil, nil, nil, err
	}
	fd := 3 + len(extra)
	extra = append(append([]*os.File(nil), extra...), l, n)
	env = append(append([]string(nil), env...), LockdownFDEnv+"="+strconv.Itoa(fd), NetworkLockdownFDEnv+"="+strconv.Itoa(fd+1))
	return extra, env, func() { l.Close(); n.Close() }, nil
}
