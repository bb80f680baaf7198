"""The command line: ``python -m virtufin_worker run|new|version``.

``run WORKER.py --event e.json [--events more.jsonl] [--gateway-stub s.json]``
runs the worker in the node's runner through :class:`~virtufin_worker.harness.Harness`
and prints one JSON line per event::

    {"event_id": "...", "ok": true, "outputs": [...]}
    {"event_id": "...", "ok": false, "error": {"type", "message", "traceback"}, "reason": "..."}

Exit status: 0 when every event was ok, 1 otherwise, 2 for usage errors,
unreadable files and code that does not load (the runner's message on
stderr).

``new NAME --kind plain|command|api [--dir DIR]`` writes a new worker
project (:mod:`virtufin_worker.scaffold`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__, scaffold
from ._outputs import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_OUTPUTS
from ._wire import to_wire
from .harness import DEFAULT_TIMEOUT, Harness, HarnessError, LoadError, load_stubs

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A problem with the command line or its input files (exit 2)."""


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise UsageError(f"{name}={value!r} is not an integer") from None


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m virtufin_worker", description="The WorkManager Python DevKit."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run a worker on events as a node would",
        description="Runs WORKER in the node's runner on each event and prints one JSON line per event.",
    )
    run.add_argument("worker", help="the worker's source file")
    run.add_argument("--event", action="append", default=[], metavar="FILE", help="a JSON event ('-': stdin); repeatable")
    run.add_argument("--events", action="append", default=[], metavar="FILE", help="JSON lines, one event each; repeatable")
    run.add_argument("--gateway-stub", metavar="FILE", help='gateway stubs: {"service/method": <JSON response>, ...}')
    run.add_argument("--worker-id", default="local", help="the worker id (output ids and source; default %(default)s)")
    run.add_argument("--topic", default="local", help="the worker's input topic (default %(default)s)")
    run.add_argument("--group", default="", help="the worker's group (VIRTUFIN_WORKER_GROUP)")
    run.add_argument("--allowed-outputs", type=_csv, default=[], metavar="PATTERNS", help="allowed_output_topics, comma-separated")
    run.add_argument("--topic-prefix", default="", help="the tenant's topic prefix (default: none)")
    run.add_argument("--allowed-packages", type=_csv, default=[], metavar="PACKAGES", help="PYTHON_ALLOWED_PACKAGES, comma-separated (default: none)")
    run.add_argument("--max-outputs", type=int, help=f"MAX_OUTPUTS_PER_MESSAGE (default: $MAX_OUTPUTS_PER_MESSAGE or {DEFAULT_MAX_OUTPUTS})")
    run.add_argument("--max-output-bytes", type=int, help=f"MAX_OUTPUT_BYTES (default: $MAX_OUTPUT_BYTES or {DEFAULT_MAX_OUTPUT_BYTES})")
    run.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per event (default %(default)s)")
    run.add_argument("--python", help="the interpreter running the worker (default: this one)")

    new = commands.add_parser("new", help="create a worker project from a template")
    new.add_argument("name", help="the worker's name: a-z, 0-9 and '-', starting with a letter")
    new.add_argument("--kind", choices=scaffold.KINDS, default="plain", help="the template (default %(default)s)")
    new.add_argument("--dir", default=".", help="where to create NAME/ (default: the current directory)")

    commands.add_parser("version", help="print the DevKit's version")
    return parser


def _read_json(path: str) -> Any:
    try:
        if path == "-":
            return json.load(sys.stdin)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"{path}: invalid JSON: {e}") from None


def _read_events(args: argparse.Namespace) -> list[dict[str, Any]]:
    raw: list[tuple[str, Any]] = [(path, _read_json(path)) for path in args.event]
    for path in args.events:
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
        except OSError as e:
            raise UsageError(f"{path}: {e.strerror or e}") from None
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    raw.append((f"{path}:{n}", json.loads(line)))
                except ValueError as e:
                    raise UsageError(f"{path}:{n}: invalid JSON: {e}") from None
    if not raw:
        raise UsageError("no events: give --event FILE and/or --events FILE")
    events = []
    for where, event in raw:
        try:
            events.append(to_wire(event))
        except (TypeError, ValueError) as e:
            raise UsageError(f"{where}: {e}") from None
    return events


def _run(args: argparse.Namespace) -> int:
    events = _read_events(args)
    try:
        stubs = load_stubs(args.gateway_stub) if args.gateway_stub else {}
    except OSError as e:
        raise UsageError(f"{args.gateway_stub}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"{args.gateway_stub}: {e}") from None
    max_outputs = args.max_outputs if args.max_outputs is not None else _env_int("MAX_OUTPUTS_PER_MESSAGE", DEFAULT_MAX_OUTPUTS)
    max_bytes = args.max_output_bytes if args.max_output_bytes is not None else _env_int("MAX_OUTPUT_BYTES", DEFAULT_MAX_OUTPUT_BYTES)
    try:
        harness = Harness(
            args.worker,
            worker_id=args.worker_id,
            topic=args.topic,
            allowed_outputs=args.allowed_outputs,
            gateway_stubs=stubs,
            topic_prefix=args.topic_prefix,
            group=args.group,
            allowed_packages=args.allowed_packages,
            max_outputs=max_outputs,
            max_output_bytes=max_bytes,
            timeout=args.timeout,
            python=args.python,
        )
    except ValueError as e:  # a bad allowed_outputs pattern
        raise UsageError(str(e)) from None
    except LoadError as e:
        print(f"{args.worker}: the code does not load: {e}", file=sys.stderr)
        if e.error.traceback:
            print(e.error.traceback.rstrip("\n"), file=sys.stderr)
        return EXIT_USAGE
    status = EXIT_OK
    with harness:
        for event in events:
            result = harness.run(event)
            print(json.dumps(result.to_json(), ensure_ascii=False), flush=True)
            if not result.ok:
                status = EXIT_FAILED
    return status


def _new(args: argparse.Namespace) -> int:
    try:
        files = scaffold.create(args.name, args.kind, args.dir)
    except (ValueError, FileExistsError) as e:
        raise UsageError(str(e)) from None
    for path in files:
        print(path)
    folder = files[0].parent
    stub = " --gateway-stub stubs.json" if args.kind == "api" else ""
    print(
        f"\nnext: cd {folder} && python -m pytest -q"
        f"\n      python -m virtufin_worker run worker.py --event event.json{stub}",
        file=sys.stderr,
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "new":
            return _new(args)
        print(__version__)
        return EXIT_OK
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
