package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/virtufin/workmanager/engines/sandbox/execstep"
)

// The memory layer: each worker process runs in a memory cgroup of its
// own, made by the node under its own cgroup, limited to the address
// space limit plus the sizes of its /tmp and /scratch. Unlike RLIMIT_AS,
// a memory cgroup counts every page the process makes the kernel hold:
// anonymous memory, memfd and SysV shared-memory pages whether mapped or
// not, and the pages it writes to its tmpfs. Past the limit the kernel
// reclaims, then kills the process (the engine sees it die).
//
// cgroup v1 (a mounted memory hierarchy, writable: the node is root)
// nests the per-process groups in the node's own memory cgroup. cgroup v2
// needs the node's cgroup delegated to it (a privileged container, or a
// systemd unit with Delegate=yes): the node moves itself into a leaf
// "node" beside "workers" (v2 allows processes only in leaves), enables
// the memory controller for both, and makes the per-process groups under
// "workers".

// MarkInheritedCloseOnExec marks every descriptor above stderr that this
// process holds close-on-exec: a node calls it first, so that what its own
// parent left open (without close-on-exec) never reaches a process it
// starts, sandboxed or not. (What opens later without close-on-exec, an
// in-process native library's sockets, cmd/sandbox-exec keeps from
// worker processes.)
func MarkInheritedCloseOnExec() error {
	if err := execstep.CloseOnExecFrom(3); err != nil {
		return fmt.Errorf("sandbox: marking inherited descriptors close-on-exec: %w", err)
	}
	return nil
}

// cgroupRoot is where cgroup file systems are mounted (a variable for tests).
var cgroupRoot = "/sys/fs/cgroup"

// memcg makes and removes the per-process memory cgroups.
type memcg struct {
	version int    // 1 or 2
	parent  string // the per-process groups are made in this directory
}

// cgroupSeq numbers the groups this process makes (<pid>-<n>), whatever
// Sandbox made them.
var cgroupSeq atomic.Uint64

// cgroupDirName is the directory the node makes in its own memory cgroup
// (v1), holding one group per worker process named <node pid>-<n>.
const cgroupDirName = "workmanager-sandbox"

// detectMemcg finds a memory cgroup hierarchy this process may make
// groups in, and prepares the parent of the per-process groups.
func detectMemcg() (*memcg, error) {
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	if v1 := ownCgroup(own, "memory"); v1 != "" {
		mount := filepath.Join(cgroupRoot, "memory")
		if _, err := os.Stat(filepath.Join(mount, "memory.limit_in_bytes")); err == nil {
			parent := filepath.Join(mount, v1, cgroupDirName)
			if err := os.MkdirAll(parent, 0o755); err != nil {
				return nil, fmt.Errorf("cgroup v1 memory hierarchy at %s: %w", mount, err)
			}
			m := &memcg{version: 1, parent: parent}
			return m, m.probe()
		}
	}
	if v2 := ownCgroup(own, ""); v2 != "" {
		return detectV2(filepath.Join(cgroupRoot, v2))
	}
	return nil, errors.New("no cgroup v1 memory hierarchy and no cgroup v2 hierarchy")
}

// ownCgroup is this process's path in the v1 hierarchy of controller, or
// (controller "") in the v2 hierarchy, from /proc/self/cgroup.
func ownCgroup(procSelfCgroup []byte, controller string) string {
	sc := bufio.NewScanner(bytes.NewReader(procSelfCgroup))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" {
			return parts[2]
		}
		if controller != "" {
			for _, c := range strings.Split(parts[1], ",") {
				if c == controller {
					return parts[2]
				}
			}
		}
	}
	return ""
}

