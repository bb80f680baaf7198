"""WorkerBase: a worker object usable as the engine's ``process``.

A module exposing ``process = MyWorker("my.response")`` works with the
runner as is: the object is called with each event, and whatever its
``process`` method returns (outputs, or an awaitable of outputs for an
``async def process``) goes back to the runner, which awaits awaitables on
its persistent event loop.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable
from typing import Any, Union

from .events import CloudEvent, Output, new_event, with_correlation_id

ProcessResult = Union[Output, Awaitable[Output]]
"""What a worker's ``process`` returns: outputs, or an awaitable of them."""

ERROR_SUFFIX = ".error"
"""Appended to the response type for error responses."""


class WorkerBase(ABC):
    """Base class of worker objects: subclasses override :meth:`process`.

    ``response_type`` is the type (the topic) of the worker's responses;
    error responses get ``response_type + ".error"``. ``source``, when
    given, is set on every response (otherwise the node fills in
    ``workmanager/workers/<worker id>``).
    """

    def __init__(self, response_type: str, source: str | None = None) -> None:
        if not isinstance(response_type, str) or not response_type:
            raise ValueError("response_type must be a non-empty string")
        self.response_type = response_type
        self.source = source

    def __call__(self, event: CloudEvent) -> ProcessResult:
        """The engine's entry point: returns ``self.process(event)``."""
        return self.process(event)

    @abstractmethod
    def process(self, event: CloudEvent) -> ProcessResult:
        """Handles one event; may be ``async def``."""

    def response(self, input: CloudEvent, data: Any) -> CloudEvent:
        """A response to input: type ``response_type``, the given data,
        ``source`` if set, and the input's correlation id."""
        return with_correlation_id(input, new_event(self.response_type, data, source=self.source))

    def error(self, input: CloudEvent, message: str) -> CloudEvent:
        """An error response to input, an ordinary output event:

        type ``response_type + ".error"``, data ``{"error": message,
        "input_id": <input id>, "input_type": <input type>}``, ``source``
        if set, and the input's correlation id.
        """
        data = {"error": message, "input_id": input.get("id"), "input_type": input.get("type")}
        return with_correlation_id(
            input, new_event(self.response_type + ERROR_SUFFIX, data, source=self.source)
        )
