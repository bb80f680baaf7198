"""ApiClient: calls backend services through the node's gateway.

A worker process has no network. Inside the WorkManager runner, the module
``virtufin_host`` (injected by the runner) offers ``call_gateway(service,
method, data)``: the node calls ``method`` of ``service`` (a Dapr app id)
by Dapr service invocation, under the worker's ``allowed_gateway_targets``,
and hands back the response body. :class:`ApiClient` wraps that:

    api.gateway.pricing.quote({"symbol": "ACME"})    # -> decoded JSON
    api.call("pricing-service", "quote", {...})       # any service name

Outside the runner (unit tests, tools) a :class:`Gateway` object is
injected instead: ``ApiClient(gateway=stub)``.

``host`` and ``port`` (``api_host``/``api_port`` in a command's payload,
defaults ``localhost`` and 5002) are recorded on the client (``api.host``,
``api.port``, ``api.target``) for code that wants them, but they do not
change routing in WorkManager: the node routes every call by its service
name, and ``call_gateway`` has no parameter to pass them on.
"""

from __future__ import annotations

import importlib
import json
from typing import TYPE_CHECKING, Any, Protocol

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 5002

if TYPE_CHECKING:

    class GatewayError(Exception):
        """A gateway call failed: refused by the policy, unreachable, or
        the backend answered an error; the message says which."""

else:

    class GatewayError(Exception):
        """A gateway call failed: refused by the policy, unreachable, or
        the backend answered an error; the message says which."""

    def _host_error() -> Any:
        try:
            return importlib.import_module("virtufin_host").GatewayError
        except (ImportError, AttributeError):
            return None

    # Inside the runner, the error virtufin_host raises is the one to catch.
    GatewayError = _host_error() or GatewayError


class Gateway(Protocol):
    """What :class:`ApiClient` calls outside the runner (tests, tools)."""

    def call(self, service: str, method: str, body: bytes) -> bytes:
        """Calls method of service with body and returns the response body;
        raises :class:`GatewayError` on failure."""
        ...


def encode_body(payload: Any) -> bytes:
    """A request body: bytes as they are, str as UTF-8, None as nothing,
    anything else as compact JSON."""
    if payload is None:
        return b""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode("utf-8")
    return json.dumps(payload, separators=(",", ":")).encode("utf-8")


def decode_body(body: bytes) -> Any:
    """A response body: its JSON value when it parses, else its text."""
    text = body.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


class GatewayMethod:
    """``api.gateway.<service>.<method>``: call it with the payload."""

    __slots__ = ("_client", "service", "method")

    def __init__(self, client: ApiClient, service: str, method: str) -> None:
        self._client = client
        self.service = service
        self.method = method

    def __call__(self, payload: Any = None) -> Any:
        return self._client.call(self.service, self.method, payload)

    def __repr__(self) -> str:
        return f"<gateway method {self.service}/{self.method}>"


class GatewayService:
    """``api.gateway.<service>``: its methods are attributes (or items,
    for names that are no identifiers)."""

    __slots__ = ("_client", "service")

    def __init__(self, client: ApiClient, service: str) -> None:
        self._client = client
        self.service = service

    def __getattr__(self, method: str) -> GatewayMethod:
        if method.startswith("__"):
            raise AttributeError(method)
        return GatewayMethod(self._client, self.service, method)

    def __getitem__(self, method: str) -> GatewayMethod:
        return GatewayMethod(self._client, self.service, method)

    def __repr__(self) -> str:
        return f"<gateway service {self.service}>"


class GatewayServices:
    """``api.gateway``: services are attributes, or items
    (``api.gateway["pricing-service"]``)."""

    __slots__ = ("_client",)

    def __init__(self, client: ApiClient) -> None:
        self._client = client

    def __getattr__(self, service: str) -> GatewayService:
        if service.startswith("__"):
            raise AttributeError(service)
        return GatewayService(self._client, service)

    def __getitem__(self, service: str) -> GatewayService:
        return GatewayService(self._client, service)


class ApiClient:
    """Calls backends through the node (inside the runner) or through an
    injected :class:`Gateway` (elsewhere)."""

    def __init__(
        self,
        gateway: Gateway | None = None,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
    ) -> None:
        self._gateway = gateway
        self.host = host
        self.port = port
        self.gateway = GatewayServices(self)

    @property
    def target(self) -> str:
        """``host:port``, the target hint (it does not change routing)."""
        return f"{self.host}:{self.port}"

    def configure(self, host: Any = None, port: Any = None) -> None:
        """Sets host and/or port (None keeps the current value); a port
        may be given as an int or a decimal string. Raises ValueError."""
        if host is not None:
            if not isinstance(host, str) or not host:
                raise ValueError(f"api_host must be a non-empty string, got {host!r}")
            self.host = host
        if port is not None:
            try:
                number = int(port) if isinstance(port, (int, str)) and not isinstance(port, bool) else -1
            except ValueError:
                number = -1
            if not 0 < number < 65536:
                raise ValueError(f"api_port must be a port number (1-65535), got {port!r}")
            self.port = number

    def call_raw(self, service: str, method: str, payload: Any = None) -> bytes:
        """Calls method of service with payload (see :func:`encode_body`)
        and returns the raw response body. Raises :class:`GatewayError`."""
        if not isinstance(service, str) or not service or not isinstance(method, str) or not method:
            raise GatewayError("service and method must be non-empty strings")
        body = encode_body(payload)
        if self._gateway is not None:
            return bytes(self._gateway.call(service, method, body))
        try:
            host = importlib.import_module("virtufin_host")
        except ImportError:
            raise GatewayError(
                f"no gateway for {service}/{method}: virtufin_host exists only inside the "
                "WorkManager runner; elsewhere pass ApiClient(gateway=...)"
            ) from None
        return bytes(host.call_gateway(service, method, body))

    def call(self, service: str, method: str, payload: Any = None) -> Any:
        """Like :meth:`call_raw`, with the response decoded
        (:func:`decode_body`: JSON when it parses, else text)."""
        return decode_body(self.call_raw(service, method, payload))
