package sandbox

import (
	"encoding/binary"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/net/bpf"
)

// run evaluates a filter on one system call in x/net/bpf's VM. The VM
// loads words big-endian where the kernel loads them in the machine's
// order, so seccomp_data is laid out with big-endian words at the
// little-endian offsets (an argument's low word first).
func run(t *testing.T, prog []byte, arch, nr uint32, arg0 uint64) uint32 {
	t.Helper()
	var raw []bpf.RawInstruction
	for i := 0; i+8 <= len(prog); i += 8 {
		raw = append(raw, bpf.RawInstruction{Op: binary.LittleEndian.Uint16(prog[i:]), Jt: prog[i+2], Jf: prog[i+3], K: binary.LittleEndian.Uint32(prog[i+4:])})
	}
	insts, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("the program does not disassemble")
	}
	vm, err := bpf.NewVM(insts)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], arch)
	binary.BigEndian.PutUint32(data[16:], uint32(arg0))
	binary.BigEndian.PutUint32(data[20:], uint32(arg0>>32))
	ret, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

// Issue 32 item 2: the sandbox's filter refuses clone with namespace flags
// and clone3, allows thread and process creation without them, and
// refuses every system call made through another architecture's table.
func TestFilterDecisions(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("system call numbers below are x86-64's")
	}
	const (
		x8664, i386                      = 0xc000003e, 0x40000003
		allow, eperm, enosys             = 0x7fff0000, 0x00050000 | uint32(syscall.EPERM), 0x00050000 | uint32(syscall.ENOSYS)
		clone, clone3, unshare, getpid   = 56, 435, 272, 39
		newUser, newNet, thread, sigchld = 0x10000000, 0x40000000, 0x10000, 17
		threadFlags                      = 0x3d0f00 // what glibc's pthread_create passes
	)
	prog, err := program(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		arch, nr uint32
		arg0     uint64
		want     uint32
	}{
		{"clone NEWUSER|NEWNET", x8664, clone, newUser | newNet | sigchld, eperm},
		{"clone NEWNS", x8664, clone, 0x20000 | sigchld, eperm},
		{"clone NEWPID", x8664, clone, 0x20000000 | sigchld, eperm},
		{"clone a fork", x8664, clone, sigchld, allow},
		{"clone a thread", x8664, clone, threadFlags, allow},
		{"clone3", x8664, clone3, 0, enosys},
		{"unshare", x8664, unshare, newUser, eperm},
		{"getpid", x8664, getpid, 0, allow},
		{"i386 getpid", i386, 20, 0, enosys},
		{"i386 unshare", i386, 310, newUser, enosys},
		{"i386 clone", i386, 120, newUser, enosys},
	} {
		if got := run(t, prog, c.arch, c.nr, c.arg0); got != c.want {
			t.Errorf("%s: %#x, want %#x", c.name, got, c.want)
		}
	}
	lock, err := ProcessLockdownProgram()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		nr   uint32
		arg0 uint64
		want uint32
	}{
		{"execve", 59, 0, eperm},
		{"fork", 57, 0, eperm},
		{"clone a fork", clone, sigchld, eperm},
		{"clone a thread", clone, threadFlags | thread, allow},
		{"clone3", clone3, 0, enosys},
		{"socket AF_INET", 41, 2, allow},
	} {
		if got := run(t, lock, x8664, c.nr, c.arg0); got != c.want {
			t.Errorf("lockdown %s: %#x, want %#x", c.name, got, c.want)
		}
	}
}

// Issue 42 items 2 and 8: the filter allows only the socket families a
// worker needs (a family with upper bits set, which the kernel's int
// drops, is refused too), refuses memfd and SysV shared memory when no
// memory cgroup counts them, and the lockdown's IP-socket rule cannot be
// passed with upper bits either.
func TestFilterFamiliesAndMemory(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("system call numbers below are x86-64's")
	}
	const (
		allow, eperm                = 0x7fff0000, 0x00050000 | uint32(syscall.EPERM)
		eafnosupport                = 0x00050000 | uint32(syscall.EAFNOSUPPORT)
		x8664                       = 0xc000003e
		socket, socketpair          = 41, 53
		memfdCreate, shmget, shmat  = 319, 29, 30
		afUnix, afInet, afInet6     = 1, 2, 10
		afNetlink, afPacket, afVsok = 16, 17, 40
	)
	withCgroup, err := program(true)
	if err != nil {
		t.Fatal(err)
	}
	without, err := program(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		nr            uint32
		arg0          uint64
		cgroup, plain uint32
	}{
		{"socket AF_UNIX", socket, afUnix, allow, allow},
		{"socket AF_INET", socket, afInet, allow, allow},
		{"socket AF_INET6", socket, afInet6, allow, allow},
		{"socket AF_NETLINK", socket, afNetlink, allow, allow},
		{"socket AF_VSOCK", socket, afVsok, eafnosupport, eafnosupport},
		{"socket AF_PACKET", socket, afPacket, eafnosupport, eafnosupport},
		{"socket AF_ALG", socket, 38, eafnosupport, eafnosupport},
		{"socket AF_UNIX with upper bits", socket, afUnix | 1<<32, eafnosupport, eafnosupport},
		{"socketpair AF_UNIX", socketpair, afUnix, allow, allow},
		{"socketpair AF_VSOCK", socketpair, afVsok, eafnosupport, eafnosupport},
		{"memfd_create", memfdCreate, 0, allow, eperm},
		{"shmget", shmget, 0, allow, eperm},
		{"shmat", shmat, 0, allow, eperm},
	} {
		if got := run(t, withCgroup, x8664, c.nr, c.arg0); got != c.cgroup {
			t.Errorf("with a memory cgroup, %s: %#x, want %#x", c.name, got, c.cgroup)
		}
		if got := run(t, without, x8664, c.nr, c.arg0); got != c.plain {
			t.Errorf("without a memory cgroup, %s: %#x, want %#x", c.name, got, c.plain)
		}
	}
	lock, err := LockdownProgram()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		arg0 uint64
		want uint32
	}{
		{"AF_INET", afInet, eperm},
		{"AF_INET with upper bits", afInet | 1<<32, eperm},
		{"AF_INET6 with upper bits", afInet6 | 1<<40, eperm},
		{"AF_UNIX", afUnix, allow},
	} {
		if got := run(t, lock, x8664, socket, c.arg0); got != c.want {
			t.Errorf("lockdown socket %s: %#x, want %#x", c.name, got, c.want)
		}
	}
}
