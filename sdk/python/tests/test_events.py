"""CloudEvent helpers and WorkerBase's response/error helpers."""

from __future__ import annotations

import pytest

from virtufin_worker import CloudEvent, WorkerBase, new_event, with_correlation_id
from virtufin_worker.worker import ProcessResult

INPUT = {"specversion": "1.0", "id": "e1", "source": "s", "type": "orders", "data": {"x": 1}}


class Echo(WorkerBase):
    def process(self, event: CloudEvent) -> ProcessResult:
        return self.response(event, event.get("data"))


def test_new_event_omits_none() -> None:
    assert new_event("t") == {"type": "t"}
    assert new_event("t", {"a": 1}, source="src", subject=None, tenant="acme", other=None) == {
        "type": "t",
        "source": "src",
        "tenant": "acme",
        "data": {"a": 1},
    }
    assert new_event("t", 0)["data"] == 0  # falsy data is data


def test_new_event_checks_type_and_extension_names() -> None:
    with pytest.raises(ValueError):
        new_event("")
    with pytest.raises(ValueError, match="extension name"):
        new_event("t", tenant_id="x")


def test_with_correlation_id() -> None:
    out = new_event("t")
    assert with_correlation_id({**INPUT, "correlationid": "c-7"}, out) is out
    assert out["correlationid"] == "c-7"
    assert with_correlation_id(INPUT, new_event("t")) == {"type": "t"}


def test_response() -> None:
    worker = Echo("orders.done")
    assert worker.response(INPUT, {"ok": True}) == {"type": "orders.done", "data": {"ok": True}}
    sourced = Echo("orders.done", source="urn:me")
    out = sourced.response({**INPUT, "correlationid": "c1"}, [1])
    assert out == {"type": "orders.done", "source": "urn:me", "correlationid": "c1", "data": [1]}


def test_error() -> None:
    out = Echo("orders.done").error({**INPUT, "correlationid": "c1"}, "no stock")
    assert out == {
        "type": "orders.done.error",
        "correlationid": "c1",
        "data": {"error": "no stock", "input_id": "e1", "input_type": "orders"},
    }
    assert "correlationid" not in Echo("r").error(INPUT, "x")


def test_call_is_process() -> None:
    worker = Echo("r")
    assert worker(INPUT) == {"type": "r", "data": {"x": 1}}


def test_response_type_required() -> None:
    with pytest.raises(ValueError):
        Echo("")
    with pytest.raises(TypeError):
        WorkerBase("r")  # type: ignore[abstract]
