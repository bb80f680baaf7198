"""CommandWorker: parsing, case-insensitive matching, error responses,
async handlers, correlation ids."""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Awaitable
from typing import Any

import pytest

from virtufin_worker import CloudEvent, CommandWorker, Output


class Command(enum.Enum):
    START = "begin"  # the wire name is the member's name, not its value
    stop = "halt"


class Worker(CommandWorker[Command]):
    def __init__(self) -> None:
        super().__init__(Command, "jobs.response")
        self.seen: list[tuple[Command, dict[str, Any]]] = []

    def handle(self, event: CloudEvent, command: Command, payload: dict[str, Any]) -> Output:
        self.seen.append((command, payload))
        if payload.get("explode"):
            raise KeyError("nope")
        return self.response(event, {"did": command.name})


class AsyncWorker(CommandWorker[Command]):
    async def handle(self, event: CloudEvent, command: Command, payload: dict[str, Any]) -> Output:
        await asyncio.sleep(0)
        if payload.get("explode"):
            raise ValueError("late boom")
        return [self.response(event, {"did": command.name}), self.response(event, {"n": 2})]


def event(data: Any, **extra: Any) -> CloudEvent:
    return {"specversion": "1.0", "id": "e1", "source": "s", "type": "jobs", "data": data, **extra}


def run(worker: CommandWorker[Command], ev: CloudEvent) -> Any:
    result = worker(ev)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(result: Awaitable[Output]) -> Output:
    return await result


def error_of(out: Any) -> str:
    assert out["type"] == "jobs.response.error", out
    return str(out["data"]["error"])


@pytest.mark.parametrize("sent", ["START", "Start", "start", "sTaRt"])
def test_matches_member_names_case_insensitively(sent: str) -> None:
    worker = Worker()
    out = run(worker, event({"command": sent, "n": 1}))
    assert out == {"type": "jobs.response", "data": {"did": "START"}}
    assert worker.seen == [(Command.START, {"command": sent, "n": 1})]


def test_lower_case_member() -> None:
    worker = Worker()
    assert run(worker, event({"command": "STOP"}))["data"] == {"did": "stop"}
    assert CommandWorker.wire_name(Command.START) == "start"


@pytest.mark.parametrize(
    "data",
    [{"command": "start"}, '{"command": "start"}', b'{"command": "start"}', bytearray(b'{"command":"Start"}')],
)
def test_data_dict_or_json_text(data: Any) -> None:
    assert run(Worker(), event(data))["data"] == {"did": "START"}


def test_missing_command() -> None:
    assert error_of(run(Worker(), event({"n": 1}))) == "Missing 'command' field"
    assert error_of(run(Worker(), event({"command": None}))) == "Missing 'command' field"


def test_unknown_command() -> None:
    assert error_of(run(Worker(), event({"command": "Dance"}))) == "Unknown command: Dance"
    assert error_of(run(Worker(), event({"command": "begin"}))) == "Unknown command: begin"
    assert error_of(run(Worker(), event({"command": 5}))) == "Unknown command: 5"


@pytest.mark.parametrize("data", ["{not json", b"\xff\xfe", "[1, 2]", '"start"', "null", [1], 7, None])
def test_unparseable_or_not_an_object(data: Any) -> None:
    assert error_of(run(Worker(), event(data))) == "Failed to parse command JSON"


def test_handle_exception_is_an_internal_error_response() -> None:
    out = run(Worker(), event({"command": "start", "explode": True}))
    assert error_of(out) == "Internal error: KeyError: 'nope'"
    assert out["data"]["input_id"] == "e1" and out["data"]["input_type"] == "jobs"


def test_error_response_keeps_correlation_id() -> None:
    out = run(Worker(), event({"command": "x"}, correlationid="c9"))
    assert out["correlationid"] == "c9"
    assert "correlationid" not in run(Worker(), event({"command": "x"}))


def test_response_keeps_correlation_id() -> None:
    assert run(Worker(), event({"command": "start"}, correlationid="c9"))["correlationid"] == "c9"
    assert "correlationid" not in run(Worker(), event({"command": "start"}))


def test_async_handle() -> None:
    worker = AsyncWorker(Command, "jobs.response")
    result = worker(event({"command": "stop"}, correlationid="c2"))
    assert inspect.isawaitable(result)
    outs = asyncio.run(_await(result))
    assert outs == [
        {"type": "jobs.response", "correlationid": "c2", "data": {"did": "stop"}},
        {"type": "jobs.response", "correlationid": "c2", "data": {"n": 2}},
    ]


def test_async_handle_exception_and_errors_are_not_awaitable() -> None:
    worker = AsyncWorker(Command, "jobs.response")
    assert error_of(run(worker, event({"command": "start", "explode": True}))) == "Internal error: ValueError: late boom"
    parse_error = worker(event({"nope": 1}))
    assert not inspect.isawaitable(parse_error)
    assert error_of(parse_error) == "Missing 'command' field"


def test_commands_must_be_an_enum() -> None:
    with pytest.raises(TypeError, match="Enum class"):
        AsyncWorker(dict, "r")  # type: ignore[arg-type]


def test_clashing_wire_names() -> None:
    Clash = enum.Enum("Clash", ["GO", "go"])
    with pytest.raises(ValueError, match="same wire name"):
        AsyncWorker(Clash, "r")  # type: ignore[arg-type]
