"""What the node does with a worker's outputs after the runner, in Python.

Mirrors, in this order:

1. the Python engine decoding the runner's result (engines/python,
   ``decodeOutputs``: each output must decode as a CloudEvent; the Go SDK
   checks attribute types and extension names and values);
2. the dispatcher's ``checkOutputs`` (internal/dispatch/worker.go): at most
   ``MAX_OUTPUTS_PER_MESSAGE`` outputs; each completed (``id`` defaults to
   ``<input id>/<worker id>/<index>/<source tag>``, ``source`` to
   ``workmanager/workers/<worker id>``, ``correlationid`` copied from the
   input when present and removed when absent); each held to the worker's
   output policy (``workerpolicy.CheckOutput``: tenant prefix, reserved
   topics ``workmanager.*`` and ``*-dead``, ``allowed_output_topics``, the
   worker's own input topic) and to ``MAX_OUTPUT_BYTES`` of data.

Refusals raise :class:`OutputRefused` with the node's reason
(``worker_failed``, ``output_policy``, ``output_limit``, ``output_invalid``)
and message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .events import CORRELATION_ID, CloudEvent

DEFAULT_MAX_OUTPUTS = 100
DEFAULT_MAX_OUTPUT_BYTES = 1048576
RESERVED_PREFIX = "workmanager."
DEAD_SUFFIX = "-dead"

WORKER_FAILED = "worker_failed"
OUTPUT_POLICY = "output_policy"
OUTPUT_LIMIT = "output_limit"
# Outputs that cannot be published at all (no "type", a bad extension, not
# encodable): like the two above, the node dead-letters them at once.
OUTPUT_INVALID = "output_invalid"

_POLICY_DENIED = "not allowed by the worker's policy"
_ATTRIBUTES = frozenset(
    ("specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time", "data", "data_base64")
)
# Media types the Go CloudEvents SDK keeps as JSON; "" is "no type".
JSON_MEDIA_TYPES = frozenset(
    ("", "application/json", "text/json", "application/cloudevents+json", "application/cloudevents-batch+json")
)
_INT32 = (-(2**31), 2**31 - 1)


class OutputRefused(Exception):
    """The node would refuse the outputs: reason and message say why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _q(s: object) -> str:
    """A quoted string, as Go's %q prints it (close enough: JSON)."""
    return json.dumps(s, ensure_ascii=False)


def media_type(content_type: str) -> str:
    """The media type of a content type, lower case, without parameters."""
    return content_type.partition(";")[0].strip().lower()


def reserved(topic: str) -> bool:
    """Whether no worker may publish to topic."""
    return topic.startswith(RESERVED_PREFIX) or topic.endswith(DEAD_SUFFIX)


# ---------------------------------------------------------------- patterns


def _class_char(p: str, i: int, pattern: str) -> tuple[str, int]:
    if i >= len(p):
        raise ValueError(f"pattern {_q(pattern)}: unterminated character class")
    if p[i] == "\\":
        if i + 1 >= len(p):
            raise ValueError(f"pattern {_q(pattern)}: trailing backslash")
        return p[i + 1], i + 2
    if p[i] in "-]":
        raise ValueError(f"pattern {_q(pattern)}: unescaped {p[i]!r} in a character class")
    return p[i], i + 1


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A topic pattern with Go's path.Match syntax (``*`` any run of
    characters but ``/``, ``?`` one of them, ``[...]`` classes, ``\\``
    escapes) as a regex matching whole topics. Raises ValueError for a
    malformed pattern."""
    out: list[str] = []
    p, i, n = pattern, 0, len(pattern)
    while i < n:
        c = p[i]
        if c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "\\":
            if i + 1 >= n:
                raise ValueError(f"pattern {_q(pattern)}: trailing backslash")
            out.append(re.escape(p[i + 1]))
            i += 2
        elif c == "[":
            i += 1
            negate = i < n and p[i] == "^"
            if negate:
                i += 1
            items: list[str] = []
            while True:
                if i < n and p[i] == "]" and items:
                    i += 1
                    break
                lo, i = _class_char(p, i, pattern)
                if i < n and p[i] == "-":
                    hi, i = _class_char(p, i + 1, pattern)
                    if hi < lo:
                        raise ValueError(f"pattern {_q(pattern)}: bad range {lo}-{hi}")
                    items.append(re.escape(lo) + "-" + re.escape(hi))
                else:
                    items.append(re.escape(lo))
            out.append("[" + ("^" if negate else "") + "".join(items) + "]")
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


@dataclass(frozen=True)
class OutputPolicy:
    """A worker's output policy and the node's output limits."""

    worker_id: str = "local"
    topic: str = "local"
    allowed_outputs: Sequence[str] = ()
    topic_prefix: str = ""
    max_outputs: int = DEFAULT_MAX_OUTPUTS
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Validates allowed_outputs as CreateWorker does."""
        patterns = []
        for p in self.allowed_outputs:
            if not p or len(p) > 256:
                raise ValueError(f"allowed_output_topics: pattern {_q(p)} must be 1 to 256 characters")
            patterns.append(compile_pattern(p))
            if not any(c in p for c in "*?") and reserved(p):
                raise ValueError(
                    f"allowed_output_topics: {_q(p)} is a reserved topic ({RESERVED_PREFIX}* and *{DEAD_SUFFIX} are never allowed)"
                )
        object.__setattr__(self, "allowed_outputs", tuple(self.allowed_outputs))
        object.__setattr__(self, "_patterns", tuple(patterns))

    def check_topic(self, topic: str) -> str | None:
        """Why the worker may not publish to topic (None: it may)."""
        allowed = self.allowed_outputs
        if not topic.startswith(self.topic_prefix):
            return f"topic {_q(topic)} is outside the tenant's topics (prefix {_q(self.topic_prefix)}): {_POLICY_DENIED}"
        if reserved(topic):
            return f"topic {_q(topic)} is reserved ({RESERVED_PREFIX}* and *{DEAD_SUFFIX}): {_POLICY_DENIED}"
        if allowed and not any(p.match(topic) for p in self._patterns):
            listed = "[" + " ".join(_q(a) for a in allowed) + "]"
            return f"topic {_q(topic)} is not in allowed_output_topics {listed}: {_POLICY_DENIED}"
        if not allowed and topic == self.topic:
            return (
                f"topic {_q(topic)} is the worker's own input topic (a loop; list it in "
                f"allowed_output_topics to allow it): {_POLICY_DENIED}"
            )
        return None


