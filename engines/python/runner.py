# WorkManager Python runner.
#
# Started by engines/python as
# `python -I -S -B -u -c <this file> <spin µs> <allowed packages> <DevKit dir>
# <sys.path as JSON> <max concurrency>`, or, as the node usually starts it, with
# this file compiled once by the same interpreter: `-c <bootstrap>` that reads
# the marshalled code object from a file next to the DevKit (or takes it, in
# base64, from its own first argument, which it removes), then the same
# arguments (engines/python/python.go, runnerArgs). It
# serves exactly one worker: it says hello ('H'), loads the worker's code once
# ('L'), then answers events ('E') in order until its request pipe reaches
# EOF. The node may write several events at once (a batch): their replies
# are then held back and written together (see _send). See README.md next to this file for the protocol and the worker
# contract.
#
# fd 3: requests  (Go -> Python)
# fd 4: responses (Python -> Go)
# A frame is: uint32 little-endian payload length, 1 byte kind, payload.
# stdout/stderr belong to the worker (they are forwarded to the Go logger).

# What every runner imports is kept to modules that import nothing heavy
# (no re, enum or collections): json's C half (_json) instead of json,
# binascii instead of base64, _functools instead of functools; traceback
# and linecache only once there is a traceback to format (or worker code
# imported them); subprocess only if worker code does. An idle runner is
# about 2.3 MiB smaller for it and starts about 9 ms sooner
# (docs/performance.md, "A runner that imports almost nothing").
import _functools
import binascii
import gc
import os
import select
import struct
import sys
import time
import types
from _collections_abc import Awaitable as _Awaitable

REQ_FD = 3
RESP_FD = 4
FILENAME = "<worker>"
MODULE = "__worker__"

_HDR = struct.Struct("<IB")
_unpack_hdr = _HDR.unpack_from
_pack_hdr = _HDR.pack
_read = os.read
_write = os.write
_clock = time.perf_counter

K_HELLO = ord("H")
K_LOAD = ord("L")
K_EVENT = ord("E")
K_OK = ord("K")
K_RESULT = ord("R")
K_ERROR = ord("X")
K_GATEWAY = ord("G")  # Python -> Go during an event: a gateway call
K_GATEWAY_REPLY = ord("g")  # Go -> Python: its answer
K_CANCEL = ord("C")  # Go -> Python, concurrent mode: cancel a call's task
K_SETUP = ord("S")  # Go -> Python, before K_LOAD: a spare runner's worker settings

# Concurrent mode (an async def worker with a max concurrency above 1): the
# load's K carries b"async" and every later frame starts with a 4-byte tag
# naming its call (see engines/python/mux.go).
_TAG = struct.Struct("<I")
_unpack_tag = _TAG.unpack_from
_pack_tag = _TAG.pack
_concurrent = False
_max_concurrency = 1


def _not_serializable(o):
    raise TypeError("Object of type %s is not JSON serializable" % type(o).__name__)


# The C scanner and encoder (_json, json's accelerator) are used directly:
# json.loads/json.dumps add a few microseconds of Python-level work per
# call, and importing json imports re. The scanner reads its settings from
# a context object as json.JSONDecoder() would hold them. Input from Go's
# encoder is valid JSON without surrounding whitespace.
_join = "".join
try:
    import _json

    _scan = _json.make_scanner(
        types.SimpleNamespace(
            strict=True,
            object_hook=None,
            object_pairs_hook=None,
            parse_float=float,
            parse_int=int,
            parse_constant={"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__,
            memo={},
        )
    )
    _encode = _json.make_encoder(
        None,  # no cycle detection: a cycle ends in RecursionError
        _not_serializable,
        _json.encode_basestring_ascii,
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )
    del _json

    def _dumps(o):
        """o as compact ASCII JSON (str)."""
        return _join(_encode(o, 0))

except ImportError:  # an interpreter without the _json accelerator
    import json

    _scan = json.decoder.JSONDecoder().scan_once
    _dumps = json.JSONEncoder(
        ensure_ascii=True,
        allow_nan=False,
        separators=(",", ":"),
        default=_not_serializable,
    ).encode
    del json


def _loads_str(s):
    """Parses one JSON value from s, as json.loads does (whitespace around
    it allowed, nothing else). Off the hot path: s goes through _loads."""
    return _loads(s.strip(" \t\n\r").encode("utf-8", "surrogatepass"))


def _loads(b):
    """Parses one JSON value from bytes produced by Go's encoder."""
    s = b.decode("utf-8", "surrogatepass")
    try:
        obj, end = _scan(s, 0)
    except StopIteration as e:
        raise ValueError("invalid JSON at character %s" % e.value) from None
    if end != len(s):
        raise ValueError("extra data after the JSON value")
    return obj


def _b64enc(b):
    """base64.b64encode."""
    return binascii.b2a_base64(b, newline=False)


# base64.b64decode (without validate: characters outside the alphabet are
# discarded).
_b64dec = binascii.a2b_base64

# Media types the Go CloudEvents SDK embeds as JSON (not as a string) in the
# structured form; "" means "no datacontenttype", which it also treats as JSON.
_SDK_JSON = frozenset(
    (
        "",
        "application/json",
        "text/json",
        "application/cloudevents+json",
        "application/cloudevents-batch+json",
    )
)


class _OutputError(Exception):
    """A problem with what process() returned (reported without a type)."""


def _media_type(ct):
    i = ct.find(";")
    if i >= 0:
        ct = ct[:i]
    return ct.strip().lower()


# ---------------------------------------------------------------- framing


class _Reader:
    """Reads frames from the (non-blocking) request pipe.

    After a reply the next request often follows within microseconds (a
    queue of events); waking a sleeping process costs more than that on small
    VMs, so the reader first busy-polls for up to `spin` seconds, then sleeps
    in poll(). Spinning stops being tried (except now and then) when it
    mostly runs out.
    """

    __slots__ = ("fd", "buf", "poller", "spin", "score", "count", "early")

    def __init__(self, fd, spin):
        self.fd = fd
        self.buf = b""
        self.early = []  # events read while waiting for a gateway reply
        self.spin = spin
        self.score = 0
        self.count = 0
        os.set_blocking(fd, False)
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)

    def _read(self, n):
        fd = self.fd
        try:
            return _read(fd, n)
        except BlockingIOError:
            pass
        self.count += 1
        if self.spin > 0 and (self.score > -4 or self.count % 32 == 0):
            until = _clock() + self.spin
            while True:
                try:
                    data = _read(fd, n)
                    if self.score < 8:
                        self.score += 1
                    return data
                except BlockingIOError:
                    if _clock() > until:
                        break
            if self.score > -8:
                self.score -= 1
        while True:
            self.poller.poll()
            try:
                return _read(fd, n)
            except BlockingIOError:
                pass

    def has_frame(self):
        """Whether a whole request is buffered already (the next read
        will not wait)."""
        if self.early:
            return True
        buf = self.buf
        return len(buf) >= 5 and len(buf) >= 5 + _unpack_hdr(buf)[0]

    def read(self):
        """Returns (kind, payload) or (None, None) at EOF."""
        if self.early:
            return self.early.pop(0)
        return self.read_pipe()

    def read_pipe(self):
        """read, not counting the frames kept in early."""
        buf = self.buf
        while len(buf) < 5:
            chunk = self._read(65536)
            if not chunk:
                return None, None
            buf = buf + chunk if buf else chunk
        n, kind = _unpack_hdr(buf)
        end = 5 + n
        have = len(buf)
        if have < end:
            parts = [buf]
            while have < end:
                chunk = self._read(end - have)
                if not chunk:
                    return None, None
                parts.append(chunk)
                have += len(chunk)
            buf = b"".join(parts)
        payload = buf[5:end]
        self.buf = buf[end:] if have > end else b""
        return kind, payload


