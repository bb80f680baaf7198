// Package sandbox owns the operating-system layers around every worker
// process (Python runners, the isolated native host, later engines' child
// processes): its own network, PID, mount, IPC and UTS namespaces and a
// read-only view of what the runtime needs plus a private, size-limited
// /tmp and /scratch (bubblewrap), an unprivileged user id of its own per
// live worker (setpriv, ids allocated so that no two live workers share
// one), a seccomp filter, resource limits (prlimit), an empty environment except
// the documented worker variables, and death with the node. It detects at
// start which layers this machine allows; SANDBOX=strict refuses to start
// without all of them, standard uses what there is, off uses none (loudly).
// docs/security.md states what each layer blocks and what it does not.
package sandbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/net/bpf"
)

// Mode is the SANDBOX setting.
type Mode string

const (
	// Strict refuses to start unless every layer is available.
	Strict Mode = "strict"
	// Standard uses the layers this machine allows and logs the others.
	Standard Mode = "standard"
	// Off runs worker code as the node, unconfined.
	Off Mode = "off"
)

// ParseMode reads a SANDBOX value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case Strict, Standard, Off:
		return m, nil
	}
	return "", fmt.Errorf(`SANDBOX must be "strict", "standard" or "off", got %q`, s)
}

// Limits are the resource limits of one worker process (0: no limit).
type Limits struct {
	AddressSpace uint64 // bytes of virtual memory (RLIMIT_AS)
	FileSize     uint64 // bytes of the largest file it may write (RLIMIT_FSIZE)
	OpenFiles    uint64 // open file descriptors (RLIMIT_NOFILE)
	Processes    uint64 // processes and threads of its user id (RLIMIT_NPROC)
	CPUSeconds   uint64 // CPU seconds over the process's life (RLIMIT_CPU)
}

// DefaultLimits are the limits when the configuration leaves them at zero.
var DefaultLimits = Limits{AddressSpace: 2 << 30, FileSize: 100 << 20, OpenFiles: 256, Processes: 64}

// DefaultUIDClaimDir is where node processes claim worker user ids (one
// file per id, flock'd while a worker of that node holds it): every node
// process on a host uses it, unless configured otherwise.
const DefaultUIDClaimDir = "/run/workmanager/sandbox-uids"

// DefaultTmpBytes and DefaultScratchBytes size /tmp and /scratch when
// Config leaves them at zero.
const (
	DefaultTmpBytes     = 64 << 20
	DefaultScratchBytes = 64 << 20
)

// Config configures the layers.
type Config struct {
	Mode Mode
	// Bwrap, Setpriv and Prlimit are the tools' paths (default: looked up
	// on PATH).
	Bwrap, Setpriv, Prlimit string
	// Exec is cmd/sandbox-exec, the first program of every worker process
	// (SANDBOX_EXEC_PATH; default: sandbox-exec next to this program's
	// executable): it joins the process's memory cgroup and keeps only the
	// descriptors the node passes on purpose (package execstep).
	Exec string
	// UIDBase and UIDs: each worker's processes run as a user id of that
	// worker within [UIDBase, UIDBase+UIDs) (default 200000 and 50000),
	// so that RLIMIT_NPROC holds per worker and workers cannot signal or
	// read each other's files. Ids are allocated on this node: no two
	// live workers share one (whatever their names); a worker keeps its
	// id while it has a process (or files the node gave it with Own).
	// Each worker's preferred id is derived from its id, so that it gets
	// the same on every node and after a restart unless another live
	// worker held that one when it started (then it gets the next free).
	UIDBase, UIDs int
	// UIDClaimDir makes the ids unique on the host, not only in this node
	// process: an id is used only under an exclusive flock on
	// UIDClaimDir/<uid>, so node processes that share the directory never
	// give one id to two live workers (default DefaultUIDClaimDir; "-":
	// no claims, ids unique in this process only). Used with the user
	// layer; when the directory cannot be made, strict refuses to start
	// and standard logs it and goes without.
	UIDClaimDir string
	Limits      Limits
	// TmpBytes and ScratchBytes are the sizes of the tmpfs mounted at /tmp
	// and at /scratch (the working and home directory) in each worker
	// process's sandbox (SANDBOX_TMP_BYTES, SANDBOX_SCRATCH_BYTES; 0:
	// DefaultTmpBytes, DefaultScratchBytes). A write past them fails with
	// ENOSPC. Their pages are the node's memory, not counted in the
	// process's address-space limit.
	TmpBytes, ScratchBytes uint64
	// Writable are host paths bound read-write at the same place in every
	// sandbox (SANDBOX_WRITABLE_PATHS): a volume the operator shares with
	// workers on purpose. Empty by default.
	Writable []string
	Log      *slog.Logger
}

