# WorkManager Python fork server (engines/python/forkserver.go).
#
# Started by the node, as root and outside any sandbox, as
# `python -I -S -B -u -c <bootstrap> <hexversion>` with this file on stdin
# (its length on a line, then the file: the bootstrap runs it), followed
# by the runner's code ('M' and the marshalled code object, or 'S' and its
# source),
# fd 3 a SOCK_SEQPACKET socket to the node and fd 4 the read end of the
# node's life pipe (it reaches EOF when the node is gone). It imports what
# every runner imports, once, and then forks: a runner forked from it
# shares those pages with it and with every other runner instead of
# starting an interpreter of its own behind bwrap, prlimit and setpriv.
#
# It never runs, reads or holds anything of a worker's. Per request (one
# message from the node: the byte b"F" and, as SCM_RIGHTS, the plan pipe,
# the status socket and the runner's fds 0-4) it forks a launcher, answers
# "o <its pid>" and closes its copies. The launcher unshares a PID
# namespace, forks the supervisor as that namespace's first process, tells
# the node the supervisor's pid on the status socket ("p <pid>\n") and
# exits: the supervisor then belongs to the server, a subreaper, which
# reaps it (so the node's process tree keeps node, server, supervisor,
# runner), but nothing ties its life to the server's: the server's death
# takes no supervisor and no runner with it (they pass to the next reaper:
# init, or the node where the node is its container's first process). The
# supervisor, as bwrap's first process does, forks the runner (the
# namespace's second process) and reaps every process that ends in the
# namespace; it kills the runner when the node writes "k", closes the
# status socket or is gone (the life pipe), writes "x <wait status>\n"
# when the runner has ended, and exits, which ends every process left in
# the namespace.
# The runner reads the plan (engines/sandbox.Plan, JSON) from the plan pipe
# and, before anything of the worker's (each step named after the bwrap,
# prlimit or setpriv option it stands for):
#   - dies with its supervisor (a parent-death signal, checked against a
#     pipe the supervisor holds);
#   - joins its memory cgroup and unshares mount, network, IPC, UTS and
#     cgroup namespaces;
#   - mounts a root of its own: a tmpfs with /usr read-only, the runtime's
#     paths read-only, /etc's few files, /proc, a minimal /dev, its sized
#     /tmp and /scratch, the lockdown program at its path; brings up lo;
#     sets the host name; pivots into it and detaches the old root;
#   - (in the supervisor's new session) sets its resource limits, drops every
#     capability from its bounding set, its groups, and becomes its user
#     id (setresgid, setresuid), with no_new_privs;
#   - installs the sandbox's seccomp filter;
#   - keeps fds 0-4 only, takes the plan's environment and arguments and
#     runs the runner's main (its definitions made once in the server).
# Any step that fails ends the runner (exit 125) before the runner's code.

# What runner.py imports at its start (keep in step with it): imported here
# once, so that each runner forked from here shares their pages.
import _collections_abc  # noqa: F401
import _ctypes
import _functools  # noqa: F401
import _json  # noqa: F401
import binascii
import gc
import os
import select
import struct
import sys
import time  # noqa: F401
import types  # noqa: F401

# The modules a runner started by the interpreter would have: what this
# server imports besides is taken out of a runner's sys.modules before its
# code runs (the worker's imports find what they would have found).
_RUNNER_MODULES = frozenset(sys.modules)

import _socket  # noqa: E402
import errno  # noqa: E402
import fcntl  # noqa: E402
import json  # noqa: E402
import marshal  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402

CTRL = 3
LIFE = 4
MAX_PLAN = 1 << 20

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_SILENT = 32768
MS_SLAVE = 1 << 19
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

SYS = {  # machine: (pivot_root, seccomp)
    "x86_64": (155, 317),
    "aarch64": (41, 277),
}

LOCKDOWN_PATH = "/etc/workmanager/lockdown-processes.bpf"


def _simple(code):
    """A ctypes simple type (ctypes's own Python is not imported here)."""
    return type("c_" + code, (_ctypes._SimpleCData,), {"_type_": code})


_long, _int, _charp, _voidp, _ushort, _char = (_simple(c) for c in "lizPHc")


class _Fn(_ctypes.CFuncPtr):  # a libc function: int f(...), errno kept
    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _int


class _libc:
    _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)