# Replies held back while the next request of a batch is buffered already:
# the node reads them together, woken once. Only the replies of fast events
# (under _HOLD_MAX) are held: a slow worker gains nothing from it. Held
# replies are written before the runner could wait for anything (a read
# that blocks, a gateway call) and before an event starts once the oldest is
# older than _HOLD_MAX. A reply held while the next event turns out slow
# waits for that event.
_held = []
_held_since = 0.0
_event_started = 0.0
_HOLD_MAX = 0.002


def _send(kind, payload):
    global _held_since
    data = _pack_hdr(len(payload), kind) + payload
    now = _clock()
    if now - _event_started < _HOLD_MAX and _reader is not None and _reader.has_frame():
        if not _held:
            _held_since = now
        _held.append(data)
        return
    _send_now(data)


def _flush_held():
    if _held and _clock() - _held_since > _HOLD_MAX:
        _send_now(b"")


def _send_now(data):
    if _held:
        data = b"".join(_held) + data
        _held.clear()
    if not data:
        return
    n = _write(RESP_FD, data)
    if n < len(data):
        view = memoryview(data)
        while n < len(data):
            n += _write(RESP_FD, view[n:])


def _error_payload(type_name, message, tb="", invalid_output=False):
    report = {"type": type_name, "message": message, "traceback": tb}
    if invalid_output:
        # The outputs cannot be published as they are: the node
        # dead-letters the event at once (output_invalid), no retry.
        report["invalid_output"] = True
    return _dumps(report).encode()


def _send_error(type_name, message, tb="", invalid_output=False):
    _send(K_ERROR, _error_payload(type_name, message, tb, invalid_output))


# ---------------------------------------------------------------- errors


def _worker_frames(tb):
    """Drops the runner's own frames from the front of a traceback."""
    t = tb
    while t is not None and t.tb_frame.f_code.co_filename != FILENAME:
        t = t.tb_next
    return t if t is not None else tb


def _format_tb(exc):
    try:
        import traceback

        _share_source()
        return "".join(
            traceback.format_exception(
                type(exc), exc, _worker_frames(exc.__traceback__)
            )
        )
    except Exception:  # never let formatting hide the real error
        return ""


# The worker's source as linecache keeps it (len, mtime None: never
# checked against a file, lines, name), for the tracebacks of its code;
# linecache gets it once imported (_share_source), by the runner's
# _format_tb or by worker code (logging, traceback: _make_importer).
_source_entry = None


def _share_source():
    lc = sys.modules.get("linecache")
    if lc is not None and _source_entry is not None and lc.cache.get(FILENAME) is not _source_entry:
        lc.cache[FILENAME] = _source_entry


def _worker_line(exc):
    """The deepest line of worker code in the exception's traceback."""
    line = None
    t = exc.__traceback__
    while t is not None:
        if t.tb_frame.f_code.co_filename == FILENAME:
            line = t.tb_lineno
        t = t.tb_next
    return line


def _exc_message(exc):
    try:
        return str(exc)
    except Exception:
        return "<unprintable %s>" % type(exc).__name__


# ---------------------------------------------------------------- guard
#
# The interpreter layer of the sandbox (see docs/security.md, "Interpreter
# layer", for exactly what it does and does not promise): the worker's code
# gets its own builtins whose __import__ admits only the safe standard
# library subset below and the top-level packages of PYTHON_ALLOWED_PACKAGES
# and hands out views of modules without the refused modules they hold as
# attributes (logging.os), and an audit hook refuses process creation,
# signals, sockets and ctypes unless the matching module is allowed. The
# hook and its tables live only in a closure that nothing in Python refers
# to once it is installed (not in this module's globals, which worker code
# can reach). This is not a security boundary on its own (CPython says so):
# the OS layers around the process are.

# The safe subset of the standard library: no files beyond open(), no
# processes, no network, no native code. An entry admits the module and its
# submodules; "urllib.parse" admits that module only, not urllib.request.
SAFE_STDLIB = frozenset(
    """__future__ abc array asyncio base64 binascii bisect calendar cmath codecs
    collections colorsys contextlib contextvars copy csv dataclasses datetime
    decimal difflib enum fractions functools graphlib hashlib heapq hmac html
    ipaddress itertools json keyword logging math numbers operator pprint random
    re reprlib secrets statistics string struct textwrap time types typing
    unicodedata urllib.parse uuid warnings weakref zlib zoneinfo
    _strptime encodings virtufin_host""".split()
)

