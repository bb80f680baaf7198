"""ApiClient and the Api workers against an injected stub gateway."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest

from virtufin_worker import (
    ApiClient,
    ApiCommandWorker,
    ApiWorker,
    CloudEvent,
    GatewayError,
    Output,
)
from virtufin_worker.gateway import decode_body, encode_body


class StubGateway:
    """Answers from a dict; records the calls."""

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, bytes]] = []

    def call(self, service: str, method: str, body: bytes) -> bytes:
        self.calls.append((service, method, body))
        try:
            return self.answers[f"{service}/{method}"]
        except KeyError:
            raise GatewayError(f"no stub for {service}/{method}") from None


class Command(enum.Enum):
    QUOTE = enum.auto()
    WHERE = enum.auto()


class Pricing(ApiCommandWorker[Command]):
    def handle(self, event: CloudEvent, command: Command, payload: dict[str, Any]) -> Output:
        if command is Command.WHERE:
            return self.response(event, {"target": self.api.target})
        quote = self.api.gateway.pricing.quote({"symbol": payload["symbol"]})
        return self.response(event, {"quote": quote})


def event(data: Any) -> CloudEvent:
    return {"id": "e1", "type": "prices", "data": data}


def test_api_command_worker_calls_the_gateway() -> None:
    stub = StubGateway({"pricing/quote": b'{"price": 42}'})
    worker = Pricing(Command, "prices.response", api=ApiClient(gateway=stub))
    out = worker(event({"command": "quote", "symbol": "ACME"}))
    assert out == {"type": "prices.response", "data": {"quote": {"price": 42}}}
    assert stub.calls == [("pricing", "quote", b'{"symbol":"ACME"}')]


def test_gateway_error_becomes_an_internal_error_response() -> None:
    worker = Pricing(Command, "prices.response", api=ApiClient(gateway=StubGateway({})))
    out: Any = worker(event({"command": "quote", "symbol": "ACME"}))
    assert out["type"] == "prices.response.error"
    assert out["data"]["error"] == "Internal error: GatewayError: no stub for pricing/quote"


def test_api_host_and_port_from_the_payload() -> None:
    worker = Pricing(Command, "r", api=ApiClient(gateway=StubGateway({})))
    assert (worker.api.host, worker.api.port) == ("localhost", 5002)
    out: Any = worker(event({"command": "where", "api_host": "pricing.internal", "api_port": "8080"}))
    assert out["data"] == {"target": "pricing.internal:8080"}
    assert (worker.api.host, worker.api.port) == ("pricing.internal", 8080)
    out = worker(event({"command": "where", "api_port": 9000}))
    assert out["data"] == {"target": "pricing.internal:9000"}


@pytest.mark.parametrize("field,value", [("api_port", "http"), ("api_port", 0), ("api_port", True), ("api_host", "")])
def test_bad_api_host_or_port(field: str, value: Any) -> None:
    worker = Pricing(Command, "r", api=ApiClient(gateway=StubGateway({})))
    out: Any = worker(event({"command": "where", field: value}))
    assert out["data"]["error"] == f"Invalid {field!r} field: {value!r}"


def test_services_and_methods_by_item() -> None:
    stub = StubGateway({"pricing-service/v1/quote": b"plain text"})
    api = ApiClient(gateway=stub)
    assert api.gateway["pricing-service"]["v1/quote"]("x") == "plain text"
    assert api.call_raw("pricing-service", "v1/quote") == b"plain text"
    assert stub.calls[0] == ("pricing-service", "v1/quote", b"x")
    assert stub.calls[1] == ("pricing-service", "v1/quote", b"")


def test_api_worker_has_a_client() -> None:
    class Plain(ApiWorker):
        def process(self, event: CloudEvent) -> Output:
            return self.response(event, self.api.gateway.users.get(event["data"]))

    stub = StubGateway({"users/get": b'["ada"]'})
    assert Plain("r", api=ApiClient(gateway=stub))(event({"id": 1})) == {"type": "r", "data": ["ada"]}
    assert stub.calls == [("users", "get", b'{"id":1}')]


def test_without_gateway_outside_the_runner() -> None:
    with pytest.raises(GatewayError, match="only inside the WorkManager runner"):
        ApiClient().gateway.pricing.quote({})
    with pytest.raises(GatewayError, match="non-empty"):
        ApiClient(gateway=StubGateway({})).call("", "m")


def test_body_codec() -> None:
    assert encode_body(None) == b""
    assert encode_body(b"\x00") == b"\x00"
    assert encode_body("é") == "é".encode()
    assert encode_body({"a": [1, 2]}) == b'{"a":[1,2]}'
    assert encode_body(3) == b"3"
    assert decode_body(b'{"a": 1}') == {"a": 1}
    assert decode_body(b"not json") == "not json"
    assert decode_body(b"") == ""
    assert json.loads(encode_body([True])) == [True]