// Layer is one layer and whether this node uses it.
type Layer struct {
	Name   string `json:"name"`
	On     bool   `json:"on"`
	Detail string `json:"detail"`
}

// Sandbox wraps worker processes in the layers. Safe for concurrent use.
type Sandbox struct {
	cfg    Config
	layers []Layer
	// what is on
	namespaces, setuid, filter, rlimits bool
	program                             []byte // the seccomp filter as sock_filter[]
	lockdown                            []byte // ProcessLockdownProgram, offered at LockdownPath
	seccompable                         bool   // this kernel has seccomp filters (the lockdown without bwrap)
	uids                                *uidAllocator
	exec                                string // cmd/sandbox-exec, when found
	mem                                 *memcg // per-process memory cgroups, when usable
}

// Layer names.
const (
	LayerNamespaces = "namespaces"
	LayerUser       = "user"
	LayerSeccomp    = "seccomp"
	LayerLimits     = "limits"
	LayerEnv        = "environment"
	// LayerDescriptors: every worker process starts with only the
	// descriptors the node passes it (cmd/sandbox-exec).
	LayerDescriptors = "descriptors"
	// LayerMemory: a memory cgroup per worker process, which counts what
	// RLIMIT_AS does not (memfd and shared-memory pages, its tmpfs).
	LayerMemory = "memory"
)