# ---------------------------------------------------------------- decoding


def _decode(raw: Any) -> CloudEvent:
    """One output as the Go SDK decodes it (raises ValueError)."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    out: CloudEvent = {}
    for key, value in raw.items():
        if key in _ATTRIBUTES:
            if key == "data":
                out[key] = value
            elif not isinstance(value, str):
                raise ValueError(f"{key}: expected a string, got {type(value).__name__}")
            else:
                out[key] = value
            continue
        if not key or not key.isascii() or not key.isalnum():
            raise ValueError(
                f"bad key {_q(key)}: CloudEvents attribute names MUST consist of lower-case letters, "
                "upper-case letters or digits from the ASCII character set"
            )
        if value is None:
            continue
        if isinstance(value, (bool, str)):
            out[key.lower()] = value
        elif isinstance(value, (int, float)):
            if not _INT32[0] <= value <= _INT32[1]:
                raise ValueError(f"extension {key}: {value} is out of range for int32")
            out[key.lower()] = int(value)
        else:
            raise ValueError(f"extension {key}: cannot be a {type(value).__name__} (strings, integers or booleans only)")
    if out.get("specversion") != "1.0":
        raise ValueError(f"specversion: unknown value: {out.get('specversion')!r}")
    if not out.get("type"):
        raise ValueError('missing required attribute "type"')
    if "source" in out and not out["source"]:
        raise ValueError("source: must not be empty")
    if "data_base64" in out:
        try:
            base64.b64decode(out["data_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("data_base64: illegal base64 data") from None
    return out


def decode_outputs(result: Any) -> list[CloudEvent]:
    """The outputs in the runner's result (null, an object or a list)."""
    if result is None:
        return []
    raws = result if isinstance(result, list) else [result]
    outs = []
    for i, raw in enumerate(raws):
        try:
            outs.append(_decode(raw))
        except ValueError as e:
            raise OutputRefused(OUTPUT_INVALID, f"output {i}: {e}") from None
    return outs


def data_size(output: CloudEvent) -> int:
    """The bytes of data the node counts against MAX_OUTPUT_BYTES."""
    if "data_base64" in output:
        return len(base64.b64decode(output["data_base64"]))
    if "data" not in output:
        return 0
    data = output["data"]
    if media_type(output.get("datacontenttype", "")) in JSON_MEDIA_TYPES or not isinstance(data, str):
        return len(json.dumps(data, separators=(",", ":"), ensure_ascii=True).encode())
    return len(data.encode("utf-8"))


# ---------------------------------------------------------------- checks


def source_tag(source: str) -> str:
    """The last part of an output's default id: the first 8 hex digits of
    the SHA-256 of the input's source, so that two inputs with one id from
    two sources (CloudEvents: source+id is the identity) give outputs with
    different ids (internal/dispatch, ``sourceTag``)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:8]


def check_outputs(input: CloudEvent, result: Any, policy: OutputPolicy) -> list[CloudEvent]:
    """The completed outputs of input, or OutputRefused."""
    outs = decode_outputs(result)
    if len(outs) > policy.max_outputs:
        raise OutputRefused(
            OUTPUT_LIMIT, f"{len(outs)} outputs, more than MAX_OUTPUTS_PER_MESSAGE {policy.max_outputs}"
        )
    for i, out in enumerate(outs):
        if not out.get("id"):
            out["id"] = f"{input['id']}/{policy.worker_id}/{i}/{source_tag(str(input.get('source', '')))}"
        if not out.get("source"):
            out["source"] = f"workmanager/workers/{policy.worker_id}"
        if CORRELATION_ID in input:
            out[CORRELATION_ID] = input[CORRELATION_ID]
        else:
            out.pop(CORRELATION_ID, None)
        refusal = policy.check_topic(out["type"])
        if refusal is not None:
            raise OutputRefused(OUTPUT_POLICY, f"output {i}: {refusal}")
        size = data_size(out)
        if size > policy.max_output_bytes:
            raise OutputRefused(
                OUTPUT_LIMIT,
                f"output {i}: {size} bytes of data, more than MAX_OUTPUT_BYTES {policy.max_output_bytes}",
            )
    return [_ordered(out) for out in outs]


_ORDER = ("specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time")


def _ordered(event: CloudEvent) -> CloudEvent:
    """event with its keys in the Go SDK's order: context attributes,
    extensions, data."""
    head = {k: event[k] for k in _ORDER if k in event}
    rest = {k: v for k, v in event.items() if k not in head and k not in ("data", "data_base64")}
    tail = {k: event[k] for k in ("data", "data_base64") if k in event}
    return {**head, **rest, **tail}