# Audit events refused unless a module is allowed, by capability.
_CAPABILITIES = (
    (
        "subprocess",
        "starting processes or sending signals",
        frozenset(
            """os.system os.exec os.posix_spawn os.spawn os.fork os.forkpty
            subprocess.Popen os.kill os.killpg signal.pthread_kill pty.spawn
            os.startfile""".split()
        ),
    ),
    (
        "socket",
        "network access",
        frozenset(
            """socket.__new__ socket.bind socket.connect socket.getaddrinfo
            socket.gethostbyname socket.gethostbyaddr socket.getnameinfo
            socket.sendto socket.sendmsg""".split()
        ),
    ),
    (
        "ctypes",
        "loading native code",
        frozenset(
            """ctypes.dlopen ctypes.dlsym ctypes.dlsym/handle ctypes.cdata
            ctypes.cdata/buffer ctypes.call_function ctypes.addressof
            ctypes.create_string_buffer ctypes.string_at ctypes.wstring_at
            ctypes.set_errno ctypes.PyObj_FromPtr""".split()
        ),
    ),
)

# Refused whatever is allowed: walking the garbage collector's objects and
# trace or profile functions reach every function and frame, the audit
# hook's closure included.
_ALWAYS_DENIED = frozenset(
    ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile")
)

# Introspection that reaches the runner's frames and code: refused when the
# worker's own code does it (the runner formats tracebacks with it).
_FRAME_EVENTS = frozenset(("object.__getattr__", "sys._getframe", "sys._current_frames", "object.__setattr__"))
_FRAME_ATTRS = frozenset(("tb_frame", "__code__", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals", "f_builtins"))


# Native modules that start processes without an audit event of their own:
# importing them afresh (after dropping them from sys.modules) is refused
# with the subprocess capability's message (the runner's own copies are
# defused by _close_process_backdoors).
_PROCESS_MODULES = frozenset(("_posixsubprocess",))


def _allows_in(allowed):
    """The function telling whether allowed (a frozenset of entries as in
    SAFE_STDLIB) admits a module name: an entry admits the module and its
    submodules."""

    def allows(name):
        while True:
            if name in allowed:
                return True
            i = name.rfind(".")
            if i < 0:
                return False
            name = name[:i]

    return allows


def _make_hook(
    allows,
    always=_ALWAYS_DENIED,
    frame_events=_FRAME_EVENTS,
    frame_attrs=_FRAME_ATTRS,
    filename=FILENAME,
    getframe=sys._getframe,
    frame_type=types.FrameType,
    refuse=PermissionError,
    type=type,
    len=len,
):
    """The audit hook for a worker whose allowed modules allows admits.

    Everything the hook uses is bound here, in its closure (frozen sets,
    tuples, and the builtins it calls): rebinding the runner's globals or
    the builtins changes nothing, and the closure's cells are reachable only
    through the hook, to which nothing in Python refers once _load has
    installed it (the interpreter keeps it in C)."""
    refused = tuple((m, what, events) for m, what, events in _CAPABILITIES if not allows(m))
    denied = frozenset().union(*[events for _, _, events in refused])
    imports = tuple((m, what, _PROCESS_MODULES) for m, what, _ in refused if m == "subprocess")
    own = None  # the hook's code, below

    def hook(event, args):
        if event in denied:
            for module, what, events in refused:
                if event in events:
                    raise refuse(
                        "%s is not allowed in a worker (audit event %s; allowed only when %r is in PYTHON_ALLOWED_PACKAGES)"
                        % (what, event, module)
                    )
        if event in always:
            raise refuse(
                "walking the garbage collector's objects or tracing frames is not allowed in a worker (audit event %s)"
                % event
            )
        if imports and event == "import":
            for module, what, names in imports:
                if args[0] in names:
                    raise refuse(
                        "%s is not allowed in a worker (audit event import %s; allowed only when %r is in PYTHON_ALLOWED_PACKAGES)"
                        % (what, args[0], module)
                    )
        if event in frame_events:
            attr = event[0] == "o"  # object.__getattr__ / __setattr__
            if attr:
                if len(args) < 2 or args[1] not in frame_attrs:
                    return
            elif event == "sys._getframe":
                # getframe(0) below raises this event with the hook's own
                # frame (CPython 3.11+; f_code on it raises
                # object.__getattr__, returned from above): let the hook
                # look at itself without recursing, and without any state
                # (a flag would be one more thing to reach, and racy).
                if not args:
                    return  # before 3.11: no frame to tell the hook's own by
                if type(args[0]) is frame_type and args[0].f_code is own:
                    return
            caller = getframe(0).f_back
            if caller is not None and caller.f_code.co_filename == filename:
                raise refuse(
                    "introspecting frames and code (%s %s) is not allowed in a worker"
                    % (event, args[1] if attr and len(args) > 1 else "")
                )

    own = hook.__code__
    return hook


def _make_views(allows):
    """The function that gives worker code its view of an imported module:
    the module itself when it holds no modules, else a module object with a
    copy of its attributes as they are on the first import, less those whose
    values are modules; those come on use, as views too when allows admits
    their names and as an AttributeError when not. Attribute reads cost what
    they cost on the module (a plain module object); setting an attribute
    sets it in the view only."""
    module_type = types.ModuleType
    modules = sys.modules
    cache = {}

    def view(m):
        if not isinstance(m, module_type):
            return m
        v = cache.get(m)
        if v is None:
            v = cache[m] = make(m)
        return v

    def make(m):
        d = m.__dict__
        values = list(d.values())
        if "__path__" not in d and not any(isinstance(x, module_type) for x in values):
            return m  # a plain module holding no modules: nothing to hide
        name = m.__name__
        v = module_type(name)
        vd = v.__dict__
        for k, x in list(d.items()):
            if not isinstance(x, module_type):
                vd[k] = x

        def __getattr__(attr):
            x = getattr(m, attr)
            if isinstance(x, module_type):
                sub = x.__dict__.get("__name__")
                # Admitted by its own name, or as a submodule of this one
                # (os.path, which is posixpath, when os is allowed); not
                # as a module this one merely imported (logging.os).
                dotted = name + "." + attr
                if not (type(sub) is str and allows(sub)) and not (modules.get(dotted) is x and allows(dotted)):
                    raise AttributeError(
                        "module %r has no attribute %r in a worker: it is the module %r, which a worker may not import "
                        "(not in the safe standard library subset or PYTHON_ALLOWED_PACKAGES)" % (name, attr, sub),
                        name=attr,
                        obj=v,
                    )
                x = vd[attr] = view(x)
            return x

        vd["__getattr__"] = __getattr__
        return v

    return view


# Records of the logging module, once the worker (or a package it imports)
# imported it: the root logger gets a handler on stderr at level INFO, so
# that logging.info is not lost (Python's default is WARNING, handled by its
# last-resort handler that prints the bare message). The worker may set
# another level like any program: logging.getLogger().setLevel("DEBUG").
# For the node (WORKMANAGER_LOG_LEVELS=1) each line of a record starts with
# "\x1eL<levelno> <logger name>\x1f", which the engine turns into the level
# and the attribute "logger" of the node's log record (engines/internal/wire);
# elsewhere (the DevKit's harness) lines read "LEVEL name: message".
LOG_LEVELS_ENV = "WORKMANAGER_LOG_LEVELS"
_log_pending = [True]


def _setup_logging():
    del _log_pending[:]
    logging = sys.modules["logging"]
    marked = os.environ.get(LOG_LEVELS_ENV) == "1"

    class _Formatter(logging.Formatter):
        def format(self, record):
            text = logging.Formatter.format(self, record)
            if marked:
                prefix = "\x1eL%d %s\x1f" % (record.levelno, record.name)
            elif record.name == "root":
                prefix = record.levelname + ": "
            else:
                prefix = "%s %s: " % (record.levelname, record.name)
            return prefix + text.replace("\n", "\n" + prefix)

    root = logging.getLogger()
    if root.handlers:
        return  # configured already (a package that did it at import)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def _make_importer(allows, real_import, view):
    """The worker's __import__: the name check, then view."""
    modules = sys.modules
    log_pending = _log_pending

    def __import__(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and not allows(name):
            # `from package import module` of an allowed submodule of a
            # refused package (from urllib import parse) is admitted; `from
            # package import *` is not.
            if not fromlist or "*" in fromlist or not all(allows(name + "." + f) for f in fromlist):
                raise ImportError(
                    "import of %r is not allowed: it is not in the safe standard library subset "
                    "and its top-level package %r is not in PYTHON_ALLOWED_PACKAGES"
                    % (name, name.partition(".")[0]),
                    name=name,
                )
        m = view(real_import(name, globals, locals, fromlist, level))
        if log_pending and "logging" in modules:
            _setup_logging()
        if "linecache" in modules:
            _share_source()
        return m

    return __import__


def _denied_fork_exec(*args, **kwargs):
    raise PermissionError(
        "starting processes or sending signals is not allowed in a worker "
        "(_posixsubprocess.fork_exec; allowed only when 'subprocess' is in PYTHON_ALLOWED_PACKAGES)"
    )


def _close_process_backdoors():
    """Replaces the one process-starting function that raises no audit
    event, _posixsubprocess.fork_exec, wherever the runner's modules hold
    it (subprocess._fork_exec is reachable from the safe subset as
    asyncio.base_events.subprocess._fork_exec)."""
    import _posixsubprocess

    _posixsubprocess.fork_exec = _denied_fork_exec
    # subprocess binds fork_exec when it is imported: from now on it gets
    # the denial. Imported already (not by the runner), it is set too.
    if "subprocess" in sys.modules:
        sys.modules["subprocess"]._fork_exec = _denied_fork_exec


# Where the sandbox offers the process lockdown filter (struct
# sock_filter[], engines/sandbox.LockdownPath) when it has the namespaces
# layer; absent outside a sandbox.
LOCKDOWN_PATH = "/etc/workmanager/lockdown-processes.bpf"
# Without the namespaces layer (no bubblewrap) the sandbox passes its
# lockdown on inherited pipes whose fds these variables name
# (engines/sandbox.LockdownFDEnv: processes and network,
# NetworkLockdownFDEnv: network only, for a worker that may start
# processes).
LOCKDOWN_FD_ENV = "WORKMANAGER_LOCKDOWN_FD"
NETWORK_LOCKDOWN_FD_ENV = "WORKMANAGER_NETWORK_LOCKDOWN_FD"
_SECCOMP_NR = {"x86_64": 317, "aarch64": 277}


def _read_inherited(env):
    """Reads the filter on the inherited pipe that the variable env names:
    (program, where), (None, why not), or (None, None) when env is not set.
    Takes the pipe and the variable away in any case."""
    fd = os.environ.pop(env, None)
    if fd is None:
        return None, None
    where = "fd %s ($%s)" % (fd, env)
    try:
        n = int(fd)
        if n < 5:  # 0-2 stdio, 3-4 the protocol pipes
            raise ValueError("not an inherited fd")
    except ValueError as e:
        return None, "reading %s: %s" % (where, e)
    chunks = []
    try:
        while True:
            b = os.read(n, 65536)
            if not b:
                break
            chunks.append(b)
    except OSError as e:
        return None, "reading %s: %s" % (where, e)
    finally:
        try:
            os.close(n)
        except OSError:
            pass
    return b"".join(chunks), where


def _lockdown_programs():
    """Reads the filters the sandbox offers, before any worker code runs:
    ((program, where), (network program, where)), each (None, why not) on
    an error and (None, None) when not offered (SANDBOX=off, no seccomp on
    this machine; the network program only without the namespaces
    layer)."""
    network = _read_inherited(NETWORK_LOCKDOWN_FD_ENV)
    offered = _read_inherited(LOCKDOWN_FD_ENV)
    if offered != (None, None):
        return offered, network
    try:
        with open(LOCKDOWN_PATH, "rb") as f:
            return (f.read(), LOCKDOWN_PATH), network
    except FileNotFoundError:
        return (None, None), network
    except OSError as e:
        return (None, "reading %s: %s" % (LOCKDOWN_PATH, e)), network


def _lockdown(prog, where, sandboxed):
    """In a sandbox (sandboxed: it offered a filter), makes the runner not
    dumpable, so that /proc/self/mem (and every /proc/self file that is
    not world-readable) belongs to root and the worker's own user id cannot
    write its memory through it, and installs prog, the sandbox's lockdown
    filter, on the runner (it has one thread now; threads started later
    inherit it): from here on the kernel refuses what the filter refuses
    (processes and programs; without the namespaces layer every socket but
    AF_UNIX), whatever the worker's code reaches. Returns None, or why it
    could not (then no code is loaded)."""
    if not sandboxed:
        return None
    if prog is None and where is not None:
        return where  # the error
    if prog is not None and (not prog or len(prog) % 8):
        return "malformed filter in %s" % where
    nr = _SECCOMP_NR.get(os.uname().machine)
    if prog is not None and nr is None:
        return "not supported on %s" % os.uname().machine
    # _ctypes directly: the ctypes package's own Python (2.5 ms of a
    # runner's start, then dropped) adds nothing this needs.
    try:
        import _ctypes
    except ImportError as e:
        return "ctypes is not available: %s" % e

    class _long(_ctypes._SimpleCData):
        _type_ = "l"

    class _int(_ctypes._SimpleCData):
        _type_ = "i"

    class _Fn(_ctypes.CFuncPtr):  # a libc function: int f(...), errno kept
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = _int

    class _libc:  # what a _ctypes.CFuncPtr needs of a library
        _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)

    prctl, syscall = _Fn(("prctl", _libc)), _Fn(("syscall", _libc))
    # PR_SET_DUMPABLE 0.
    if prctl(_long(4), _long(0), _long(0), _long(0), _long(0)) != 0:
        return "prctl(PR_SET_DUMPABLE): errno %d" % _ctypes.get_errno()
    if prog is None:
        return None

    class _ushort(_ctypes._SimpleCData):
        _type_ = "H"

    class _voidp(_ctypes._SimpleCData):
        _type_ = "P"

    class _char(_ctypes._SimpleCData):
        _type_ = "c"

    class _Fprog(_ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", _ushort), ("filter", _voidp)]

    buf = (_char * len(prog)).from_buffer_copy(prog)
    fprog = _Fprog(len(prog) // 8, _ctypes.addressof(buf))
    # PR_SET_NO_NEW_PRIVS (setpriv has set it already; required).
    if prctl(_long(38), _long(1), _long(0), _long(0), _long(0)) != 0:
        return "prctl(PR_SET_NO_NEW_PRIVS): errno %d" % _ctypes.get_errno()
    # seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &fprog)
    if syscall(_long(nr), _long(1), _long(1), _ctypes.byref(fprog)) != 0:
        return "seccomp: errno %d" % _ctypes.get_errno()
    return None


def _restricted_builtins(importer):
    import builtins

    b = dict(builtins.__dict__)
    for name in ("__loader__", "__spec__", "breakpoint", "help", "input", "exit", "quit", "copyright", "credits", "license"):
        b.pop(name, None)
    b["__import__"] = importer
    return b


# The worker's __import__ (_make_importer), and the audit hook until _load
# installs it (then nothing here refers to it).
_worker_import = None
_pending_hook = []
_lockdown_error = None

# ---------------------------------------------------------------- host module
#
# `import virtufin_host` gives worker code what the node does for it. The
# process has no network: call_gateway asks the node, which calls the
# backend through Dapr service invocation under the worker's gateway policy
# (allowed_gateway_targets) and, in a group, its fencing token.

_reader = None


class GatewayError(Exception):
    """A gateway call failed (refused by the policy, unreachable, or the
    backend answered an error); the message says which."""


def _gateway_request(service, method, data):
    if not isinstance(service, str) or not service or not isinstance(method, str) or not method:
        raise GatewayError("service and method must be non-empty strings")
    if data is None:
        body = b""
    elif isinstance(data, (bytes, bytearray, memoryview)):
        body = bytes(data)
    elif isinstance(data, str):
        body = data.encode("utf-8")
    else:
        body = _dumps(data).encode()
    return _dumps({"service": service, "method": method}).encode() + b"\n" + body


def _gateway_answer(payload):
    if payload[:1] != b"\x00":
        raise GatewayError(payload[1:].decode("utf-8", "replace"))
    return payload[1:]


def call_gateway(service, method, data=None):
    """Calls method of service (a Dapr app id) through the node, POSTing
    data (bytes, str, or a JSON value; None sends nothing) and returns the
    response body (bytes). Raises GatewayError. In an async def worker it
    blocks the event loop until the answer is in: await
    call_gateway_async there instead."""
    req = _gateway_request(service, method, data)
    if _concurrent:
        return _call_gateway_blocking(req)
    if _reader is None or not _in_event:
        raise GatewayError("call_gateway works only while the worker handles an event")
    _send_now(_pack_hdr(len(req), K_GATEWAY) + req)
    while True:
        kind, payload = _reader.read_pipe()
        if kind == K_GATEWAY_REPLY:
            break
        if kind != K_EVENT:
            # The node sends nothing else mid-event; anything else is fatal.
            os._exit(70)
        _reader.early.append((kind, payload))  # the rest of a batch
    return _gateway_answer(payload)


async def call_gateway_async(service, method, data=None):
    """call_gateway as a coroutine: in an async def worker the event loop
    runs the worker's other events while the node makes the call."""
    req = _gateway_request(service, method, data)
    if not _concurrent:
        return call_gateway(service, method, data)
    tag = _current_tag()
    gwid, fut = _new_gateway(tag)
    _send_tagged(K_GATEWAY, tag, _pack_tag(gwid) + req)
    try:
        return _gateway_answer(await fut)
    finally:
        _gateways.pop(gwid, None)


_in_event = False
_host = types.ModuleType("virtufin_host")
_host.call_gateway = call_gateway
_host.call_gateway_async = call_gateway_async
_host.GatewayError = GatewayError
_host.__doc__ = "What the WorkManager node does for worker code (see engines/python/README.md)."
sys.modules["virtufin_host"] = _host

# ---------------------------------------------------------------- loading

_process = None
_is_async = False
_loop = None


# Code flags (inspect's CO_* values: the runner does not import inspect,
# which costs a runner about 1.1 MiB and 4 ms to start; the three functions
# below do for a worker's callable what the runner asked of inspect).
_CO_VARARGS = 0x04
_CO_COROUTINE = 0x80
_CO_ITERABLE_COROUTINE = 0x100
_CO_ASYNC_GENERATOR = 0x200
# Code of coroutines: async def, generator-based coroutines, async generators.
_CO_ASYNC = _CO_COROUTINE | _CO_ITERABLE_COROUTINE | _CO_ASYNC_GENERATOR


def _callee(fn):
    """The Python function a call of fn runs and how many positional
    arguments fn passes it before the caller's, seen through what
    inspect.signature sees through: bound methods, functools.partial
    (without keywords), functools.wraps (__wrapped__) and instances of a
    class with a __call__ method. (None, 0) for any other callable
    (builtins, classes, ...), whose parameters the runner does not check."""
    bound = 0
    for _ in range(64):
        t = type(fn)
        if t is types.FunctionType:
            wrapped = fn.__dict__.get("__wrapped__")
            if wrapped is None:
                return fn, bound
            fn = wrapped
        elif t is types.MethodType:
            fn, bound = fn.__func__, bound + 1
        elif t is _functools.partial:
            if fn.keywords:
                return None, 0
            fn, bound = fn.func, bound + len(fn.args)
        elif not isinstance(fn, type) and type(getattr(t, "__call__", None)) is types.FunctionType:
            fn, bound = t.__call__, bound + 1
        else:
            return None, 0
    return None, 0


def _takes_one_argument(fn):
    """Whether fn can be called with one positional argument (what
    inspect.signature(fn).bind(None) answers for the callables _callee sees
    through; True for the others, whose first call says)."""
    f, bound = _callee(fn)
    if f is None:
        return True
    co = f.__code__
    n = co.co_argcount  # positional parameters, positional-only included
    given = bound + 1
    if given < n - len(f.__defaults__ or ()):
        return False
    if given > n and not co.co_flags & _CO_VARARGS:
        return False
    kwdefaults = f.__kwdefaults__ or {}
    for name in co.co_varnames[n : n + co.co_kwonlyargcount]:
        if name not in kwdefaults:
            return False
    return True


def _is_coroutine_function(f):
    """inspect.iscoroutinefunction: an async def function, also behind
    bound methods and functools.partial."""
    for _ in range(64):
        t = type(f)
        if t is types.MethodType:
            f = f.__func__
        elif t is _functools.partial:
            f = f.func
        else:
            break
    return type(f) is types.FunctionType and bool(f.__code__.co_flags & _CO_COROUTINE)


def _is_awaitable(o):
    """inspect.isawaitable."""
    t = type(o)
    return (
        t is types.CoroutineType
        or (t is types.GeneratorType and bool(o.gi_code.co_flags & _CO_ITERABLE_COROUTINE))
        or isinstance(o, _Awaitable)
    )


def _needs_loop(code):
    """Whether the worker's code can need an event loop: it defines async
    code or names asyncio, anywhere (functions and classes included)."""
    todo = [code]
    while todo:
        c = todo.pop()
        if c.co_flags & _CO_ASYNC or "asyncio" in c.co_names:
            return True
        todo.extend(k for k in c.co_consts if type(k) is types.CodeType)
    return False


def _await_without_loop(aw):
    """The value of an awaitable that needs no event loop (it finishes
    without suspending), for code the runner made no loop for."""
    # A generator-based coroutine (types.coroutine) is its own iterator.
    it = aw if type(aw) is types.GeneratorType else aw.__await__()
    try:
        it.send(None)
    except StopIteration as s:
        return s.value
    close = getattr(it, "close", None)
    if close is not None:
        close()
    raise RuntimeError(
        "process returned an awaitable that waits for an event loop, and this worker has none: "
        "the runner makes one for code that defines async functions or uses asyncio"
    )


def _setup(payload):
    # A spare runner (started before its worker was known) learns its
    # worker's settings before the code: the VIRTUFIN_WORKER_* variables
    # (os.environ, so also the processes it may start) and how many events
    # an async def worker runs at once. No reply: the load's answers.
    global _max_concurrency
    settings = _loads(payload)
    for key, value in settings.get("env", {}).items():
        if key.startswith("VIRTUFIN_WORKER_"):
            os.environ[key] = value
    _max_concurrency = int(settings.get("max_concurrency", 1))


def _load(source):
    global _process, _is_async, _loop
    global _source_entry
    text = source.decode("utf-8", "replace")
    _source_entry = (len(text), None, text.splitlines(True), FILENAME)
    _share_source()
    try:
        code = compile(source, FILENAME, "exec", dont_inherit=True)
    except SyntaxError as e:  # includes IndentationError, TabError
        where = " (line %d)" % e.lineno if e.lineno else ""
        _send_error(type(e).__name__, "%s%s" % (e.msg, where), _format_tb(e))
        return
    except (ValueError, TypeError) as e:  # e.g. null bytes in the source
        _send_error(type(e).__name__, _exc_message(e))
        return

    if _lockdown_error is not None:
        _send_error(
            "",
            "the sandbox's process lockdown could not be installed, so no worker code runs: %s"
            % _lockdown_error,
        )
        return

    mod = types.ModuleType(MODULE)
    mod.__file__ = FILENAME
    mod.__dict__["__builtins__"] = _restricted_builtins(_worker_import)
    sys.modules[MODULE] = mod
    # The event loop (a socketpair inside) exists before the audit hook,
    # made only for code that can need it: importing asyncio is half the
    # cost of a runner's start.
    if _needs_loop(code):
        import asyncio

        _loop = asyncio.new_event_loop()
        asyncio.set_event_loop(_loop)
    if _pending_hook:
        # Installed straight from the list: no name here (or in this
        # frame, which worker code could inspect) keeps it.
        sys.addaudithook(_pending_hook.pop())
    try:
        exec(code, mod.__dict__)
    except BaseException as e:
        line = _worker_line(e)
        where = " (line %d)" % line if line else ""
        _send_error(
            type(e).__name__, "%s%s" % (_exc_message(e), where), _format_tb(e)
        )
        return

    fn = mod.__dict__.get("process")
    if fn is None:
        _send_error("", "the code defines no process(event) function")
        return
    if not callable(fn):
        _send_error("", "process is not callable (it is a %s)" % type(fn).__name__)
        return
    try:
        ok = _takes_one_argument(fn)
        is_async = _is_coroutine_function(fn) or _is_coroutine_function(getattr(fn, "__call__", None))
    except Exception as e:  # the worker's own attribute code failed
        _send_error(type(e).__name__, "inspecting process: %s" % _exc_message(e), _format_tb(e))
        return
    if not ok:
        _send_error("", "process must accept exactly one argument (the event)")
        return

    _process = fn
    _is_async = is_async
    # Everything loaded so far lives as long as the process: keep it out of
    # the garbage collector's way.
    gc.collect()
    gc.freeze()
    global _concurrent
    if _is_async and _loop is not None and _max_concurrency > 1:
        _concurrent = True
        _send(K_OK, b"async")
        return
    _send(K_OK, b"")


# ---------------------------------------------------------------- events


def _decode_event(payload):
    ev = _loads(payload)
    if "data_base64" in ev:
        ev["data"] = _b64dec(ev.pop("data_base64"))
    elif "datacontenttype" in ev:
        data = ev.get("data")
        if type(data) is str:
            mt = _media_type(ev["datacontenttype"])
            if mt not in _SDK_JSON and mt.endswith("+json"):
                try:
                    ev["data"] = _loads_str(data)
                except ValueError:
                    pass
    return ev


def _normalize(o, i):
    if type(o) is not dict:
        if not isinstance(o, dict):
            raise _OutputError(
                "output %d: expected a dict (a CloudEvent), got %s"
                % (i, type(o).__name__)
            )
        o = dict(o)
    t = o.get("type")
    if not t or type(t) is not str:
        raise _OutputError('output %d: missing required attribute "type"' % i)
    out = {"specversion": "1.0"}
    for k, v in o.items():
        if v is not None:
            out[k] = v
    if "data" in out:
        data = out["data"]
        dt = type(data)
        if dt is bytes or dt is bytearray or dt is memoryview:
            del out["data"]
            out["data_base64"] = _b64enc(data).decode("ascii")
        else:
            ct = out.get("datacontenttype")
            if ct is None:
                out["datacontenttype"] = "text/plain" if dt is str else "application/json"
            elif type(ct) is not str:
                raise _OutputError("output %d: datacontenttype must be a str" % i)
            else:
                mt = _media_type(ct)
                if mt not in _SDK_JSON and dt is not str:
                    if mt.endswith("+json"):
                        out["data"] = _dumps(data)
                    else:
                        raise _OutputError(
                            "output %d: data for datacontenttype %r must be str or bytes, got %s"
                            % (i, ct, dt.__name__)
                        )
    return out


def _encode_result(result):
    if result is None:
        return b"null"
    if isinstance(result, dict):
        return _dumps(_normalize(result, 0)).encode()
    if isinstance(result, (list, tuple)):
        if not result:
            return b"null"
        return _dumps([_normalize(o, i) for i, o in enumerate(result)]).encode()
    raise _OutputError(
        "process returned %s; expected None, a dict or a list of dicts"
        % type(result).__name__
    )


def _handle_event(payload):
    global _event_started
    _event_started = _clock()
    if _process is None:
        _send_error("", "no code loaded")
        return
    try:
        ev = _decode_event(payload)
    except Exception as e:
        _send_error("", "decoding the input event: %s: %s" % (type(e).__name__, e))
        return
    global _in_event
    _in_event = True
    try:
        result = _process(ev)
        if _is_async or (
            result is not None
            and type(result) is not dict
            and type(result) is not list
            and _is_awaitable(result)
        ):
            if _loop is not None:
                result = _loop.run_until_complete(result)
            else:
                result = _await_without_loop(result)
    except BaseException as e:  # SystemExit too: the runner keeps serving
        _in_event = False
        _send_error(type(e).__name__, _exc_message(e), _format_tb(e))
        return
    _in_event = False
    try:
        out = _encode_result(result)
    except _OutputError as e:
        _send_error("", str(e), invalid_output=True)
        return
    except Exception as e:  # not JSON serializable, NaN, ...
        _send_error(
            type(e).__name__,
            "encoding the outputs: %s" % _exc_message(e),
            invalid_output=True,
        )
        return
    _send(K_RESULT, out)


# ---------------------------------------------------------------- concurrent
#
# An async def worker's events run as tasks on the event loop: the runner
# reads the next frame whenever the pipe has one (add_reader), so a new
# event starts while others await. The node bounds how many run at once.

_tasks = {}  # tag -> task
_gateways = {}  # gateway call id -> future of its answer
_next_gateway = 0
_tag_var = None  # contextvars.ContextVar: the tag of the task's call


def _current_tag():
    tag = _tag_var.get(None) if _tag_var is not None else None
    if tag is None:
        raise GatewayError("call_gateway works only while the worker handles an event")
    return tag


def _new_gateway(tag):
    global _next_gateway
    _next_gateway = (_next_gateway + 1) & 0xFFFFFFFF
    fut = _loop.create_future()
    _gateways[_next_gateway] = fut
    return _next_gateway, fut


def _send_tagged(kind, tag, payload):
    _send_now(_pack_hdr(len(payload) + 4, kind) + _pack_tag(tag) + payload)


def _next_frame(reader):
    """The next whole frame in reader's buffer, or (None, None)."""
    buf = reader.buf
    if len(buf) < 5:
        return None, None
    n, kind = _unpack_hdr(buf)
    end = 5 + n
    if len(buf) < end:
        return None, None
    payload = buf[5:end]
    reader.buf = buf[end:]
    return kind, payload


def _dispatch(kind, payload):
    """Acts on one frame of the node in concurrent mode."""
    if len(payload) < 4:
        os._exit(70)
    tag = _unpack_tag(payload)[0]
    if kind == K_EVENT:
        _tasks[tag] = _loop.create_task(_run_task(tag, payload[4:]))
    elif kind == K_GATEWAY_REPLY:
        fut = _gateways.get(tag)
        if fut is not None and not fut.done():
            fut.set_result(payload[4:])
    elif kind == K_CANCEL:
        task = _tasks.get(tag)
        if task is not None:
            task.cancel()
    else:
        os._exit(70)  # the node sends nothing else


def _call_gateway_blocking(req):
    """call_gateway from an async def worker in concurrent mode: waits for
    its answer with the event loop stopped, keeping the node's other frames
    (new events, answers, cancellations) for when the loop runs again."""
    tag = _current_tag()
    gwid, fut = _new_gateway(tag)
    try:
        _send_tagged(K_GATEWAY, tag, _pack_tag(gwid) + req)
        reader = _reader
        while not fut.done():
            kind, payload = _next_frame(reader)
            if kind is None:
                chunk = reader._read(65536)
                if not chunk:
                    os._exit(0)  # the node closed the pipe
                reader.buf += chunk
                continue
            _dispatch(kind, payload)
        return _gateway_answer(fut.result())
    finally:
        _gateways.pop(gwid, None)


async def _run_task(tag, payload):
    _tag_var.set(tag)
    try:
        try:
            ev = _decode_event(payload)
        except Exception as e:
            _send_tagged(K_ERROR, tag, _error_payload("", "decoding the input event: %s: %s" % (type(e).__name__, e)))
            return
        try:
            result = await _process(ev)
        except BaseException as e:  # CancelledError, SystemExit too: the runner keeps serving
            _send_tagged(K_ERROR, tag, _error_payload(type(e).__name__, _exc_message(e), _format_tb(e)))
            return
        try:
            out = _encode_result(result)
        except _OutputError as e:
            _send_tagged(K_ERROR, tag, _error_payload("", str(e), invalid_output=True))
            return
        except Exception as e:
            _send_tagged(K_ERROR, tag, _error_payload(type(e).__name__, "encoding the outputs: %s" % _exc_message(e), invalid_output=True))
            return
        _send_tagged(K_RESULT, tag, out)
    finally:
        _tasks.pop(tag, None)


def _serve_concurrent(reader):
    """Serves events as tasks on the event loop until EOF on the request
    pipe."""
    global _tag_var
    import contextvars

    _tag_var = contextvars.ContextVar("virtufin_call")
    loop = _loop
    done = loop.create_future()

    def readable():
        try:
            chunk = _read(REQ_FD, 65536)
        except BlockingIOError:
            return
        if not chunk:
            loop.remove_reader(REQ_FD)
            if not done.done():
                done.set_result(None)
            return
        reader.buf += chunk
        while True:
            kind, payload = _next_frame(reader)
            if kind is None:
                return
            _dispatch(kind, payload)

    # Frames that came with the load's.
    while True:
        kind, payload = _next_frame(reader)
        if kind is None:
            break
        _dispatch(kind, payload)
    loop.add_reader(REQ_FD, readable)
    loop.run_until_complete(done)


def main():
    global _worker_import, _lockdown_error
    # The protocol pipes must not leak into processes the worker starts.
    os.set_inheritable(REQ_FD, False)
    os.set_inheritable(RESP_FD, False)
    global _max_concurrency
    spin_us = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    _max_concurrency = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] else 1
    allowed = sys.argv[2] if len(sys.argv) > 2 else ""
    # The directory holding the DevKit (the virtufin_worker package) that
    # the node ships: importable by every worker without shipping it.
    devkit = sys.argv[3] if len(sys.argv) > 3 else ""
    # The interpreter's sys.path as its site module would make it (the
    # runner starts with -S; the node asked the interpreter once).
    if len(sys.argv) > 4 and sys.argv[4]:
        sys.path[:] = _loads_str(sys.argv[4])
    packages = [p.strip() for p in allowed.split(",") if p.strip()]
    if devkit:
        sys.path.append(devkit)
        packages.append("virtufin_worker")
    allows = _allows_in(SAFE_STDLIB | frozenset(packages))
    import builtins

    _worker_import = _make_importer(allows, builtins.__import__, _make_views(allows))
    # Made here, installed by _load right before the worker's code (after
    # the runner's own ctypes and event loop); main's frame, which worker
    # code could inspect, never names it.
    _pending_hook.append(_make_hook(allows))
    (prog, where), network = _lockdown_programs()
    sandboxed = prog is not None or where is not None or network != (None, None)
    if not allows("subprocess"):
        _close_process_backdoors()
        _lockdown_error = _lockdown(prog, where, sandboxed)
    else:
        # Processes allowed: no process lockdown, but without the
        # namespaces layer the network part all the same.
        _lockdown_error = _lockdown(network[0], network[1], sandboxed)
    global _reader
    reader = _reader = _Reader(REQ_FD, spin_us / 1e6)
    _send(K_HELLO, sys.version.encode())
    while True:
        kind, payload = reader.read()
        if kind is None:
            break
        if kind == K_EVENT:
            _flush_held()
            _handle_event(payload)
        elif kind == K_SETUP and _process is None:
            _setup(payload)
        elif kind == K_LOAD:
            _load(payload)
            if _concurrent:
                _serve_concurrent(reader)
                break
        else:
            _send_error("", "protocol error: unknown frame kind %r" % chr(kind))
    if _loop is not None:
        try:
            _loop.close()
        except Exception:
            pass


# Started by the interpreter: run. Forked from the fork server
# (forkserver.py), which ran this file's definitions once for every runner
# it forks: the server calls main in each child.
if __name__ == "__main__":
    main()
