"""The local harness: runs a worker the way a WorkManager node does.

:class:`Harness` starts the node's real runner (``_runner.py``) as a
subprocess, speaks its framed protocol, loads the worker's code, sends one
event at a time, answers the worker's gateway calls from stubs, and applies
the node's output completion, output policy and limits to the result::

    with Harness("my_worker.py", gateway_stubs={"pricing/quote": {"price": 3}}) as h:
        result = h.run({"type": "orders", "data": {"command": "quote"}})
        assert result.ok, result.error
        print(result.outputs)

Like the node: worker code may import only the runner's safe standard
library subset, ``virtufin_worker`` and ``allowed_packages`` (empty by
default); a call longer than ``timeout`` (30 s) is killed and fails with
reason ``timeout``; starting the interpreter and loading the code may take
up to 60 s, as on the node; a runner that dies or times out is restarted
with the same code before the next event. The worker's stdout and stderr go to this
process's stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Union

from . import _process, _wire
from ._outputs import (
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_OUTPUTS,
    OUTPUT_INVALID,
    WORKER_FAILED,
    OutputPolicy,
    OutputRefused,
    check_outputs,
)
from .events import CloudEvent
from .gateway import encode_body

TIMEOUT = "timeout"
DEFAULT_TIMEOUT = 30.0
# How long starting the interpreter and loading the code may take: the
# node's own bound (engines/python DefaultLoadTimeout), so that a slow
# start on a busy machine fails here only where it would fail there.
LOAD_TIMEOUT = 60.0

GatewayStub = Union[Callable[[bytes], Any], Any]
"""A stub's answer: a JSON value (sent as JSON), bytes (sent as they are),
``{"$error": "message"}`` (the call fails with that message), or a callable
taking the request body and returning one of those."""


class HarnessError(Exception):
    """The harness could not run the worker (not the worker's fault)."""


@dataclass(frozen=True)
class WorkerError:
    """Why an event failed: the Python exception's type ("" for a problem
    the runner or the node found), message and worker traceback."""

    type: str
    message: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.type else self.message

    def to_json(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message, "traceback": self.traceback}


class LoadError(HarnessError):
    """The worker's code did not load (the node would refuse CreateWorker
    with INVALID_ARGUMENT); error has the runner's type, message and
    traceback."""

    def __init__(self, error: WorkerError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class Result:
    """The outcome of one event.

    ``ok``: ``outputs`` are the completed output events as the node would
    publish them. Not ok: ``error`` says why and ``reason`` is the node's
    name for it (``worker_failed``, ``output_policy``, ``output_limit``,
    ``output_invalid``, ``timeout``); the node would retry a
    ``worker_failed`` or ``timeout`` event and then dead-letter it, and
    dead-letters the ``output_*`` ones at once.
    """

    event_id: str
    ok: bool
    outputs: list[CloudEvent] = field(default_factory=list)
    error: WorkerError | None = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The CLI's JSON line for this result."""
        if self.ok:
            return {"event_id": self.event_id, "ok": True, "outputs": self.outputs}
        assert self.error is not None
        return {"event_id": self.event_id, "ok": False, "error": self.error.to_json(), "reason": self.reason}


@dataclass(frozen=True)
class GatewayCall:
    """A gateway call the worker made: target and request body."""

    service: str
    method: str
    body: bytes

    def json(self) -> Any:
        """The request body decoded as JSON."""
        return json.loads(self.body)


def read_source(path_or_source: str | os.PathLike[str] | bytes) -> tuple[bytes, str]:
    """The worker's code and a name for it: bytes and strings with a newline
    are source code; other strings and paths name a file."""
    if isinstance(path_or_source, bytes):
        return path_or_source, "<source>"
    if isinstance(path_or_source, str) and "\n" in path_or_source:
        return path_or_source.encode("utf-8"), "<source>"
    path = Path(path_or_source)
    try:
        return path.read_bytes(), str(path)
    except OSError as e:
        raise HarnessError(f"reading the worker {path}: {e.strerror or e}") from None


class Harness:
    """Runs one worker's code in the node's runner (see the module doc).

    ``path_or_source``: a file (str or path) or the code itself (bytes, or
    a str with a newline). ``gateway_stubs`` maps ``"service/method"`` to a
    :data:`GatewayStub`; a call without one fails with ``no stub for
    service/method``. The other arguments are the worker's and node's
    settings: ``worker_id``, ``topic`` (its input topic), ``allowed_outputs``
    (``allowed_output_topics`` patterns), ``topic_prefix`` (its tenant's
    prefix), ``allowed_packages`` (``PYTHON_ALLOWED_PACKAGES``),
    ``max_outputs`` / ``max_output_bytes`` (``MAX_OUTPUTS_PER_MESSAGE`` /
    ``MAX_OUTPUT_BYTES``), ``timeout`` in seconds, ``python`` (the
    interpreter; this one by default) and ``env`` (added to this process's
    environment, as the worker's ``Config.Env``).

    The code is loaded at once: :class:`LoadError` if it does not load.
    """

    def __init__(
        self,
        path_or_source: str | os.PathLike[str] | bytes,
        worker_id: str = "local",
        topic: str = "local",
        allowed_outputs: Iterable[str] | None = None,
        gateway_stubs: Mapping[str, GatewayStub] | None = None,
        *,
        topic_prefix: str = "",
        group: str = "",
        allowed_packages: Iterable[str] = (),
        max_outputs: int = DEFAULT_MAX_OUTPUTS,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.source, self.name = read_source(path_or_source)
        self.policy = OutputPolicy(
            worker_id=worker_id,
            topic=topic,
            allowed_outputs=tuple(allowed_outputs or ()),
            topic_prefix=topic_prefix,
            max_outputs=max_outputs,
            max_output_bytes=max_output_bytes,
        )
        self.gateway_stubs: dict[str, GatewayStub] = dict(gateway_stubs or {})
        self.gateway_calls: list[GatewayCall] = []
        self.timeout = timeout
        self.python = python or sys.executable
        if os.sep not in self.python:  # a command name: posix_spawn does not search PATH
            self.python = shutil.which(self.python) or self.python
        self._allowed_packages = ",".join(p.strip() for p in allowed_packages if p.strip())
        self._env = {
            **os.environ,
            **(env or {}),
            "VIRTUFIN_WORKER_ID": worker_id,
            "VIRTUFIN_WORKER_GROUP": group,
            "VIRTUFIN_WORKER_TOPIC": topic,
        }
        self._proc: _process.RunnerProcess | None = None
        self._closed = False
        self._start()

    # ------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        try:
            proc = _process.RunnerProcess(self.python, allowed_packages=self._allowed_packages, env=self._env)
        except OSError as e:
            raise HarnessError(f"starting {self.python}: {e}") from None
        deadline = time.monotonic() + max(self.timeout, LOAD_TIMEOUT)
        hello = False
        try:
            proc.send(_process.LOAD, self.source)
            kind, payload = proc.recv(deadline)
            if kind != _process.HELLO:
                raise HarnessError(f"protocol error: {chr(kind)!r} before the hello")
            hello = True
            kind, payload = proc.recv(deadline)
        except _process.ProcessDied as e:
            if hello:  # the worker's code ended the interpreter
                raise LoadError(WorkerError("", f"the interpreter exited while loading the code ({e.status})")) from None
            raise HarnessError(f"the runner ({self.python}) failed to start ({e.status})") from None
        except TimeoutError:
            proc.kill()
            raise LoadError(WorkerError("", "loading the code timed out")) from None
        except BaseException:
            proc.kill()
            raise
        if kind == _process.ERROR:
            proc.wait()
            raise LoadError(_worker_error(payload))
        if kind != _process.OK:
            proc.kill()
            raise HarnessError(f"protocol error: {chr(kind)!r} in answer to the load")
        self._proc = proc

    def close(self) -> None:
        """Stops the runner (EOF, then a kill after 2 s) and reaps it."""
        self._closed = True
        if self._proc is not None:
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> Harness:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None:
            try:
                self.close()
            except Exception:  # at interpreter exit: the runner exits at EOF anyway
                pass

    # ------------------------------------------------------------ events

    def run(self, event: Mapping[str, Any]) -> Result:
        """Processes one event as the node would; see :class:`Result`.
        Raises ValueError/TypeError for an event the node could not have
        received, HarnessError when the runner cannot be (re)started."""
        if self._closed:
            raise HarnessError("the harness is closed")
        wire = _wire.to_wire(event)
        payload = _wire.encode(wire)
        if self._proc is None:
            self._start()  # after a timeout or a crash, like the node
        proc = self._proc
        assert proc is not None
        event_id = wire["id"]
        deadline = time.monotonic() + self.timeout
        try:
            proc.send(_process.EVENT, payload)
            while True:
                kind, reply = proc.recv(deadline)
                if kind == _process.GATEWAY:
                    proc.send(_process.GATEWAY_REPLY, self._gateway(reply))
                elif kind == _process.RESULT:
                    break
                elif kind == _process.ERROR:
                    reason = OUTPUT_INVALID if _invalid_output(reply) else WORKER_FAILED
                    return Result(event_id, False, error=_worker_error(reply), reason=reason)
                else:
                    self._lose(proc)
                    raise HarnessError(f"protocol error: unexpected frame {chr(kind)!r}")
        except TimeoutError:
            self._lose(proc)
            return Result(
                event_id, False, error=WorkerError("", f"worker timed out after {self.timeout:g}s"), reason=TIMEOUT
            )
        except _process.ProcessDied as e:
            self._lose(proc)
            message = f"the worker process exited during the call ({e.status})"
            return Result(event_id, False, error=WorkerError("", message), reason=WORKER_FAILED)
        try:
            outputs = check_outputs(wire, json.loads(reply), self.policy)
        except OutputRefused as e:
            return Result(event_id, False, error=WorkerError("", e.message), reason=e.reason)
        return Result(event_id, True, outputs)

    def run_all(self, events: Iterable[Mapping[str, Any]]) -> list[Result]:
        """run for each event, in order."""
        return [self.run(e) for e in events]

    def _lose(self, proc: _process.RunnerProcess) -> None:
        proc.kill()
        self._proc = None

    def _gateway(self, request: bytes) -> bytes:
        """The answer to a gateway call: 0 + response, or 1 + error text."""
        head, _, body = request.partition(b"\n")
        try:
            target = json.loads(head)
            service, method = target["service"], target["method"]
        except (ValueError, KeyError, TypeError):
            return b"\x01malformed gateway call"
        self.gateway_calls.append(GatewayCall(service, method, body))
        key = f"{service}/{method}"
        if key not in self.gateway_stubs:
            return b"\x01no stub for " + key.encode()
        answer = self.gateway_stubs[key]
        try:
            if callable(answer):
                answer = answer(body)
            if isinstance(answer, Mapping) and set(answer) == {"$error"}:
                return b"\x01" + str(answer["$error"]).encode()
            return b"\x00" + encode_body(answer if isinstance(answer, (bytes, bytearray)) else json.dumps(answer))
        except Exception as e:  # a broken stub: the call fails, not the harness
            return f"\x01gateway stub {key}: {type(e).__name__}: {e}".encode()


def _invalid_output(payload: bytes) -> bool:
    """Whether the runner refused the call's outputs (not the worker's own
    exception): the node's ``output_invalid``."""
    try:
        return bool(json.loads(payload).get("invalid_output"))
    except (ValueError, AttributeError):
        return False


def _worker_error(payload: bytes) -> WorkerError:
    try:
        e = json.loads(payload)
        return WorkerError(str(e.get("type", "")), str(e.get("message", "")), str(e.get("traceback", "")))
    except (ValueError, AttributeError):
        return WorkerError("", payload.decode("utf-8", "replace"))


def load_stubs(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A gateway stub file: a JSON object ``{"service/method": response}``."""
    with open(path, encoding="utf-8") as f:
        stubs = json.load(f)
    if not isinstance(stubs, dict) or not all(isinstance(k, str) and "/" in k for k in stubs):
        raise ValueError('a stub file is a JSON object with "service/method" keys')
    return stubs
