"""The harness end to end: real worker files in the node's real runner,
then the node's output completion, policy and limits."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from virtufin_worker._outputs import source_tag
from virtufin_worker._wire import DEFAULT_SOURCE
from virtufin_worker.harness import Harness, HarnessError, LoadError
from virtufin_worker.testing import HarnessFactory

PLAIN = """
def process(event):
    return {"type": "orders.accepted", "data": {"id": event["data"]["id"]}}
"""

COMMAND = """
import enum
from typing import Any
from virtufin_worker import CommandWorker

class Command(enum.Enum):
    APPROVE = enum.auto()
    REJECT = enum.auto()

class Worker(CommandWorker[Command]):
    def handle(self, event, command, payload):
        if payload.get("explode"):
            raise RuntimeError("kaput")
        return self.response(event, {"done": command.name.lower(), "id": payload.get("id")})

process = Worker(Command, "orders.decided")
"""

ASYNC_COMMAND = """
import asyncio
import enum
from virtufin_worker import CommandWorker

class Command(enum.Enum):
    WAIT = enum.auto()

class Worker(CommandWorker[Command]):
    async def handle(self, event, command, payload):
        await asyncio.sleep(0.01)
        return self.response(event, {"waited": True})

process = Worker(Command, "waits.done")
"""

API = """
import enum
from virtufin_worker import ApiCommandWorker, GatewayError

class Command(enum.Enum):
    QUOTE = enum.auto()

class Worker(ApiCommandWorker[Command]):
    def handle(self, event, command, payload):
        quote = self.api.gateway.pricing.quote({"symbol": payload["symbol"]})
        return self.response(event, {"quote": quote, "target": self.api.target})