// New detects the layers this machine allows and checks them against the
// mode: in strict mode a missing layer is an error that names it.
func New(ctx context.Context, cfg Config) (*Sandbox, error) {
	if cfg.Mode == "" {
		cfg.Mode = Standard
	}
	if cfg.UIDBase == 0 {
		cfg.UIDBase = 200000
	}
	if cfg.UIDs == 0 {
		cfg.UIDs = 50000
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	if cfg.TmpBytes == 0 {
		cfg.TmpBytes = DefaultTmpBytes
	}
	if cfg.ScratchBytes == 0 {
		cfg.ScratchBytes = DefaultScratchBytes
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Sandbox{cfg: cfg, uids: newUIDAllocator(cfg.UIDBase, cfg.UIDs)}
	if cfg.Mode == Off {
		s.layers = []Layer{{Name: "all", Detail: "SANDBOX=off: worker code runs as the node, with its environment, network, files and no limits"}}
		cfg.Log.Warn("SANDBOX=off: WORKER CODE RUNS UNCONFINED, AS THIS NODE (its user, environment, network and files). Use only for code you trust.")
		return s, nil
	}
	s.detect(ctx)
	if s.setuid {
		sweepMounts()
		if err := s.claimUIDs(); err != nil {
			if cfg.Mode == Strict {
				return nil, err
			}
			cfg.Log.Warn("sandbox: worker user ids are unique in this node process only, not on the host: another node process on this host may give a worker's id to one of its workers", "error", err)
		}
	}
	var missing []string
	for _, l := range s.layers {
		if !l.On {
			missing = append(missing, l.Name+" ("+l.Detail+")")
		}
	}
	if len(missing) > 0 {
		if cfg.Mode == Strict {
			return nil, fmt.Errorf("sandbox: SANDBOX=strict, but these layers are not available here: %s", strings.Join(missing, "; "))
		}
		cfg.Log.Warn("sandbox: some layers are not available; worker processes run without them", "missing", strings.Join(missing, "; "))
	}
	for _, l := range s.layers {
		cfg.Log.Info("sandbox layer", "layer", l.Name, "on", l.On, "detail", l.Detail)
	}
	return s, nil
}

// claimUIDs turns on the host-wide claims of user ids (Config.UIDClaimDir).
func (s *Sandbox) claimUIDs() error {
	dir := s.cfg.UIDClaimDir
	if dir == "-" {
		return nil
	}
	if dir == "" {
		dir = DefaultUIDClaimDir
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox: the user id claim directory: %w", err)
	}
	probe, err := os.CreateTemp(dir, ".probe-")
	if err != nil {
		return fmt.Errorf("sandbox: the user id claim directory: %w", err)
	}
	probe.Close()
	os.Remove(probe.Name())
	s.uids.claimDir = dir
	for i, l := range s.layers {
		if l.Name == LayerUser {
			s.layers[i].Detail += "; unique on this host (claimed in " + dir + ")"
		}
	}
	return nil
}

// detect fills s.layers.
func (s *Sandbox) detect(ctx context.Context) {
	look := func(p *string, name string) error {
		if *p == "" {
			*p = name
		}
		full, err := exec.LookPath(*p)
		if err != nil {
			return err
		}
		*p = full
		return nil
	}
	c := &s.cfg
	if c.Exec == "" {
		if exe, err := os.Executable(); err == nil {
			c.Exec = filepath.Join(filepath.Dir(exe), "sandbox-exec")
		}
	}
	// descriptors and memory are detected first (the filter depends on the
	// memory layer) and listed last, after the layers they complete.
	var completing []Layer
	if err := look(&c.Exec, c.Exec); err != nil {
		completing = append(completing, Layer{Name: LayerDescriptors, Detail: "cmd/sandbox-exec not found (SANDBOX_EXEC_PATH): worker processes may inherit descriptors the node holds without close-on-exec: " + err.Error()})
	} else {
		s.exec = c.Exec
		completing = append(completing, Layer{Name: LayerDescriptors, On: true, Detail: "only the descriptors the node passes on purpose (" + c.Exec + ")"})
	}
	memLimit := s.memoryLimit(c.Limits)
	switch {
	case s.exec == "":
		completing = append(completing, Layer{Name: LayerMemory, Detail: "needs cmd/sandbox-exec; memfd_create, shmget and shmat are refused instead (with the seccomp layer)"})
	case os.Geteuid() != 0:
		completing = append(completing, Layer{Name: LayerMemory, Detail: "the node is not root: no memory cgroup per worker process; memfd_create, shmget and shmat are refused instead (with the seccomp layer)"})
	default:
		if m, err := detectMemcg(); err != nil {
			completing = append(completing, Layer{Name: LayerMemory, Detail: "no usable memory cgroup (" + err.Error() + "); memfd_create, shmget and shmat are refused instead (with the seccomp layer)"})
		} else {
			s.mem = m
			completing = append(completing, Layer{Name: LayerMemory, On: true, Detail: fmt.Sprintf("a memory cgroup (v%d) per worker process under %s, limited to %d B (address space + /tmp + /scratch), counting memfd, shared-memory and tmpfs pages", m.version, m.parent, memLimit)})
		}
	}
	// Seccomp program first: the namespace probe runs with it.
	prog, perr := program(s.mem != nil)
	if perr == nil {
		s.program = prog
		s.lockdown, perr = ProcessLockdownProgram()
	}
	s.seccompable = kernelHasSeccomp()
	if err := look(&c.Bwrap, "bwrap"); err != nil {
		s.layers = append(s.layers, Layer{Name: LayerNamespaces, Detail: "bubblewrap (bwrap) not found: " + err.Error()})
	} else if out, err := s.probe(ctx); err != nil {
		s.layers = append(s.layers, Layer{Name: LayerNamespaces, Detail: fmt.Sprintf("bwrap cannot create the namespaces here: %v %s", err, strings.TrimSpace(out))})
	} else {
		s.namespaces = true
		s.layers = append(s.layers, Layer{Name: LayerNamespaces, On: true, Detail: fmt.Sprintf("network (none), pid, mount (read-only runtime, private /tmp of %d B and /scratch of %d B), ipc, uts; dies with the node", c.TmpBytes, c.ScratchBytes)})
	}
	switch {
	case !s.namespaces:
		s.layers = append(s.layers, Layer{Name: LayerUser, Detail: "needs the namespaces layer"})
	case os.Geteuid() != 0:
		s.layers = append(s.layers, Layer{Name: LayerUser, Detail: "the node is not root: worker processes keep the node's user id"})
	case look(&c.Setpriv, "setpriv") != nil:
		s.layers = append(s.layers, Layer{Name: LayerUser, Detail: "setpriv (util-linux) not found"})
	default:
		s.setuid = true
		s.layers = append(s.layers, Layer{Name: LayerUser, On: true, Detail: fmt.Sprintf("a user id of its own per live worker, allocated from %d..%d, no groups, no capabilities, no_new_privs", c.UIDBase, c.UIDBase+c.UIDs-1)})
	}
	switch {
	case perr != nil:
		s.layers = append(s.layers, Layer{Name: LayerSeccomp, Detail: "assembling the filter: " + perr.Error()})
	case !s.namespaces && s.seccompable:
		s.layers = append(s.layers, Layer{Name: LayerSeccomp, Detail: "installed by bwrap: needs the namespaces layer (every process is still given a lockdown on fd $" + LockdownFDEnv + " that carries its refusals and refuses every socket but AF_UNIX, memfd and SysV shared memory)"})
	case !s.namespaces:
		s.layers = append(s.layers, Layer{Name: LayerSeccomp, Detail: "installed by bwrap: needs the namespaces layer"})
	default:
		s.filter = true
		s.layers = append(s.layers, Layer{Name: LayerSeccomp, On: true, Detail: "refuses " + strings.Join(deniedSyscalls[:8], ", ") + " and " + strconv.Itoa(len(deniedSyscalls)-8) + " more with EPERM, clone with namespace flags, clone3 and other architectures' system calls (ENOSYS)"})
	}
	if err := look(&c.Prlimit, "prlimit"); err != nil {
		s.layers = append(s.layers, Layer{Name: LayerLimits, Detail: "prlimit (util-linux) not found"})
	} else {
		s.rlimits = true
		s.layers = append(s.layers, Layer{Name: LayerLimits, On: true, Detail: c.Limits.String()})
	}
	s.layers = append(s.layers, Layer{Name: LayerEnv, On: true, Detail: "empty except the documented worker variables"})
	s.layers = append(s.layers, completing...)
}

func (l Limits) String() string {
	f := func(v uint64, unit string) string {
		if v == 0 {
			return "unlimited"
		}
		return strconv.FormatUint(v, 10) + unit
	}
	return fmt.Sprintf("address space %s, file size %s, open files %s, processes %s, CPU %s",
		f(l.AddressSpace, " B"), f(l.FileSize, " B"), f(l.OpenFiles, ""), f(l.Processes, ""), f(l.CPUSeconds, " s"))
}

// probe runs `true` under the namespaces and the filter.
func (s *Sandbox) probe(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	args, files, err := s.bwrapArgs(false, "", nil, 0)
	if err != nil {
		return "", err
	}
	defer closeAll(files)
	cmd := exec.CommandContext(ctx, s.cfg.Bwrap, append(args, "--", "/bin/true")...)
	cmd.ExtraFiles = files
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// HasNamespaces reports whether worker processes get namespaces of their
// own (bubblewrap): without them a process shares the node's network and
// IPC namespaces, and its own lockdown must refuse more
// (NoNamespacesLockdownProgram).
func (s *Sandbox) HasNamespaces() bool { return s.namespaces }

// SharesPaths reports whether worker processes get host paths bound
// read-write (Config.Writable): files a worker makes there are its user
// id's, so every process of one worker must run under that one id (no
// spare processes, which run under ids of their own).
func (s *Sandbox) SharesPaths() bool { return len(s.cfg.Writable) > 0 }

// Layers reports the layers and whether each is on.
func (s *Sandbox) Layers() []Layer { return append([]Layer(nil), s.layers...) }

// Mode is the configured mode.
func (s *Sandbox) Mode() Mode { return s.cfg.Mode }

// Summary is one line for /health and logs.
func (s *Sandbox) Summary() string {
	if s.cfg.Mode == Off {
		return s.layers[0].Detail
	}
	var on, off []string
	for _, l := range s.layers {
		if l.On {
			on = append(on, l.Name)
		} else {
			off = append(off, l.Name)
		}
	}
	out := fmt.Sprintf("SANDBOX=%s; layers on: %s", s.cfg.Mode, strings.Join(on, ", "))
	if len(off) > 0 {
		out += "; MISSING: " + strings.Join(off, ", ")
	}
	return out
}

// Complete reports whether every layer is on.
func (s *Sandbox) Complete() bool {
	if s.cfg.Mode == Off {
		return false
	}
	for _, l := range s.layers {
		if !l.On {
			return false
		}
	}
	return true
}

// Spec is one worker process to start.
type Spec struct {
	// Owner is the worker the process runs for: it picks the user id.
	Owner string
	Path  string
	Args  []string
	// Env is the process's whole environment (the documented worker
	// variables); nothing of the node's is added.
	Env []string
	// ReadOnly are host paths the process needs to read (its interpreter's
	// prefix, its binary's directory, its code), bound at the same place.
	ReadOnly []string
	// Binds are host paths bound read-only at another place inside, under
	// parents any user may traverse (a same-place bind keeps the host
	// parents' modes, which a 0700 directory on the way would make
	// unreachable for the process's user).
	Binds []Bind
	// ExtraFiles become fds 3, 4, ... as with exec.Cmd.
	ExtraFiles []*os.File
	// Limits, when set, replace the sandbox's limits for this process
	// field by field (a zero field keeps the sandbox's): the .NET engine's
	// C# compiler runs under tighter ones than a worker.
	Limits *Limits
}

// Bind is a bind mount of Src at Dst, read-only unless Writable (a
// directory the process writes its result into, such as a compiler's
// output; give it to the process's user id first, see UID).
type Bind struct {
	Src, Dst string
	Writable bool
}

// with is l with the non-zero fields of o, if any.
func (l Limits) with(o *Limits) Limits {
	if o == nil {
		return l
	}
	for _, f := range []struct{ dst, src *uint64 }{
		{&l.AddressSpace, &o.AddressSpace}, {&l.FileSize, &o.FileSize}, {&l.OpenFiles, &o.OpenFiles},
		{&l.Processes, &o.Processes}, {&l.CPUSeconds, &o.CPUSeconds},
	} {
		if *f.src != 0 {
			*f.dst = *f.src
		}
	}
	return l
}

// Command returns the command that runs spec inside the layers, and a
// function that releases what the sandbox holds for it (its /tmp and
// /scratch, its share of the worker's user id); call it once, when the
// process has exited. The caller
// may set Stdout, Stderr, SysProcAttr (keep Setpgid) and WaitDelay.
func (s *Sandbox) Command(spec Spec) (*exec.Cmd, func(), error) {
	limits := s.cfg.Limits.with(spec.Limits)
	if s.cfg.Mode == Off || !s.namespaces {
		path, args := spec.Path, spec.Args
		if s.rlimits && s.cfg.Mode != Off {
			path, args = s.cfg.Prlimit, append(s.prlimitArgs(limits), append([]string{"--", spec.Path}, spec.Args...)...)
		}
		if s.cfg.Mode == Off {
			cmd := exec.Command(path, args...)
			cmd.Env = append(os.Environ(), spec.Env...)
			cmd.ExtraFiles = spec.ExtraFiles
			return cmd, func() {}, nil
		}
		env, extra := spec.Env, spec.ExtraFiles
		closeLockdown := func() {}
		if s.lockdown != nil && s.seccompable {
			// No bwrap to offer the lockdown at LockdownPath: it goes to the
			// process on inherited pipes, named by LockdownFDEnv and
			// NetworkLockdownFDEnv, with the network refused (lockdown.go).
			var err error
			if extra, env, closeLockdown, err = s.offerLockdownWithoutNamespaces(spec.ExtraFiles, env); err != nil {
				return nil, nil, err
			}
		}
		cmd, release, err := s.command(path, args, extra, limits)
		if err != nil {
			closeLockdown()
			return nil, nil, err
		}
		cmd.Env = env
		return cmd, func() { closeLockdown(); release() }, nil
	}
	uid, cleanup := 0, func() {}
	mounted := ""
	var mountArgs []string // sandbox-exec's --tmpfs arguments
	if s.setuid {
		var release func()
		var err error
		if uid, release, err = s.uids.acquire(spec.Owner); err != nil {
			return nil, nil, err
		}
		if mounted, mountArgs, err = s.mountPrivate(uid, s.exec != ""); err != nil {
			release()
			return nil, nil, err
		}
		cleanup = func() { unmountPrivate(mounted); release() }
	}
	args, files, err := s.bwrapArgs(true, mounted, spec.ReadOnly, len(spec.ExtraFiles))
	made := map[string]bool{}
	for _, b := range spec.Binds {
		bind := "--ro-bind"
		if b.Writable {
			bind = "--bind"
		}
		args = append(append(args, parentDirs(b.Dst, made)...), bind, b.Src, b.Dst)
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	args = append(args, "--")
	if s.rlimits {
		args = append(args, s.cfg.Prlimit)
		args = append(args, s.prlimitArgs(limits)...)
		args = append(args, "--")
	}
	if s.setuid {
		args = append(args, s.cfg.Setpriv, "--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(uid), "--clear-groups",
			"--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--")
	}
	args = append(args, spec.Path)
	args = append(args, spec.Args...)
	cmd, release, err := s.command(s.cfg.Bwrap, args, append(append([]*os.File(nil), spec.ExtraFiles...), files...), limits, mountArgs...)
	if err != nil {
		closeAll(files)
		cleanup()
		return nil, nil, err
	}
	cmd.Env = spec.Env
	// The tmpfs pages are charged to the cgroup: unmount first (a tmpfs in
	// the process's own namespace went away with its last process).
	return cmd, func() { closeAll(files); cleanup(); release() }, nil
}

// command is the command that runs path with args and the extra files,
// behind cmd/sandbox-exec when there is one: in a memory cgroup of its own
// (the memory layer), with every descriptor of the node but the ones
// passed (0, 1, 2 and the extra files) closed before path runs, and the
// file systems of mounts (sandbox-exec's --tmpfs arguments, only with
// sandbox-exec) mounted. The function returned removes the cgroup; call
// it once the process has exited.
func (s *Sandbox) command(path string, args []string, extra []*os.File, limits Limits, mounts ...string) (*exec.Cmd, func(), error) {
	if s.exec == "" {
		cmd := exec.Command(path, args...)
		cmd.ExtraFiles = extra
		return cmd, func() {}, nil
	}
	procs, release := "-", func() {}
	if limit := s.memoryLimit(limits); s.mem != nil && limit > 0 {
		var err error
		if procs, release, err = s.mem.create(limit); err != nil {
			return nil, nil, err
		}
	}
	execArgs := append(append([]string{strconv.Itoa(3 + len(extra)), procs}, mounts...), path)
	cmd := exec.Command(s.exec, append(execArgs, args...)...)
	cmd.ExtraFiles = extra
	return cmd, release, nil
}

// memoryLimit is the memory cgroup limit of a process with limits: its
// address space and its /tmp and /scratch (0: none, when the address
// space is unlimited).
func (s *Sandbox) memoryLimit(l Limits) uint64 {
	if l.AddressSpace == 0 {
		return 0
	}
	return l.AddressSpace + s.cfg.TmpBytes + s.cfg.ScratchBytes
}

// UID is the user id owner's processes run as, when the user layer is on
// and owner holds one (it has a live process or files given with Own).
func (s *Sandbox) UID(owner string) (int, bool) {
	if !s.setuid || s.cfg.Mode == Off || owner == "" {
		return 0, false
	}
	return s.uids.current(owner)
}

// Own gives path (recursively) to owner's user id, so that owner's
// sandboxed processes can read what the node prepared for them (an
// extracted package) and no other worker can. owner keeps that user id
// (no other worker gets it) for as long as path exists. Without the user
// layer it does nothing.
func (s *Sandbox) Own(path, owner string) error {
	if !s.setuid || s.cfg.Mode == Off {
		return nil
	}
	uid, release, err := s.uids.acquire(owner)
	if err != nil {
		return err
	}
	defer release()
	s.uids.pin(owner, path)
	return filepath.WalkDir(path, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

func (s *Sandbox) prlimitArgs(l Limits) []string {
	var a []string
	add := func(flag string, v uint64) {
		if v > 0 {
			a = append(a, fmt.Sprintf("--%s=%d", flag, v))
		}
	}
	add("as", l.AddressSpace)
	add("fsize", l.FileSize)
	add("nofile", l.OpenFiles)
	add("nproc", l.Processes)
	if l.CPUSeconds > 0 {
		// SIGXCPU at the limit (which ends the process and says why:
		// bwrap exits 128+24), SIGKILL one second later (a process that
		// handles SIGXCPU); a soft limit equal to the hard one is SIGKILL.
		a = append(a, fmt.Sprintf("--cpu=%d:%d", l.CPUSeconds, l.CPUSeconds+1))
	}
	// Never the node's: no core files (a worker's memory, written where
	// the node's core pattern says), and no more locked memory than
	// WorkerMemlockBytes (locked pages cannot be reclaimed or swapped).
	return append(a, "--core=0", fmt.Sprintf("--memlock=%d", WorkerMemlockBytes))
}

// WorkerMemlockBytes is every worker process's RLIMIT_MEMLOCK (soft and
// hard): the kernel's default for an unprivileged user.
const WorkerMemlockBytes = 64 << 10

// parentDirs makes the missing parents of a bind's destination 0755:
// bwrap would make them 0700 (root's), which the worker's own user id
// could not pass. made holds the directories made (or there) already.
func parentDirs(dst string, made map[string]bool) []string {
	var parents []string
	for d := filepath.Dir(dst); d != "/" && d != "." && !made[d]; d = filepath.Dir(d) {
		parents = append(parents, d)
		made[d] = true
	}
	var a []string
	for i := len(parents) - 1; i >= 0; i-- {
		a = append(a, "--perms", "0755", "--dir", parents[i])
	}
	return a
}

// LockdownPath is where every sandbox offers ProcessLockdownProgram (struct
// sock_filter[], read-only) to the process, when the seccomp layer is on:
// the Python runner installs it before worker code unless the worker may
// start processes.
const LockdownPath = "/etc/workmanager/lockdown-processes.bpf"

// LockdownFDEnv names the inherited file descriptor (a pipe holding
// ProcessLockdownProgram) that a sandbox without the namespaces layer
// (SANDBOX=standard where bubblewrap cannot run) gives every process
// instead of LockdownPath, when this kernel has seccomp: the lockdown does
// not need bwrap, and the Python runner installs it from there.
const LockdownFDEnv = "WORKMANAGER_LOCKDOWN_FD"

// kernelHasSeccomp reports whether this kernel filters system calls
// (/proc/self/status has a Seccomp_filters line with CONFIG_SECCOMP_FILTER).
func kernelHasSeccomp() bool {
	b, err := os.ReadFile("/proc/self/status")
	return err == nil && bytes.Contains(b, []byte("\nSeccomp_filters:"))
}

// bwrapArgs builds bwrap's options; the seccomp program (and, for a
// worker, the lockdown program offered at LockdownPath) go in as the fds
// after the caller's extra files (returned to be passed on and closed).
// worker adds the worker's own /scratch and the lockdown program. mounted,
// when set, holds the tmp and scratch file systems mountPrivate made;
// otherwise bwrap mounts both (sized, but with the kernel's default inode
// count).
func (s *Sandbox) bwrapArgs(worker bool, mounted string, readOnly []string, extra int) ([]string, []*os.File, error) {
	a := []string{
		"--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--die-with-parent", "--new-session",
		"--ro-bind", "/usr", "/usr",
		"--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
		// /etc made first, traversable by the worker's user (bwrap makes
		// the parents of a bind 0700), for ReadOnly paths under it.
		"--perms", "0755", "--dir", "/etc",
		"--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
		"--ro-bind-try", "/etc/localtime", "/etc/localtime",
		"--ro-bind-try", "/usr/share/zoneinfo", "/usr/share/zoneinfo",
		"--proc", "/proc", "--dev", "/dev",
		"--hostname", "worker",
	}
	// /tmp is writable (TMPDIR points there) and as large as TmpBytes.
	if mounted != "" {
		a = append(a, "--bind", filepath.Join(mounted, "tmp"), "/tmp")
	} else {
		a = append(a, "--perms", "1777", "--size", strconv.FormatUint(s.cfg.TmpBytes, 10), "--tmpfs", "/tmp")
	}
	if os.Geteuid() != 0 {
		a = append(a, "--unshare-user", "--uid", "65534", "--gid", "65534")
	} else if s.setuid {
		// setpriv needs these to change to the process's own user id; it
		// drops every capability before it runs the worker.
		a = append(a, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP")
	}
	made := map[string]bool{"/tmp": true, "/usr": true, "/proc": true, "/dev": true, "/etc": true}
	for _, p := range readOnly {
		if p == "" || strings.HasPrefix(p, "/usr/") || p == "/usr" {
			continue
		}
		a = append(append(a, parentDirs(p, made)...), "--ro-bind", p, p)
	}
	for _, p := range s.cfg.Writable {
		// Its parents made traversable (bwrap would make them 0700, root's).
		a = append(append(a, parentDirs(p, made)...), "--bind", p, p)
	}
	if worker {
		// The worker's home and working directory: a tmpfs of its own, as
		// large as ScratchBytes (made by bwrap: the only user inside is the
		// worker's, so any may write).
		if mounted != "" {
			a = append(a, "--bind", filepath.Join(mounted, "scratch"), "/scratch")
		} else {
			a = append(a, "--perms", "0777", "--size", strconv.FormatUint(s.cfg.ScratchBytes, 10), "--tmpfs", "/scratch")
		}
		a = append(a, "--chdir", "/scratch", "--setenv", "HOME", "/scratch", "--setenv", "TMPDIR", "/tmp")
	}
	var files []*os.File
	data := func(b []byte) (int, error) {
		r, err := pipeWith(b)
		if err != nil {
			return 0, err
		}
		files = append(files, r)
		return 3 + extra + len(files) - 1, nil
	}
	if s.program != nil {
		fd, err := data(s.program)
		if err != nil {
			return nil, nil, err
		}
		a = append(a, "--seccomp", strconv.Itoa(fd))
		if worker && s.lockdown != nil {
			fd, err := data(s.lockdown)
			if err != nil {
				closeAll(files)
				return nil, nil, err
			}
			a = append(append(a, parentDirs(LockdownPath, made)...), "--perms", "0444", "--ro-bind-data", strconv.Itoa(fd), LockdownPath)
		}
	}
	return a, files, nil
}

// pipeWith returns the read end of a pipe that holds b (a seccomp
// program: a few hundred bytes fit the pipe's buffer) and is closed for
// writing.
func pipeWith(b []byte) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if _, err := w.Write(b); err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("sandbox: seccomp program: %w", err)
	}
	w.Close()
	return r, nil
}

// auditArch is the AUDIT_ARCH_* value of the architectures the filters
// are built for.
var auditArch = map[string]uint32{"amd64": 0xc000003e, "arm64": 0xc00000b7}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// deniedSyscalls are refused with EPERM inside the sandbox: kernel
// interfaces a worker has no use for and that widen the attack surface
// (namespaces and mounts, tracing other processes, kernel keyrings, BPF,
// perf, io_uring, modules, clocks, reboot).
var deniedSyscalls = []string{
	"ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "unshare", "setns", "bpf",
	"pivot_root", "chroot", "keyctl", "add_key", "request_key", "perf_event_open", "userfaultfd",
	"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
	"swapon", "swapoff", "acct", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	"io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at",
	"lookup_dcookie", "syslog", "quotactl", "fanotify_init", "iopl", "ioperm", "vhangup",
	"move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	"pidfd_getfd", "personality",
}

// cloneNamespaces are clone's flags that make new namespaces (CLONE_NEWNS,
// NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET): refused as unshare
// is. (CLONE_NEWTIME exists only for clone3 and unshare.) A new user
// namespace would give the child every capability inside it, and with it
// kernel interfaces (netfilter, mounts) that root alone may use.
const cloneNamespaces = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

// Socket address families a worker process may use (socket and
// socketpair's first argument): AF_UNIX (runtimes' own socket pairs),
// AF_INET and AF_INET6 (loopback only, in the sandbox's empty network
// namespace) and AF_NETLINK (the C library's interface queries). Any other
// (AF_VSOCK to the host or its hypervisor, AF_PACKET, AF_ALG, AF_XDP,
// Bluetooth, ...) gets EAFNOSUPPORT, as from a kernel without it.
var allowedFamilies = []uint64{1, 2, 10, 16}

// memorySyscalls are refused (EPERM) when the memory layer is off: memfd
// and SysV shared-memory pages are not counted in RLIMIT_AS, so without a
// memory cgroup they would let a worker hold any amount of the node's
// memory.
var memorySyscalls = []string{"memfd_create", "shmget", "shmat"}

// program assembles the filter as struct sock_filter[] for bwrap --seccomp.
// Besides deniedSyscalls it refuses clone with namespace flags (EPERM),
// clone3 (ENOSYS: its flags are behind a pointer the filter cannot read,
// and the C library falls back to clone, whose flags it can), sockets of
// families other than allowedFamilies (EAFNOSUPPORT) and, without a memory
// cgroup (memCgroup false), memorySyscalls.
func program(memCgroup bool) ([]byte, error) {
	denied := deniedSyscalls
	if !memCgroup {
		denied = append(append([]string(nil), deniedSyscalls...), memorySyscalls...)
	}
	var families seccomp.ArgumentConditions
	for _, f := range allowedFamilies {
		families = append(families, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: f})
	}
	return assemble(seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{
				Action: seccomp.ActionErrno,
				Names:  denied,
				NamesWithCondtions: []seccomp.NameWithConditions{
					{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNamespaces}}},
				},
			},
			{Action: seccomp.ActionErrno | seccomp.Action(syscall.ENOSYS), Names: []string{"clone3"}},
			{Action: seccomp.ActionErrno | seccomp.Action(syscall.EAFNOSUPPORT), NamesWithCondtions: []seccomp.NameWithConditions{
				// NotEqual compares all 64 bits: a family with any of the
				// upper 32 bits set (which the kernel's int drops) is refused.
				{Name: "socket", Conditions: families},
				{Name: "socketpair", Conditions: families},
			}},
		},
	})
}

