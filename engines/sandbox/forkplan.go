package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A Plan is what a process forked from a fork server (engines/python's)
// does to itself, before it runs anything of a worker's, to stand where
// Command's chain (sandbox-exec, bwrap, prlimit, setpriv) would put it: the
// same layers, applied by the child to itself instead of by programs
// executed one after another. The node makes the plan (the user id, the
// memory cgroup, the limits, the paths, the filters); the fork server's
// child carries it out (engines/python/forkserver.py, which names each
// step after the bwrap option it stands for) and fails closed: a step that
// fails ends the child before the runner starts.
type Plan struct {
	// UID is the process's user and group id (no supplementary groups,
	// no capabilities, no_new_privs).
	UID int `json:"uid"`
	// CgroupProcs is the cgroup.procs file of the process's memory cgroup
	// ("" without the memory layer): the child joins it first.
	CgroupProcs string `json:"cgroup_procs"`
	// Tmp and Scratch are the mount options of its /tmp and /scratch
	// (tmpfs, sized, an inode count, owned by UID).
	Tmp     string `json:"tmp"`
	Scratch string `json:"scratch"`
	// ReadOnly are host paths bound read-only at the same place, their
	// missing parents made 0755.
	ReadOnly []string `json:"read_only"`
	// Writable are host paths bound read-write at the same place
	// (Config.Writable).
	Writable []string `json:"writable"`
	// Binds are Spec.Binds.
	Binds []PlanBind `json:"binds"`
	// Rlimits are {resource, soft, hard} (RLIMIT_* numbers).
	Rlimits [][3]uint64 `json:"rlimits"`
	// Seccomp is the sandbox's filter (struct sock_filter[]); Lockdown the
	// program offered at LockdownPath. Either may be empty (no seccomp).
	Seccomp  []byte `json:"seccomp"`
	Lockdown []byte `json:"lockdown"`
	// Root is an empty directory of the node's on which the child mounts
	// its new root (in its own mount namespace: the node sees nothing).
	Root string `json:"root"`
	// Env is the whole environment; Args the program's arguments.
	Env  []string `json:"env"`
	Args []string `json:"args"`
}

// PlanBind is one Spec.Bind.
type PlanBind struct {
	Src      string `json:"src"`
	Dst      string `json:"dst"`
	Writable bool   `json:"writable"`
}

// Forkable reports whether a fork server's children can carry a Plan on
// this node: the sandbox runs as root with the namespaces and user layers
// (what the plan's steps need), so that a child holds every layer the
// chain would give it. Elsewhere processes start through Command.
func (s *Sandbox) Forkable() bool {
	return s.cfg.Mode != Off && s.namespaces && s.setuid && os.Geteuid() == 0
}

// RLIMIT_* numbers (asm-generic, the same on amd64 and arm64).
const (
	rlimitCPU     = 0
	rlimitFsize   = 1
	rlimitCore    = 4
	rlimitNproc   = 6
	rlimitNofile  = 7
	rlimitMemlock = 8
	rlimitAS      = 9
)

// forkRoot is the directory every forked child mounts its root on.
var forkRoot = filepath.Join(mountRoot, "fork-root")

// Plan returns the plan of a forked process for spec (its Path is not
// used: the fork server runs its own program) and the function that
// releases what the sandbox holds for it (its user id's share, its memory
// cgroup): call it once, when the process has exited. It fails when the
// sandbox is not Forkable.
func (s *Sandbox) Plan(spec Spec) (*Plan, func(), error) {
	if !s.Forkable() {
		return nil, nil, fmt.Errorf("sandbox: a forked process needs the namespaces and user layers, as root")
	}
	if err := os.MkdirAll(forkRoot, 0o700); err != nil {
		return nil, nil, fmt.Errorf("sandbox: %w", err)
	}
	limits := s.cfg.Limits.with(spec.Limits)
	uid, releaseUID, err := s.uids.acquire(spec.Owner)
	if err != nil {
		return nil, nil, err
	}
	procs, releaseMem := "", func() {}
	if limit := s.memoryLimit(limits); s.mem != nil && limit > 0 {
		if procs, releaseMem, err = s.mem.create(limit); err != nil {
			releaseUID()
			return nil, nil, err
		}
	}
	tmpfs := func(size uint64) string {
		return fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", size, inodes(size), uid, uid)
	}
	p := &Plan{
		UID: uid, CgroupProcs: procs, Tmp: tmpfs(s.cfg.TmpBytes), Scratch: tmpfs(s.cfg.ScratchBytes),
		Writable: s.cfg.Writable, Root: forkRoot, Env: spec.Env, Args: spec.Args,
		Rlimits: rlimits(limits),
	}
	for _, r := range spec.ReadOnly {
		if r != "" && r != "/usr" && !strings.HasPrefix(r, "/usr/") {
			p.ReadOnly = append(p.ReadOnly, r)
		}
	}
	for _, b := range spec.Binds {
		p.Binds = append(p.Binds, PlanBind{Src: b.Src, Dst: b.Dst, Writable: b.Writable})
	}
	if s.program != nil {
		p.Seccomp, p.Lockdown = s.program, s.lockdown
	}
	return p, func() { releaseMem(); releaseUID() }, nil
}

// rlimits are prlimitArgs's limits as {resource, soft, hard}.
func rlimits(l Limits) [][3]uint64 {
	var r [][3]uint64
	add := func(res int, v uint64) {
		if v > 0 {
			r = append(r, [3]uint64{uint64(res), v, v})
		}
	}
	add(rlimitAS, l.AddressSpace)
	add(rlimitFsize, l.FileSize)
	add(rlimitNofile, l.OpenFiles)
	add(rlimitNproc, l.Processes)
	if l.CPUSeconds > 0 {
		// SIGXCPU at the limit, SIGKILL a second later (prlimitArgs).
		r = append(r, [3]uint64{rlimitCPU, l.CPUSeconds, l.CPUSeconds + 1})
	}
	return append(r, [3]uint64{rlimitCore, 0, 0}, [3]uint64{rlimitMemlock, WorkerMemlockBytes, WorkerMemlockBytes})
}