process = Worker(Command, "prices.quoted")
"""


def write(tmp_path: Path, source: str, name: str = "worker.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def event(data: Any = None, **extra: Any) -> dict[str, Any]:
    return {"type": "orders", "data": data, **extra}


def test_plain_worker_file(tmp_path: Path) -> None:
    with Harness(write(tmp_path, PLAIN), worker_id="w1", topic="orders") as h:
        result = h.run(event({"id": 7}, id="in-1", source="shop"))
    assert result.ok and result.error is None and result.reason is None
    assert result.event_id == "in-1"
    assert result.outputs == [
        {
            "specversion": "1.0",
            "id": "in-1/w1/0/" + source_tag("shop"),
            "source": "workmanager/workers/w1",
            "type": "orders.accepted",
            "datacontenttype": "application/json",
            "data": {"id": 7},
        }
    ]
    assert result.to_json() == {"event_id": "in-1", "ok": True, "outputs": result.outputs}


def test_input_defaults_like_the_node(tmp_path: Path) -> None:
    src = """
    def process(event):
        return {"type": "seen", "data": {k: event[k] for k in ("specversion", "id", "source", "type", "datacontenttype")}}
    """
    with Harness(write(tmp_path, src)) as h:
        result = h.run({"type": "t", "data": {}})
    seen = result.outputs[0]["data"]
    assert seen["specversion"] == "1.0" and seen["source"] == "local" and seen["type"] == "t"
    assert seen["datacontenttype"] == "application/json"
    assert len(seen["id"]) == 36 and seen["id"] == result.event_id


def test_data_kinds(tmp_path: Path) -> None:
    src = """
    def process(event):
        d = event["data"]
        return [{"type": "kind", "data": type(d).__name__}, {"type": "raw", "data": b"\\x00\\x01"}]
    """
    with Harness(write(tmp_path, src)) as h:
        assert h.run(event(b"\x01")).outputs[0]["data"] == "bytes"
        assert h.run(event("text")).outputs[0]["data"] == "str"
        assert h.run(event({"a": 1})).outputs[0]["data"] == "dict"
        outs = h.run(event({"a": 1}, datacontenttype="application/vnd.x+json")).outputs
        assert outs[0]["data"] == "dict"  # sent as text, decoded by the runner
        assert outs[1]["data_base64"] == "AAE=" and "data" not in outs[1]


def test_command_worker(tmp_path: Path) -> None:
    with Harness(write(tmp_path, COMMAND)) as h:
        ok = h.run(event({"command": "Approve", "id": 3}, id="e1"))
        unknown = h.run(event({"command": "ship"}, id="e2"))
        broken = h.run(event({"command": "reject", "explode": True}, id="e3"))
        text = h.run(event('{"command": "REJECT", "id": 4}', datacontenttype="text/plain"))
    assert ok.outputs[0]["type"] == "orders.decided"
    assert ok.outputs[0]["data"] == {"done": "approve", "id": 3}
    assert unknown.ok and unknown.outputs[0]["type"] == "orders.decided.error"
    assert unknown.outputs[0]["data"] == {"error": "Unknown command: ship", "input_id": "e2", "input_type": "orders"}
    assert broken.ok and broken.outputs[0]["data"]["error"] == "Internal error: RuntimeError: kaput"
    assert text.outputs[0]["data"] == {"done": "reject", "id": 4}


def test_async_handle_through_the_runner(tmp_path: Path) -> None:
    with Harness(write(tmp_path, ASYNC_COMMAND)) as h:
        result = h.run(event({"command": "wait"}, correlationid="c1"))
    assert result.outputs[0]["data"] == {"waited": True}
    assert result.outputs[0]["correlationid"] == "c1"


def test_async_plain_process(tmp_path: Path) -> None:
    src = """
    import asyncio
    async def process(event):
        await asyncio.sleep(0)
        return {"type": "done", "data": event["data"]}
    """
    with Harness(write(tmp_path, src)) as h:
        assert h.run(event([1])).outputs[0]["data"] == [1]


def test_api_command_worker_with_stubs(tmp_path: Path) -> None:
    stubs = {"pricing/quote": {"price": 42}}
    with Harness(write(tmp_path, API), gateway_stubs=stubs) as h:
        result = h.run(event({"command": "quote", "symbol": "ACME", "api_host": "prices", "api_port": 81}))
        assert result.ok, result.error
        assert result.outputs[0]["data"] == {"quote": {"price": 42}, "target": "prices:81"}
        assert [(c.service, c.method, c.json()) for c in h.gateway_calls] == [("pricing", "quote", {"symbol": "ACME"})]


def test_missing_stub_and_error_stub(tmp_path: Path) -> None:
    with Harness(write(tmp_path, API)) as h:
        out = h.run(event({"command": "quote", "symbol": "X"})).outputs[0]
    assert out["data"]["error"] == "Internal error: GatewayError: no stub for pricing/quote"
    stubs = {"pricing/quote": {"$error": "backend down"}}
    with Harness(write(tmp_path, API), gateway_stubs=stubs) as h:
        out = h.run(event({"command": "quote", "symbol": "X"})).outputs[0]
    assert out["data"]["error"] == "Internal error: GatewayError: backend down"


def test_raw_virtufin_host_and_callable_stub(tmp_path: Path) -> None:
    src = """
    import virtufin_host
    def process(event):
        return {"type": "r", "data": virtufin_host.call_gateway("echo", "upper", "abc").decode()}
    """
    stubs = {"echo/upper": lambda body: body.upper()}
    with Harness(write(tmp_path, src), gateway_stubs=stubs) as h:
        assert h.run(event()).outputs[0]["data"] == "ABC"


def test_gateway_error_is_the_hosts_inside_the_runner(tmp_path: Path) -> None:
    src = """
    import virtufin_host
    import virtufin_worker
    def process(event):
        return {"type": "r", "data": virtufin_worker.GatewayError is virtufin_host.GatewayError}
    """
    with Harness(write(tmp_path, src)) as h:
        assert h.run(event()).outputs[0]["data"] is True


def test_exception_fails_the_event(tmp_path: Path) -> None:
    src = """
    def process(event):
        if event["data"]["total"] < 0:
            raise ValueError("negative total")
        return None
    """
    with Harness(write(tmp_path, src)) as h:
        result = h.run(event({"total": -1}, id="bad"))
        assert h.run(event({"total": 1})).ok  # the runner keeps serving
    assert not result.ok and result.outputs == []
    assert result.reason == "worker_failed"
    assert result.error is not None
    assert (result.error.type, result.error.message) == ("ValueError", "negative total")
    assert 'raise ValueError("negative total")' in result.error.traceback
    assert result.to_json() == {
        "event_id": "bad",
        "ok": False,
        "error": {"type": "ValueError", "message": "negative total", "traceback": result.error.traceback},
        "reason": "worker_failed",
    }


def test_bad_output_from_the_runner(tmp_path: Path) -> None:
    src = """
    def process(event):
        return [{"type": "ok"}, {"data": 1}]
    """
    with Harness(write(tmp_path, src)) as h:
        result = h.run(event())
    assert result.reason == "output_invalid"
    assert result.error is not None and result.error.message == 'output 1: missing required attribute "type"'


def test_bad_extension_like_the_go_sdk(tmp_path: Path) -> None:
    src = """
    def process(event):
        return [{"type": "ok", "tenant": "a"}, {"type": "ok", "bad_name": "x"}]
    """
    with Harness(write(tmp_path, src)) as h:
        result = h.run(event())
    assert result.reason == "output_invalid"
    assert result.error is not None and result.error.message.startswith('output 1: bad key "bad_name"')


@pytest.mark.parametrize(
    "topic,reason_text",
    [
        ("workmanager.worker.error", 'topic "workmanager.worker.error" is reserved (workmanager.* and *-dead)'),
        ("orders-dead", 'topic "orders-dead" is reserved'),
        ("orders", 'topic "orders" is the worker\'s own input topic (a loop'),
    ],
)
def test_output_policy(tmp_path: Path, topic: str, reason_text: str) -> None:
    src = f"""
    def process(event):
        return [{{"type": "fine"}}, {{"type": {topic!r}}}]
    """
    with Harness(write(tmp_path, src), topic="orders") as h:
        result = h.run(event())
    assert not result.ok and result.reason == "output_policy"
    assert result.error is not None and result.error.message.startswith("output 1: " + reason_text)
    assert result.error.message.endswith("not allowed by the worker's policy")


def test_allowed_outputs_and_prefix(tmp_path: Path) -> None:
    src = """
    def process(event):
        return {"type": event["data"]}
    """
    path = write(tmp_path, src)
    with Harness(path, topic="acme.orders", allowed_outputs=["acme.orders", "acme.billing.*"], topic_prefix="acme.") as h:
        assert h.run(event("acme.orders")).ok  # listed: the loop is allowed
        assert h.run(event("acme.billing.due")).ok
        nested = h.run(event("acme.billing.due/x"))  # * stops at '/'
        other = h.run(event("acme.users"))
        outside = h.run(event("globex.orders"))
    assert nested.reason == other.reason == outside.reason == "output_policy"
    assert other.error is not None
    assert 'is not in allowed_output_topics ["acme.orders" "acme.billing.*"]' in other.error.message
    assert outside.error is not None and "outside the tenant's topics" in outside.error.message
    with pytest.raises(ValueError, match="reserved topic"):
        Harness(path, allowed_outputs=["workmanager.x"])


def test_correlation_id_copied_and_removed(tmp_path: Path) -> None:
    src = """
    def process(event):
        return [{"type": "a"}, {"type": "b", "correlationid": "made-up"}]
    """
    with Harness(write(tmp_path, src)) as h:
        copied = h.run(event(correlationid="corr-1"))
        removed = h.run(event())
    assert [o["correlationid"] for o in copied.outputs] == ["corr-1", "corr-1"]
    assert all("correlationid" not in o for o in removed.outputs)


def test_output_id_and_source_defaults_keep_the_workers(tmp_path: Path) -> None:
    src = """
    def process(event):
        return [{"type": "a", "id": "mine", "source": "urn:me"}, {"type": "b"}]
    """
    with Harness(write(tmp_path, src), worker_id="wx") as h:
        outs = h.run(event(id="in")).outputs
    assert (outs[0]["id"], outs[0]["source"]) == ("mine", "urn:me")
    assert (outs[1]["id"], outs[1]["source"]) == ("in/wx/1/" + source_tag(DEFAULT_SOURCE), "workmanager/workers/wx")


def test_too_many_outputs(tmp_path: Path) -> None:
    src = """
    def process(event):
        return [{"type": "o", "data": i} for i in range(event["data"])]
    """
    path = write(tmp_path, src)
    with Harness(path) as h:
        assert len(h.run(event(100)).outputs) == 100
        result = h.run(event(101))
    assert not result.ok and result.reason == "output_limit"
    assert result.error is not None and result.error.message == "101 outputs, more than MAX_OUTPUTS_PER_MESSAGE 100"
    with Harness(path, max_outputs=2) as h:
        assert h.run(event(3)).reason == "output_limit"


def test_too_many_output_bytes(tmp_path: Path) -> None:
    src = """
    def process(event):
        return {"type": "o", "data": "x" * event["data"], "datacontenttype": "text/plain"}
    """
    with Harness(write(tmp_path, src), max_output_bytes=10) as h:
        assert h.run(event(10)).ok
        result = h.run(event(11))
    assert result.reason == "output_limit"
    assert result.error is not None and result.error.message == "output 0: 11 bytes of data, more than MAX_OUTPUT_BYTES 10"


def test_default_output_bytes_limit(tmp_path: Path) -> None:
    src = """
    def process(event):
        return {"type": "o", "data": b"x" * event["data"]}
    """
    with Harness(write(tmp_path, src)) as h:
        assert h.run(event(1048576)).ok
        assert h.run(event(1048577)).reason == "output_limit"


def test_timeout_and_restart(tmp_path: Path) -> None:
    src = """
    import time
    def process(event):
        time.sleep(event["data"])
        return {"type": "slept"}
    """
    with Harness(write(tmp_path, src), timeout=0.5) as h:
        started = time.monotonic()
        result = h.run(event(30))
        assert time.monotonic() - started < 5
        assert result.reason == "timeout"
        assert result.error is not None and result.error.message == "worker timed out after 0.5s"
        assert h.run(event(0)).ok  # a new runner with the same code


def test_process_exit_and_restart(tmp_path: Path) -> None:
    src = """
    import os
    def process(event):
        if event["data"]:
            os._exit(3)
        return {"type": "alive"}
    """
    with Harness(write(tmp_path, src), allowed_packages=["os"]) as h:
        result = h.run(event(True))
        assert result.reason == "worker_failed"
        assert result.error is not None
        assert result.error.message == "the worker process exited during the call (exit status 3)"
        assert h.run(event(False)).ok


def test_guard_refuses_imports_like_the_node(tmp_path: Path) -> None:
    with pytest.raises(LoadError) as e:
        Harness(write(tmp_path, "import os\ndef process(event):\n    return None\n"))
    assert e.value.error.type == "ImportError"
    assert "import of 'os' is not allowed" in e.value.error.message
    assert e.value.error.message.endswith("(line 1)")


@pytest.mark.parametrize(
    "source,message",
    [
        ("def process(event)\n    pass\n", "SyntaxError"),
        ("x = 1\n", "the code defines no process(event) function"),
        ("def process(a, b):\n    pass\n", "process must accept exactly one argument"),
        ("from virtufin_worker import require\nrequire('9.0')\ndef process(e):\n    pass\n",
         "DevKitVersionError: this worker needs virtufin_worker >= 9.0; the node provides 0.1.0 (line 2)"),
    ],
)
def test_load_errors(source: str, message: str) -> None:
    with pytest.raises(LoadError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        Harness(source)


def test_exit_while_loading(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"^the interpreter exited while loading the code \(exit status 3\)$"):
        Harness("import os\nos._exit(3)\n", allowed_packages=["os"])


def test_python_by_name_and_missing_python() -> None:
    with Harness(PLAIN, python=Path(sys.executable).name) as h:
        assert h.python == shutil.which(Path(sys.executable).name)
        assert h.run(event({"id": 1})).ok
    with pytest.raises(HarnessError, match="starting /nonexistent/python"):
        Harness(PLAIN, python="/nonexistent/python")


def test_source_strings_and_missing_files(tmp_path: Path) -> None:
    with Harness(PLAIN) as h:
        assert h.run(event({"id": 1})).ok
    with Harness(PLAIN.encode()) as h:
        assert h.run(event({"id": 1})).ok
    with pytest.raises(HarnessError, match="reading the worker"):
        Harness(str(tmp_path / "nope.py"))


def test_bad_input_events(tmp_path: Path) -> None:
    with Harness(PLAIN) as h:
        with pytest.raises(ValueError, match='needs a "type"'):
            h.run({"data": {}})
        with pytest.raises(TypeError):
            h.run([1])  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="extension name"):
            h.run({"type": "t", "Bad-Name": "x"})
        h.close()
        with pytest.raises(HarnessError, match="closed"):
            h.run(event())


def test_environment(tmp_path: Path) -> None:
    src = """
    import os
    def process(event):
        return {"type": "env", "data": [os.environ.get(k) for k in (
            "VIRTUFIN_WORKER_ID", "VIRTUFIN_WORKER_TOPIC", "VIRTUFIN_WORKER_GROUP", "EXTRA")]}
    """
    with Harness(write(tmp_path, src), worker_id="w9", topic="in", group="g", allowed_packages=["os"], env={"EXTRA": "1"}) as h:
        assert h.run(event()).outputs[0]["data"] == ["w9", "in", "g", "1"]


def test_fixture_is_one_line(worker_harness: HarnessFactory, tmp_path: Path) -> None:
    write(tmp_path, PLAIN, "w.py")
    assert worker_harness(tmp_path / "w.py").run({"type": "t", "data": {"id": 5}}).outputs[0]["data"] == {"id": 5}


def test_fixture_finds_files_next_to_the_test(worker_harness: HarnessFactory) -> None:
    harness = worker_harness("workers/echo.py", gateway_stubs={"a/b": 1})
    assert harness.run({"type": "t", "data": "hi"}).outputs[0]["data"] == "hi"
    assert worker_harness.harnesses == [harness]


def test_factory_closes_its_harnesses() -> None:
    factory = HarnessFactory()
    harness = factory(PLAIN)
    factory.close()
    with pytest.raises(HarnessError, match="closed"):
        harness.run(event())
