"""ApiWorker and ApiCommandWorker: workers with an :class:`ApiClient`.

``self.api.gateway.<service>.<method>(payload)`` calls a backend through the
node (see :mod:`virtufin_worker.gateway`). An ApiCommandWorker also reads
``api_host`` / ``api_port`` from each command's payload and sets them on
``self.api`` before calling ``handle``; an invalid value is an error
response (``Invalid 'api_port' field: ...``). They are recorded only: in
WorkManager the node routes gateway calls by service name.
"""

from __future__ import annotations

from typing import Any

from .commands import CommandError, CommandWorker, E
from .events import CloudEvent
from .gateway import ApiClient
from .worker import WorkerBase


class ApiWorker(WorkerBase):
    """A :class:`WorkerBase` with ``self.api``, an :class:`ApiClient`
    (pass ``api=ApiClient(gateway=stub)`` to test it outside the runner)."""

    def __init__(
        self, response_type: str, source: str | None = None, *, api: ApiClient | None = None
    ) -> None:
        super().__init__(response_type, source)
        self.api = api if api is not None else ApiClient()


class ApiCommandWorker(CommandWorker[E]):
    """A :class:`CommandWorker` with ``self.api``, an :class:`ApiClient`,
    configured from ``api_host``/``api_port`` in each command's payload."""

    def __init__(
        self,
        commands: type[E],
        response_type: str,
        source: str | None = None,
        *,
        api: ApiClient | None = None,
    ) -> None:
        super().__init__(commands, response_type, source)
        self.api = api if api is not None else ApiClient()

    def prepare(self, event: CloudEvent, command: E, payload: dict[str, Any]) -> None:
        for field in ("api_host", "api_port"):
            try:
                self.api.configure(**{field[4:]: payload.get(field)})
            except ValueError:
                raise CommandError(f"Invalid {field!r} field: {payload.get(field)!r}") from None