class _Fprog(_ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", _ushort), ("filter", _voidp)]


_mount = _Fn(("mount", _libc))
_umount2 = _Fn(("umount2", _libc))
_unshare = _Fn(("unshare", _libc))
_sethostname = _Fn(("sethostname", _libc))
_prctl = _Fn(("prctl", _libc))
_syscall = _Fn(("syscall", _libc))


def _check(r, what):
    if r != 0:
        e = _ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def _b(s):
    return None if s is None else s.encode()


def mount(src, dst, fstype, flags, data=None):
    _check(_mount(_charp(_b(src)), _charp(_b(dst)), _charp(_b(fstype)), _long(flags), _charp(_b(data))),
           "mount %s on %s" % (src or fstype, dst))


def bind(src, dst, ro, rec=True):
    """bwrap --bind / --ro-bind: dst made (a directory or a file, as src)."""
    real = os.path.realpath(src)
    if os.path.isdir(real):
        os.makedirs(dst, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
        if not os.path.exists(dst):
            os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
    mount(real, dst, None, MS_BIND | (MS_REC if rec else 0) | MS_SILENT)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_SILENT | (MS_RDONLY if ro else 0)
    if ro:
        flags |= MS_NODEV
    mount(None, dst, None, flags)


def parents(root, path):
    """Makes path's missing parents under root 0755 (bwrap --perms 0755 --dir)."""
    d = os.path.dirname(path)
    missing = []
    while d not in ("/", "") and not os.path.isdir(root + d):
        missing.append(d)
        d = os.path.dirname(d)
    for d in reversed(missing):
        os.mkdir(root + d, 0o755)
        os.chmod(root + d, 0o755)


def setup_root(plan):
    """Mounts the runner's root at plan["root"] and pivots into it."""
    machine = os.uname().machine
    if machine not in SYS:
        raise OSError(errno.ENOSYS, "no fork server on %s" % machine)
    R = plan["root"]
    # Nothing mounted here reaches the node (--unshare-* made this
    # namespace; the node's mounts still reach it until the pivot).
    mount(None, "/", None, MS_SLAVE | MS_REC | MS_SILENT)
    mount("tmpfs", R, "tmpfs", MS_NODEV | MS_NOSUID | MS_SILENT, "mode=0755")
    os.umask(0o022)
    bind("/usr", R + "/usr", True)  # --ro-bind /usr /usr
    for name in ("bin", "lib", "lib64", "sbin"):  # --symlink usr/X /X
        os.symlink("usr/" + name, R + "/" + name)
    os.mkdir(R + "/etc", 0o755)
    for p in ("/etc/ld.so.cache", "/etc/localtime"):  # --ro-bind-try
        if os.path.exists(p):
            bind(p, R + p, True)
    # --proc /proc (this process is its PID namespace's first), with the
    # parts bwrap keeps read-only.
    os.mkdir(R + "/proc", 0o755)
    mount("proc", R + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_SILENT)
    for p in ("sys", "sysrq-trigger", "irq", "bus"):
        q = R + "/proc/" + p
        if os.path.exists(q):
            mount(q, q, None, MS_BIND | MS_REC | MS_SILENT)
            mount(None, q, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_SILENT)
    # --dev /dev
    os.mkdir(R + "/dev", 0o755)
    mount("tmpfs", R + "/dev", "tmpfs", MS_NOSUID | MS_NODEV | MS_SILENT, "mode=0755")
    for d in ("null", "zero", "full", "random", "urandom", "tty"):
        os.close(os.open(R + "/dev/" + d, os.O_CREAT | os.O_WRONLY, 0o644))
        mount("/dev/" + d, R + "/dev/" + d, None, MS_BIND | MS_SILENT)
        mount(None, R + "/dev/" + d, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_SILENT)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore"), ("ptmx", "pts/ptmx")):
        os.symlink(target, R + "/dev/" + name)
    os.mkdir(R + "/dev/shm", 0o755)
    os.mkdir(R + "/dev/pts", 0o755)
    mount("devpts", R + "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC | MS_SILENT, "newinstance,ptmxmode=0666,mode=620")
    # /tmp and /scratch: tmpfs of their size and inode count, the worker's.
    for d, opts in (("/tmp", plan["tmp"]), ("/scratch", plan["scratch"])):
        os.mkdir(R + d, 0o700)
        mount("tmpfs", R + d, "tmpfs", MS_NOSUID | MS_NODEV | MS_SILENT, opts)
    for p in plan.get("read_only") or ():
        parents(R, p)
        bind(p, R + p, True)
    for p in plan.get("writable") or ():
        parents(R, p)
        bind(p, R + p, False)
    for b in plan.get("binds") or ():
        parents(R, b["dst"])
        bind(b["src"], R + b["dst"], not b.get("writable"))
    lockdown = plan.get("lockdown")
    if lockdown:  # --ro-bind-data: a root-owned file the worker can only read
        parents(R, LOCKDOWN_PATH)
        fd = os.open(R + LOCKDOWN_PATH, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o444)
        os.write(fd, binascii.a2b_base64(lockdown))
        os.close(fd)
    # --hostname worker
    name = b"worker"
    _check(_sethostname(_charp(name), _long(len(name))), "sethostname")
    # lo up, as bwrap brings it up in the new network namespace.
    s = _socket.socket(2, 2)
    try:
        fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH22x", b"lo", 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS UP|LOOPBACK|RUNNING
    finally:
        s.close()
    # pivot_root(R, R), then the old root, stacked underneath, detached.
    os.chdir(R)
    _check(_syscall(_long(SYS[machine][0]), _charp(b"."), _charp(b".")), "pivot_root")
    _check(_umount2(_charp(b"."), _int(MNT_DETACH)), "detaching the old root")
    os.chdir("/")
    # The root itself: no longer a place anyone writes.
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_SILENT)


def drop_privileges(plan):
    """prlimit's limits, setpriv's user: --reuid --regid --clear-groups
    --inh-caps=-all --bounding-set=-all --no-new-privs."""
    for res, soft, hard in plan.get("rlimits") or ():
        resource.setrlimit(res, (soft, hard))
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        _check(_prctl(_long(PR_CAPBSET_DROP), _long(cap), _long(0), _long(0), _long(0)), "dropping capability %d" % cap)
    _prctl(_long(PR_CAP_AMBIENT), _long(PR_CAP_AMBIENT_CLEAR_ALL), _long(0), _long(0), _long(0))
    uid = plan["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
        raise OSError(errno.EPERM, "the user id did not change")
    _check(_prctl(_long(PR_SET_NO_NEW_PRIVS), _long(1), _long(0), _long(0), _long(0)), "no_new_privs")
    prog = plan.get("seccomp")
    if prog:
        prog = binascii.a2b_base64(prog)
        if len(prog) % 8:
            raise OSError(errno.EINVAL, "malformed seccomp filter")
        buf = (_char * len(prog)).from_buffer_copy(prog)
        fprog = _Fprog(len(prog) // 8, _ctypes.addressof(buf))
        # seccomp(SECCOMP_SET_MODE_FILTER, 0, &fprog): one thread.
        _check(_syscall(_long(SYS[os.uname().machine][1]), _long(1), _long(0), _ctypes.byref(fprog)), "seccomp")


def runner(plan_fd, io, alive, runner_mod, keep):
    """The runner: sandboxes itself by the plan it reads, then runs main.
    (The plan is read here, not in the supervisor: what the supervisor
    touches stays shared with the server.)"""
    try:
        _check(_prctl(_long(PR_SET_PDEATHSIG), _long(signal.SIGKILL), _long(0), _long(0), _long(0)), "parent-death signal")
        # The supervisor holds the pipe's other end: EOF here means it died
        # before the signal was armed.
        if select.select([alive], [], [], 0)[0]:
            os._exit(125)
        os.close(alive)
        plan = read_plan(plan_fd)
        if plan.get("cgroup_procs"):
            with open(plan["cgroup_procs"], "w") as f:
                f.write("0")
        _check(_unshare(_int(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS |
                             (CLONE_NEWCGROUP if plan.get("cgroup_procs") else 0))), "unshare")
        setup_root(plan)
        os.chdir("/scratch")
        # --new-session: the supervisor's (it called setsid), as bwrap's
        # first process's is the runner's session there.
        drop_privileges(plan)
        # fds 0-4 only (sandbox-exec's descriptors layer).
        for i, fd in enumerate(io):
            if fd != i:
                os.dup2(fd, i)
        os.closerange(5, 1 << 16)
        for i in range(5):
            os.set_inheritable(i, i < 3)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        for kv in plan.get("env") or ():
            k, _, v = kv.partition("=")
            os.environ[k] = v
        os.environ["HOME"] = "/scratch"
        os.environ["TMPDIR"] = "/tmp"
        os.environ["PWD"] = "/scratch"  # as bwrap's --chdir sets it
        sys.argv[:] = ["-c"] + list(plan.get("args") or ())
        for name in [m for m in sys.modules if m not in keep]:
            del sys.modules[name]
        # The runner's definitions, made once in the server, are this
        # process's __main__, as `python -c` would make them.
        runner_mod.__name__ = "__main__"
        sys.modules["__main__"] = runner_mod
        del plan
        # Nothing of the server's stays reachable through this frame's
        # globals (its libc functions, its constants): the runner sees
        # what a runner started by the interpreter sees.
        finish = _finisher()
        g = globals()
        for name in [k for k in g if k != "__builtins__"]:
            del g[name]
    except BaseException as e:
        try:
            os.write(2, ("workmanager fork server: sandboxing the runner: %s\n" % (e,)).encode())
        finally:
            os._exit(125)
    try:
        runner_mod.main()
    except SystemExit as e:
        finish(e.code)
    except BaseException:
        finish(None, True)
    finish(0)


def _finisher():
    """How a forked runner ends, as an interpreter's exit would end it: an
    uncaught exception printed (exit 1), SystemExit's code or message, the
    threads the worker started that are not daemons joined
    (threading._shutdown, which also waits for concurrent.futures'
    workers), atexit's functions run (logging's flush among them), the
    standard streams flushed; then _exit, past the server's frames. Made
    before the server's globals are cleared: it keeps what it needs."""
    exit_, sys_, import_ = os._exit, sys, __import__

    def finish(code, uncaught=False):
        if uncaught:
            try:
                sys_.excepthook(*sys_.exc_info())
            except BaseException:
                pass
            code = 1
        elif code is None:
            code = 0
        elif not isinstance(code, int):
            try:
                sys_.stderr.write("%s\n" % (code,))
            except BaseException:
                pass
            code = 1
        try:
            threading = sys_.modules.get("threading")
            if threading is not None:
                threading._shutdown()
        except BaseException:
            pass
        try:
            import_("atexit")._run_exitfuncs()
        except BaseException:
            pass
        for f in (sys_.stdout, sys_.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        exit_(code & 0xFF)

    return finish


def _child_wakeups():
    """A pipe that becomes readable when a child exits (SIGCHLD, through
    the interpreter's wake-up descriptor): poll it, then _reaped."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    return wake_r, wake_w


def _reaped(wake_r):
    """Empties the wake-up pipe and yields (pid, wait status) of every child
    that has exited, reaping it."""
    try:
        while os.read(wake_r, 64):
            pass
    except BlockingIOError:
        pass
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, st


def set_name(name):
    """The name ps and top show (the command line stays the server's)."""
    _prctl(_long(PR_SET_NAME), _charp(name), _long(0), _long(0), _long(0))


def read_plan(fd):
    chunks, n = [], 0
    while True:
        b = os.read(fd, 65536)
        if not b:
            break
        n += len(b)
        if n > MAX_PLAN:
            raise ValueError("plan larger than %d bytes" % MAX_PLAN)
        chunks.append(b)
    os.close(fd)
    return json.loads(b"".join(chunks))


def launch(fds, runner_mod, keep):
    """The fork server's child: it unshares a PID namespace, forks the
    supervisor as that namespace's first process, tells the node the
    supervisor's pid and exits (the supervisor is then nobody's child but
    its reaper's: not the server's)."""
    plan_fd, status, io = fds[0], fds[1], fds[2:]
    os.close(CTRL)
    if len(io) != 5 or min(io) < 5:
        os._exit(125)
    try:
        _check(_unshare(_int(CLONE_NEWPID)), "unshare")
    except BaseException as e:
        os.write(io[2], ("workmanager fork server: %s\n" % (e,)).encode())
        os._exit(125)
    sync_r, sync_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(sync_w)
        supervise(plan_fd, status, io, sync_r, runner_mod, keep)
    os.write(status, b"p %d\n" % pid)
    os._exit(0)  # closes sync_w: the supervisor goes on


def supervise(plan_fd, status, io, sync, runner_mod, keep):
    """The supervisor: the first process of the runner's PID namespace (its
    init, as bwrap's is: it reaps what the runner's processes leave behind
    and, when it exits, the kernel ends every process of the namespace).
    It forks the runner, kills it when the node writes "k" or lets go of
    the status socket or is gone (the life pipe), and writes how it ended
    ("x <wait status>") before it exits. Signals from inside the namespace
    do not reach it (it handles none but SIGCHLD, which only wakes it)."""
    # Wait until the launcher has said this process's pid: "p" comes first.
    while os.read(sync, 1):
        pass
    os.close(sync)
    os.setsid()
    set_name(b"wm-supervisor")
    # The runner's stdio become the supervisor's too (it holds no pipe of
    # the fork server's, and its own errors go where the runner's go).
    for i in range(3):
        os.dup2(io[i], i)
        os.close(io[i])
    io = [0, 1, 2] + io[3:]
    wake_r, wake_w = _child_wakeups()
    alive_r, alive_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (alive_w, status, LIFE, wake_r, wake_w):
            os.close(fd)
        set_name(b"python3")
        runner(plan_fd, io, alive_r, runner_mod, keep)
    os.close(alive_r)
    os.close(plan_fd)
    for fd in (0, 1) + tuple(io[3:]):
        os.close(fd)
    p = select.poll()
    p.register(status, select.POLLIN)
    p.register(LIFE, select.POLLIN)
    p.register(wake_r, select.POLLIN)
    killed = False
    while True:
        try:
            ready = p.poll()
        except InterruptedError:
            continue
        for fd, ev in ready:
            if fd == wake_r:
                for child, st in _reaped(wake_r):  # the runner, and orphans
                    if child == pid:
                        try:
                            os.write(status, b"x %d\n" % st)
                        except OSError:
                            pass
                        os._exit(0)
                continue
            if killed:
                continue
            if fd == LIFE:  # the node is gone
                os.kill(pid, signal.SIGKILL)
                killed = True
            elif fd == status:
                try:
                    b = os.read(status, 64)
                except OSError:
                    b = b""
                if not b or b"k" in b:  # killed, or the node let go
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                    p.unregister(status)


def main():
    # Only what the node passed on purpose: a descriptor it holds without
    # close-on-exec (a native library's socket) stays out of every child.
    os.closerange(5, max(os.sysconf("SC_OPEN_MAX"), 1 << 16))
    if len(sys.argv) < 2 or int(sys.argv[1]) != sys.hexversion:
        sys.exit("workmanager fork server: the interpreter changed (restart the node)")
    src = sys.stdin.buffer.read()
    if src[:1] == b"M":
        code = marshal.loads(src[1:])
    else:
        code = compile(src[1:], "<runner>", "exec")
    del src
    # The runner's definitions (runner.py without its call of main), made
    # once here: every child shares them. What they import is kept in the
    # children's sys.modules with what the runner's first lines import.
    runner_mod = types.ModuleType("__workmanager_runner__")
    runner_mod.__builtins__ = sys.modules["builtins"]
    before = set(sys.modules)
    exec(code, runner_mod.__dict__)
    if not callable(runner_mod.__dict__.get("main")):
        sys.exit("workmanager fork server: the runner's code defines no main")
    keep = _RUNNER_MODULES | (set(sys.modules) - before)
    del code
    os.set_inheritable(CTRL, False)
    os.set_inheritable(LIFE, False)
    ctrl = _socket.socket(fileno=CTRL)
    set_name(b"wm-fork-server")
    # The supervisors, orphaned by their launchers, become this process's
    # children (a subreaper): the node's process tree keeps each runner
    # under its node (node, server, supervisor, runner), and this process
    # reaps them. Not their parent in any other way: no signal ties them
    # to it, so its death takes none with it.
    _check(_prctl(_long(PR_SET_CHILD_SUBREAPER), _long(1), _long(0), _long(0), _long(0)), "subreaper")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = _child_wakeups()
    gc.collect()
    gc.freeze()  # what is here now stays out of every child's collections
    p = select.poll()
    p.register(CTRL, select.POLLIN)
    p.register(LIFE, select.POLLIN)
    p.register(wake_r, select.POLLIN)
    while True:
        try:
            ready = p.poll()
        except InterruptedError:
            ready = []
        for fd, ev in ready:
            if fd == LIFE:
                os._exit(0)
            if fd == wake_r:
                for _ in _reaped(wake_r):  # launchers and supervisors
                    pass
                continue
            msg, anc, _, _ = ctrl.recvmsg(16, _socket.CMSG_SPACE(16 * 4))
            if not msg:
                os._exit(0)
            fds = []
            for level, typ, data in anc:
                if level == _socket.SOL_SOCKET and typ == _socket.SCM_RIGHTS:
                    fds.extend(struct.unpack("%di" % (len(data) // 4), data[: len(data) - len(data) % 4]))
            if msg != b"F" or len(fds) != 7:
                for fd in fds:
                    os.close(fd)
                ctrl.send(b"e bad request")
                continue
            try:
                pid = os.fork()
            except OSError as e:
                for fd in fds:
                    os.close(fd)
                ctrl.send(b"e fork: " + str(e).encode())
                continue
            if pid == 0:
                try:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    launch(fds, runner_mod, keep)
                finally:
                    os._exit(125)
            for fd in fds:
                os.close(fd)
            ctrl.send(b"o %d" % pid)


main()
