"""CommandWorker: dispatches JSON commands to an Enum-typed handler.

An input's data is a JSON object with a ``command`` field; the command is
matched case-insensitively against the members of an :class:`enum.Enum`
(the wire name of a member is its name in lower case) and handed to
:meth:`CommandWorker.handle` as the member. Problems become error responses
(:meth:`WorkerBase.error`), never exceptions, so the sender always gets an
answer on ``<response_type>.error``:

========================================  =====================================
Input                                     Error message
========================================  =====================================
data not a JSON object (or no data)       ``Failed to parse command JSON``
no ``command`` field (or null)            ``Missing 'command' field``
a command that is no member               ``Unknown command: <command as sent>``
``handle`` raises                         ``Internal error: <Type>: <message>``
========================================  =====================================
"""

from __future__ import annotations

import enum
import inspect
import json
from abc import abstractmethod
from collections.abc import Awaitable, Mapping
from typing import Any, Generic, TypeVar, Union, cast

from .events import CloudEvent, Output
from .worker import ProcessResult, WorkerBase

E = TypeVar("E", bound=enum.Enum)

MISSING_COMMAND = "Missing 'command' field"
UNKNOWN_COMMAND = "Unknown command: {}"
BAD_JSON = "Failed to parse command JSON"
INTERNAL_ERROR = "Internal error: {}: {}"


class CommandError(Exception):
    """Raised by :meth:`CommandWorker.parse`; its message is the error
    response's."""


def internal_error(exc: BaseException) -> str:
    """The error message for an exception raised by a handler."""
    return INTERNAL_ERROR.format(type(exc).__name__, exc)


class CommandWorker(WorkerBase, Generic[E]):
    """A worker whose inputs are commands, named by the members of ``commands``.

    Subclasses implement :meth:`handle` (plain or ``async def``); its
    exceptions (``Exception`` subclasses) become ``Internal error: ...``
    error responses, so one bad command does not fail the event (no retry,
    no dead letter). Raise from :meth:`process` instead for errors that
    should fail the event.
    """

    def __init__(self, commands: type[E], response_type: str, source: str | None = None) -> None:
        super().__init__(response_type, source)
        if not (isinstance(commands, type) and issubclass(commands, enum.Enum)):
            raise TypeError(f"commands must be an Enum class, got {commands!r}")
        by_name: dict[str, E] = {}
        for name, member in commands.__members__.items():
            wire = name.lower()
            if wire in by_name and by_name[wire] is not member:
                raise ValueError(f"{commands.__name__}: members {name!r} and {by_name[wire].name!r} have the same wire name {wire!r}")
            by_name[wire] = member
        self.commands = commands
        self._by_name = by_name

    @staticmethod
    def wire_name(command: enum.Enum) -> str:
        """The name of a command on the wire: the member's name in lower case."""
        return command.name.lower()

    def parse(self, event: CloudEvent) -> tuple[E, dict[str, Any]]:
        """The command and the payload (the whole data object) of event.

        data may be a dict already (JSON datacontenttype) or JSON text
        (``str``/``bytes``). Raises :class:`CommandError`.
        """
        data = event.get("data")
        if isinstance(data, (str, bytes, bytearray)):
            try:
                data = json.loads(data)
            except ValueError:  # JSONDecodeError and UnicodeDecodeError
                raise CommandError(BAD_JSON) from None
        if not isinstance(data, Mapping):
            raise CommandError(BAD_JSON)
        payload = dict(data)
        sent = payload.get("command")
        if sent is None:
            raise CommandError(MISSING_COMMAND)
        command = self._by_name.get(sent.lower()) if isinstance(sent, str) else None
        if command is None:
            raise CommandError(UNKNOWN_COMMAND.format(sent if isinstance(sent, str) else json.dumps(sent)))
        return command, payload

    def process(self, event: CloudEvent) -> ProcessResult:
        """Parses the command and calls :meth:`handle`; returns an
        awaitable when handle is ``async def``."""
        try:
            command, payload = self.parse(event)
            self.prepare(event, command, payload)
        except CommandError as e:
            return self.error(event, str(e))
        try:
            result = self.handle(event, command, payload)
        except Exception as e:
            return self.error(event, internal_error(e))
        if inspect.isawaitable(result):
            return self._finish(event, result)
        return cast(Output, result)

    async def _finish(self, event: CloudEvent, pending: Awaitable[Output]) -> Output:
        try:
            return await pending
        except Exception as e:
            return self.error(event, internal_error(e))

    def prepare(self, event: CloudEvent, command: E, payload: dict[str, Any]) -> None:
        """Called before :meth:`handle`; may raise :class:`CommandError`
        (subclasses use it to read shared payload fields)."""

    @abstractmethod
    def handle(
        self, event: CloudEvent, command: E, payload: dict[str, Any]
    ) -> Union[Output, Awaitable[Output]]:
        """Handles one command; payload is the input's data object
        (``command`` included). Plain or ``async def``."""
