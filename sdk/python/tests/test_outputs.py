"""The node's output rules in Python: path.Match patterns, the policy,
decoding and data sizes (the end-to-end cases are in test_harness.py)."""

from __future__ import annotations

from typing import Any

import pytest

from virtufin_worker._outputs import (
    source_tag,
    OutputPolicy,
    OutputRefused,
    check_outputs,
    compile_pattern,
    data_size,
)
from virtufin_worker._wire import DEFAULT_SOURCE, to_wire


@pytest.mark.parametrize(
    "pattern,topic,matches",
    [
        ("orders", "orders", True),
        ("orders", "orders2", False),
        ("billing.*", "billing.due", True),
        ("billing.*", "billing.", True),
        ("billing.*", "billing.a/b", False),
        ("*", "anything", True),
        ("a?c", "abc", True),
        ("a?c", "a/c", False),
        ("[a-c]x", "bx", True),
        ("[^a-c]x", "dx", True),
        ("[^a-c]x", "ax", False),
        ("a\\*", "a*", True),
        ("a\\*", "ab", False),
        ("a.b", "axb", False),
    ],
)
def test_path_match(pattern: str, topic: str, matches: bool) -> None:
    assert bool(compile_pattern(pattern).match(topic)) is matches


@pytest.mark.parametrize("pattern", ["[", "a\\", "[]", "[z-a]", "[a-]"])
def test_bad_patterns(pattern: str) -> None:
    with pytest.raises(ValueError):
        compile_pattern(pattern)
    with pytest.raises(ValueError):
        OutputPolicy(allowed_outputs=[pattern])


def test_reserved_pattern_refused_but_wildcards_allowed() -> None:
    with pytest.raises(ValueError, match="reserved topic"):
        OutputPolicy(allowed_outputs=["x-dead"])
    policy = OutputPolicy(allowed_outputs=["*"])  # allowed, yet reserved topics stay refused
    assert policy.check_topic("workmanager.x") is not None
    assert policy.check_topic("local") is None  # listed by the wildcard: no loop rule


def test_check_outputs_null_and_single() -> None:
    policy = OutputPolicy()
    wire = to_wire({"type": "t", "id": "i"})
    assert check_outputs(wire, None, policy) == []
    assert check_outputs(wire, {"specversion": "1.0", "type": "x"}, policy)[0]["id"] == "i/local/0/" + source_tag(DEFAULT_SOURCE)


def test_extension_values_like_the_go_sdk() -> None:
    wire = to_wire({"type": "t", "id": "i"})
    out = check_outputs(wire, {"specversion": "1.0", "type": "x", "Tenant": "a", "n": 2.9, "b": True}, OutputPolicy())
    assert (out[0]["tenant"], out[0]["n"], out[0]["b"]) == ("a", 2, True)
    bads: list[dict[str, Any]] = [{"n": 2**31}, {"o": {"a": 1}}, {"l": [1]}]
    for bad in bads:
        with pytest.raises(OutputRefused) as e:
            check_outputs(wire, {"specversion": "1.0", "type": "x", **bad}, OutputPolicy())
        assert e.value.reason == "output_invalid" and e.value.message.startswith("output 0: extension")


def test_data_size() -> None:
    assert data_size({"type": "t"}) == 0
    assert data_size({"data": {"a": 1}, "datacontenttype": "application/json"}) == len('{"a":1}')
    assert data_size({"data": "é", "datacontenttype": "text/plain"}) == 2
    assert data_size({"data_base64": "AAE="}) == 2


def test_wire_form() -> None:
    wire = to_wire({"type": "t", "data": b"\x00", "correlationid": "c", "subject": None})
    assert list(wire) == ["specversion", "id", "source", "type", "datacontenttype", "correlationid", "data_base64"]
    assert wire["data_base64"] == "AA==" and wire["datacontenttype"] == "application/octet-stream"
    assert to_wire({"type": "t", "data": "x"})["datacontenttype"] == "text/plain"
    assert to_wire({"type": "t", "data": {"a": 1}, "datacontenttype": "application/x+json"})["data"] == '{"a":1}'
    with pytest.raises(ValueError, match="must be a string"):
        to_wire({"type": "t", "data": {"a": 1}, "datacontenttype": "text/csv"})
    with pytest.raises(ValueError, match="not both"):
        to_wire({"type": "t", "data": 1, "data_base64": "AA=="})
