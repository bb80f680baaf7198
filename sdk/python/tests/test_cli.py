"""The command line in subprocesses: run (JSON lines, exit codes) and new
(each template passes its own generated test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from conftest import subprocess_env
from virtufin_worker._outputs import source_tag
from virtufin_worker._wire import DEFAULT_SOURCE

import virtufin_worker

NODE_PYTHON = "/root/.pyenv/versions/3.11.7/bin/python3"  # the node's interpreter on the dev VM


def cli(*args: str, cwd: Path | None = None, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "virtufin_worker", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        env=subprocess_env(**env),
        timeout=120,
    )


def plugin_installed() -> bool:
    """Whether pytest loads the fixture by itself (the package's pytest11
    entry point is installed); then -p would register it twice."""
    return any(ep.name == "virtufin_worker" for ep in entry_points(group="pytest11"))


def lines(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stdout.splitlines()]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def plain(tmp_path: Path) -> Path:
    return write(
        tmp_path / "worker.py",
        """
        def process(event):
            print("worker output goes to stderr")
            if event["data"].get("fail"):
                raise RuntimeError("asked to fail")
            return [{"type": event["data"].get("to", "out"), "data": event["data"]}] * event["data"].get("n", 1)
        """,
    )


def test_run_one_event(plain: Path, tmp_path: Path) -> None:
    event = write(tmp_path / "event.json", '{"type": "in", "id": "e1", "correlationid": "c1", "data": {"x": 1}}')
    proc = cli("run", str(plain), "--event", str(event), "--worker-id", "w7")
    assert proc.returncode == 0, proc.stderr
    assert lines(proc) == [
        {
            "event_id": "e1",
            "ok": True,
            "outputs": [
                {
                    "specversion": "1.0",
                    "id": "e1/w7/0/" + source_tag(DEFAULT_SOURCE),
                    "source": "workmanager/workers/w7",
                    "type": "out",
                    "datacontenttype": "application/json",
                    "correlationid": "c1",
                    "data": {"x": 1},
                }
            ],
        }
    ]
    assert "worker output goes to stderr" in proc.stderr


def test_run_events_file_with_a_failure(plain: Path, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"type": "in", "id": "a", "data": {}}\n\n'
        '{"type": "in", "id": "b", "data": {"fail": true}}\n'
        '{"type": "in", "id": "c", "data": {"to": "workmanager.x"}}\n'
        '{"type": "in", "id": "d", "data": {"n": 3}}\n'
    )
    proc = cli("run", str(plain), "--events", str(events), MAX_OUTPUTS_PER_MESSAGE="2")
    assert proc.returncode == 1, proc.stderr
    results = lines(proc)
    assert [r["event_id"] for r in results] == ["a", "b", "c", "d"]
    assert [r["ok"] for r in results] == [True, False, False, False]
    assert results[1]["reason"] == "worker_failed"
    assert results[1]["error"]["type"] == "RuntimeError" and results[1]["error"]["message"] == "asked to fail"
    assert "Traceback" in results[1]["error"]["traceback"]
    assert results[2]["reason"] == "output_policy"
    assert results[3]["reason"] == "output_limit"
    assert results[3]["error"]["message"] == "3 outputs, more than MAX_OUTPUTS_PER_MESSAGE 2"


def test_run_topic_and_allowed_outputs(plain: Path) -> None:
    loop = '{"type": "orders", "data": {"to": "orders"}}'
    refused = cli("run", str(plain), "--event", "-", "--topic", "orders", stdin=loop)
    assert refused.returncode == 1 and lines(refused)[0]["reason"] == "output_policy"
    allowed = cli("run", str(plain), "--event", "-", "--topic", "orders", "--allowed-outputs", "orders,billing.*", stdin=loop)
    assert allowed.returncode == 0, allowed.stdout


def test_run_gateway_stub(tmp_path: Path) -> None:
    worker = write(
        tmp_path / "api.py",
        """
        import enum
        from virtufin_worker import ApiCommandWorker

        class Command(enum.Enum):
            QUOTE = enum.auto()

        class Worker(ApiCommandWorker[Command]):
            def handle(self, event, command, payload):
                return self.response(event, self.api.gateway.pricing.quote(payload["symbol"]))

        process = Worker(Command, "quoted")
        """,
    )
    stubs = write(tmp_path / "stubs.json", '{"pricing/quote": {"price": 12.5}}')
    event = write(tmp_path / "e.json", '{"type": "q", "data": {"command": "Quote", "symbol": "ACME"}}')
    proc = cli("run", str(worker), "--event", str(event), "--gateway-stub", str(stubs))
    assert proc.returncode == 0, proc.stderr
    assert lines(proc)[0]["outputs"][0]["data"] == {"price": 12.5}


def test_run_load_error_exits_2(tmp_path: Path) -> None:
    worker = write(tmp_path / "bad.py", "import socket\ndef process(e):\n    return None\n")
    event = write(tmp_path / "e.json", '{"type": "t"}')
    proc = cli("run", str(worker), "--event", str(event))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "the code does not load: ImportError: import of 'socket' is not allowed" in proc.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--event", "missing.json"], "missing.json"),
        (["--event", "broken.json"], "invalid JSON"),
        (["--event", "typeless.json"], 'needs a "type"'),
        ([], "no events"),
        (["--event", "ok.json", "--allowed-outputs", "["], "pattern"),
        (["--event", "ok.json", "--gateway-stub", "typeless.json"], "service/method"),
    ],
)
def test_run_usage_errors_exit_2(plain: Path, tmp_path: Path, args: list[str], message: str) -> None:
    write(tmp_path / "broken.json", "{")
    write(tmp_path / "typeless.json", '{"data": 1}')
    write(tmp_path / "ok.json", '{"type": "t", "data": {}}')
    proc = cli("run", str(plain), *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr


def test_run_missing_worker_and_bad_arguments(tmp_path: Path) -> None:
    assert cli("run", str(tmp_path / "nope.py"), "--event", "-", stdin='{"type": "t"}').returncode == 2
    assert cli("run").returncode == 2
    assert cli("frobnicate").returncode == 2


@pytest.mark.skipif(not os.path.exists(NODE_PYTHON), reason="the node's interpreter is not installed here")
def test_run_on_the_nodes_python(tmp_path: Path) -> None:
    worker = write(
        tmp_path / "w.py",
        """
        import enum
        from virtufin_worker import CommandWorker

        class Command(enum.Enum):
            PING = enum.auto()

        class Worker(CommandWorker[Command]):
            async def handle(self, event, command, payload):
                return self.response(event, {"pong": True})

        process = Worker(Command, "pong")
        """,
    )
    event = '{"type": "t", "data": {"command": "ping"}}'
    # The worker on the node's interpreter, the harness on this one...
    proc = cli("run", str(worker), "--event", "-", "--python", NODE_PYTHON, stdin=event)
    assert proc.returncode == 0, proc.stderr
    assert lines(proc)[0]["outputs"][0]["data"] == {"pong": True}
    # ...and the harness itself on the node's interpreter.
    proc = subprocess.run(
        [NODE_PYTHON, "-m", "virtufin_worker", "run", str(worker), "--event", "-"],
        input=event, capture_output=True, text=True, env=subprocess_env(), timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert lines(proc)[0]["outputs"][0]["data"] == {"pong": True}


def test_version() -> None:
    proc = cli("version")
    assert proc.returncode == 0 and proc.stdout.strip() == virtufin_worker.__version__


@pytest.mark.parametrize("kind", ["plain", "command", "api"])
def test_new_passes_its_own_test(tmp_path: Path, kind: str) -> None:
    proc = cli("new", f"my-{kind}-worker", "--kind", kind, "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    project = tmp_path / f"my-{kind}-worker"
    expected = {"worker.py", "test_worker.py", "event.json"} | ({"stubs.json"} if kind == "api" else set())
    assert {p.name for p in project.iterdir()} == expected
    assert f"my-{kind}-worker." in (project / "worker.py").read_text()

    # Not installed: load the plugin as its pytest11 entry point would.
    plugin = [] if plugin_installed() else ["-p", "virtufin_worker.testing"]
    test = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugin, "-p", "no:cacheprovider"],
        cwd=project,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert test.returncode == 0, test.stdout + test.stderr
    assert " passed" in test.stdout

    stub = ["--gateway-stub", "stubs.json"] if kind == "api" else []
    run = cli("run", "worker.py", "--event", "event.json", *stub, cwd=project)
    assert run.returncode == 0, run.stderr
    (result,) = lines(run)
    assert result["ok"] and not result["outputs"][0]["type"].endswith(".error")


@pytest.mark.parametrize("name", ["Bad", "1abc", "with_underscore", "x.y", "", "a b", "é"])
def test_new_validates_the_name(tmp_path: Path, name: str) -> None:
    proc = cli("new", name, "--dir", str(tmp_path))
    assert proc.returncode == 2
    assert "invalid name" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_new_does_not_overwrite(tmp_path: Path) -> None:
    assert cli("new", "w", "--dir", str(tmp_path)).returncode == 0
    (tmp_path / "w" / "worker.py").write_text("mine")
    proc = cli("new", "w", "--kind", "command", "--dir", str(tmp_path))
    assert proc.returncode == 2 and "exists already" in proc.stderr
    assert (tmp_path / "w" / "worker.py").read_text() == "mine"


def test_new_unknown_kind(tmp_path: Path) -> None:
    assert cli("new", "w", "--kind", "rust", "--dir", str(tmp_path)).returncode == 2