// detectV2 prepares dir (this process's v2 cgroup) as a delegated subtree:
// dir/node holds the node, dir/workers the per-process groups.
func detectV2(dir string) (*memcg, error) {
	mount := cgroupV2Mount(dir)
	if _, err := os.Stat(filepath.Join(mount, "cgroup.controllers")); err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	ctrl, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	if !hasWord(ctrl, "memory") {
		return nil, fmt.Errorf("cgroup v2: the memory controller is not available in %s (not delegated to this cgroup)", dir)
	}
	workers := filepath.Join(dir, "workers")
	sub, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if !hasWord(sub, "memory") {
		// v2 allows processes only in leaves: the node moves into one.
		leaf := filepath.Join(dir, "node")
		if err := os.MkdirAll(leaf, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup v2: %w", err)
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return nil, fmt.Errorf("cgroup v2: moving the node into %s: %w", leaf, err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
			return nil, fmt.Errorf("cgroup v2: enabling the memory controller in %s (other processes in it?): %w", dir, err)
		}
	}
	if err := os.MkdirAll(workers, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	if err := os.WriteFile(filepath.Join(workers, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
		return nil, fmt.Errorf("cgroup v2: enabling the memory controller in %s: %w", workers, err)
	}
	m := &memcg{version: 2, parent: workers}
	return m, m.probe()
}

// cgroupV2Mount is the v2 mount that holds dir: cgroupRoot itself on a
// pure v2 system, cgroupRoot/unified on a hybrid one.
func cgroupV2Mount(dir string) string {
	if strings.HasPrefix(dir, filepath.Join(cgroupRoot, "unified")) {
		return filepath.Join(cgroupRoot, "unified")
	}
	return cgroupRoot
}

func hasWord(b []byte, w string) bool {
	for _, f := range strings.Fields(string(b)) {
		if f == w {
			return true
		}
	}
	return false
}

// probe makes and removes one group with a limit, and sweeps the groups
// that nodes no longer running left behind.
func (m *memcg) probe() error {
	m.sweep()
	_, release, err := m.create(64 << 20)
	if err != nil {
		return err
	}
	release()
	return nil
}

// limitFile is the file that holds a group's memory limit.
func (m *memcg) limitFile() string {
	if m.version == 1 {
		return "memory.limit_in_bytes"
	}
	return "memory.max"
}

// create makes a group limited to limit bytes and returns its cgroup.procs
// file (for sandbox-exec to join) and a function that removes the group
// once its process has exited.
func (m *memcg) create(limit uint64) (string, func(), error) {
	dir := filepath.Join(m.parent, fmt.Sprintf("%d-%d", os.Getpid(), cgroupSeq.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("sandbox: memory cgroup: %w", err)
	}
	release := func() { removeCgroup(dir) }
	v := []byte(strconv.FormatUint(limit, 10))
	if err := os.WriteFile(filepath.Join(dir, m.limitFile()), v, 0); err != nil {
		release()
		return "", nil, fmt.Errorf("sandbox: memory cgroup limit: %w", err)
	}
	if m.version == 1 {
		// With swap accounting, swap counts too (absent without it).
		_ = os.WriteFile(filepath.Join(dir, "memory.memsw.limit_in_bytes"), v, 0)
	} else {
		_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0)
		_ = os.WriteFile(filepath.Join(dir, "memory.oom.group"), []byte("1"), 0)
	}
	return filepath.Join(dir, "cgroup.procs"), release, nil
}

// removeCgroup removes a group whose processes have exited, in the
// background: a memory cgroup's rmdir takes 1-3 ms here (its charges
// moved to the parent), which a worker's stop waited for (docs/
// performance.md, "Stopping without the cgroup's removal"); the kernel may
// take a moment to let go of the last process (EBUSY), so it tries again
// for a few seconds (a node's next start sweeps what remains).
func removeCgroup(dir string) {
	go func() {
		if err := syscall.Rmdir(dir); err == nil || !errors.Is(err, syscall.EBUSY) {
			return
		}
		for delay := 10 * time.Millisecond; delay < 5*time.Second; delay *= 2 {
			time.Sleep(delay)
			if err := syscall.Rmdir(dir); err == nil || !errors.Is(err, syscall.EBUSY) {
				return
			}
		}
	}()
}

// sweep removes the groups of nodes that are gone (their pid is not
// running); a group that still has a process is not removed (EBUSY).
func (m *memcg) sweep() {
	ents, err := os.ReadDir(m.parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		pidText, _, ok := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(pidText)
		if !e.IsDir() || !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = syscall.Rmdir(filepath.Join(m.parent, e.Name()))
		}
	}
}