// LockdownProgram is a second seccomp filter, as struct sock_filter[], for
// a worker process to install on all its threads itself once its runtime
// has started and before it runs worker code (the .NET host does): it
// refuses what the runtime needed to start but the worker must not do.
// New processes and programs get EPERM (fork, vfork, clone without
// CLONE_THREAD, execve, execveat; clone3 gets ENOSYS, so that the C
// library falls back to clone, whose flags the filter can see), and so do
// IP sockets (socket with AF_INET or AF_INET6). Filters stack: the
// sandbox's stays in force.
func LockdownProgram() ([]byte, error) { return lockdown(true) }

// ProcessLockdownProgram is LockdownProgram without the IP sockets: new
// processes and programs only (execve, execveat, fork, vfork and clone
// without CLONE_THREAD get EPERM, clone3 ENOSYS); threads stay possible.
// Every sandbox offers it at LockdownPath. The Python runner installs it
// before worker code when the worker may not start processes.
func ProcessLockdownProgram() ([]byte, error) { return lockdown(false) }

func lockdown(ipSockets bool) ([]byte, error) {
	const afInet, afInet6, cloneThread = 2, 10, 0x10000
	conds := []seccomp.NameWithConditions{
		{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsNotSet, Value: cloneThread}}},
	}
	if ipSockets {
		conds = append(conds,
			seccomp.NameWithConditions{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: afInet}}},
			seccomp.NameWithConditions{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.Equal, Value: afInet6}}},
			// Equal compares all 64 bits, and the kernel's int family drops
			// the upper 32: AF_INET with an upper bit set would pass.
			seccomp.NameWithConditions{Name: "socket", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.GreaterThan, Value: 0xffffffff}}})
	}
	return assemble(seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{
				Action:             seccomp.ActionErrno,
				Names:              []string{"execve", "execveat", "fork", "vfork"},
				NamesWithCondtions: conds,
			},
			{Action: seccomp.ActionErrno | seccomp.Action(syscall.ENOSYS), Names: []string{"clone3"}},
		},
	})
}

// assemble compiles p for this architecture. A system call made with
// another architecture's convention (int 0x80 on x86-64: the i386 table,
// where every number means something else) gets ENOSYS: the library's own
// program would allow it, walking around every rule.
func assemble(p seccomp.Policy) ([]byte, error) {
	insts, err := p.Assemble()
	if err != nil {
		return nil, err
	}
	native, ok := auditArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("seccomp: no audit architecture known for %s", runtime.GOARCH)
	}
	insts = append([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: native, SkipTrue: 1},
		bpf.RetConstant{Val: uint32(seccomp.ActionErrno) | uint32(syscall.ENOSYS)},
	}, insts...)
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, r := range raw {
		_ = binary.Write(&b, binary.LittleEndian, r.Op)
		b.WriteByte(r.Jt)
		b.WriteByte(r.Jf)
		_ = binary.Write(&b, binary.LittleEndian, r.K)
	}
	if b.Len() > 60000 {
		return nil, errors.New("seccomp program too large for a pipe")
	}
	return b.Bytes(), nil
}
