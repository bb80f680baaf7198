"""The runner subprocess and its framed protocol, as the node drives them.

The runner (``_runner.py``, the node's own engines/python/runner.py) is
started as ``python -I -B -u -c <runner source> <spin µs> <allowed
packages> <DevKit dir>`` in its own process group, with the request pipe
as fd 3 and the response pipe as fd 4 (stdin is /dev/null; the worker's
stdout and stderr go to this process's stderr). A frame is a uint32
little-endian payload length, one byte of kind, and the payload; see the
"Protocol" section of engines/python/README.md.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import time
from collections.abc import Mapping
from pathlib import Path

HELLO = ord("H")
LOAD = ord("L")
OK = ord("K")
EVENT = ord("E")
RESULT = ord("R")
ERROR = ord("X")
GATEWAY = ord("G")
GATEWAY_REPLY = ord("g")

_HEADER = struct.Struct("<IB")
MAX_FRAME = 1 << 30

RUNNER = Path(__file__).with_name("_runner.py")
"""The runner script shipped with the package (a copy of the node's)."""

DEVKIT_DIR = Path(__file__).parent.parent
"""The directory holding this package, passed to the runner."""


class ProcessDied(Exception):
    """The runner's response pipe reached EOF; status is its exit status."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


def exit_status(wait_status: int) -> str:
    """A wait status worded like Go's os.ProcessState."""
    code = os.waitstatus_to_exitcode(wait_status)
    if code < 0:
        try:
            return "signal: " + signal.Signals(-code).name
        except ValueError:
            return f"signal: {-code}"
    return f"exit status {code}"


def _high_dup(fd: int) -> int:
    """A close-on-exec copy of fd numbered 10 or more (never 3 or 4)."""
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


class RunnerProcess:
    """One running runner: frames in, frames out, kill and reap."""

    def __init__(
        self,
        python: str,
        *,
        allowed_packages: str = "",
        env: Mapping[str, str] | None = None,
        runner: Path = RUNNER,
        devkit_dir: Path = DEVKIT_DIR,
    ) -> None:
        source = runner.read_text(encoding="utf-8")
        argv = [python, "-I", "-B", "-u", "-c", source, "0", allowed_packages, str(devkit_dir)]
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        child_req, child_resp = _high_dup(req_r), _high_dup(resp_w)
        for fd in (req_r, resp_w):
            os.close(fd)
        try:
            self.pid = os.posix_spawn(
                python,
                argv,
                dict(os.environ if env is None else env),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, 2, 1),
                    (os.POSIX_SPAWN_DUP2, child_req, 3),
                    (os.POSIX_SPAWN_DUP2, child_resp, 4),
                ],
                setpgroup=0,
            )
        except BaseException:
            for fd in (req_w, resp_r):
                os.close(fd)
            raise
        finally:
            os.close(child_req)
            os.close(child_resp)
        self._req: int | None = req_w
        self._resp: int | None = resp_r
        self._buf = b""
        self._status: str | None = None

    def send(self, kind: int, payload: bytes) -> None:
        """Writes one frame; ProcessDied if the runner is gone."""
        if self._req is None:
            raise ProcessDied(self.wait())
        view = memoryview(_HEADER.pack(len(payload), kind) + payload)
        try:
            while view:
                view = view[os.write(self._req, view) :]
        except BrokenPipeError:
            raise ProcessDied(self.wait()) from None

    def _fill(self, want: int, deadline: float | None) -> None:
        assert self._resp is not None
        while len(self._buf) < want:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._resp], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(self._resp, max(65536, want - len(self._buf)))
            if not chunk:
                raise ProcessDied(self.wait())
            self._buf += chunk

    def recv(self, deadline: float | None = None) -> tuple[int, bytes]:
        """Reads one frame (kind, payload) by the monotonic deadline.
        Raises TimeoutError, or ProcessDied at EOF."""
        if self._resp is None:
            raise ProcessDied(self.wait())
        self._fill(_HEADER.size, deadline)
        size, kind = _HEADER.unpack_from(self._buf)
        if size > MAX_FRAME:
            raise ProcessDied(f"protocol error: a frame of {size} bytes")
        end = _HEADER.size + size
        self._fill(end, deadline)
        payload, self._buf = self._buf[_HEADER.size : end], self._buf[end:]
        return kind, payload

    def wait(self, grace: float = 2.0) -> str:
        """Closes the request pipe (an idle runner exits at EOF), gives the
        runner up to grace seconds to exit, kills its process group (what
        the worker may have left running, or the runner itself when it
        does not exit) and reaps it; returns its exit status."""
        if self._status is None:
            self._close_pipes()
            until = time.monotonic() + grace
            while not self._exited() and time.monotonic() < until:
                time.sleep(0.002)
            self._kill_group()  # the leader is not reaped yet: its pgid is ours
            _, status = os.waitpid(self.pid, 0)
            self._status = exit_status(status)
        return self._status

    def kill(self) -> str:
        """Kills the runner's process group at once and reaps the runner."""
        if self._status is None:
            self._kill_group()
        return self.wait(grace=0)

    def _exited(self) -> bool:
        """Whether the runner has exited, without reaping it."""
        info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return info is not None

    def _kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _close_pipes(self) -> None:
        for fd in (self._req, self._resp):
            if fd is not None:
                os.close(fd)
        self._req = self._resp = None
