"""Input events in the structured JSON form the node sends to the runner.

Events written by hand (files, tests) may leave out ``specversion``
(``"1.0"``), ``source`` (``"local"``) and ``id`` (a new UUID, as any
publisher must set one). Everything else follows the Go CloudEvents SDK's
``WriteJson``: context attributes, extensions as top-level keys, then
``data`` (decoded JSON for JSON types, text for other types) or
``data_base64`` (binary data: give ``bytes`` or ``data_base64``).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from typing import Any

from ._outputs import JSON_MEDIA_TYPES, media_type
from .events import CloudEvent

DEFAULT_SOURCE = "local"
_CONTEXT = ("specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time")


def to_wire(event: Mapping[str, Any]) -> CloudEvent:
    """The event as the node would send it (raises ValueError/TypeError
    for an event the node could not have received)."""
    if not isinstance(event, Mapping):
        raise TypeError(f"an event must be a JSON object (dict), got {type(event).__name__}")
    ev = {k: v for k, v in event.items() if v is not None}
    if not isinstance(ev.get("type"), str) or not ev["type"]:
        raise ValueError('an event needs a "type" (a non-empty string)')
    ev.setdefault("specversion", "1.0")
    ev.setdefault("id", str(uuid.uuid4()))
    ev.setdefault("source", DEFAULT_SOURCE)
    if ev["specversion"] != "1.0":
        raise ValueError(f"specversion {ev['specversion']!r}: only 1.0 is supported")
    for key in _CONTEXT:
        if key in ev and (not isinstance(ev[key], str) or (key in ("id", "source") and not ev[key])):
            raise ValueError(f"{key} must be a non-empty string")
    for key, value in ev.items():
        if key in _CONTEXT or key in ("data", "data_base64"):
            continue
        if not key.isascii() or not key.isalnum() or not key.islower() and not key.isdigit():
            raise ValueError(f"extension name {key!r}: lower-case letters and digits only")
        if not isinstance(value, (str, int, bool)):
            raise ValueError(f"extension {key}: strings, integers or booleans only")
    if "data_base64" in ev:
        if "data" in ev:
            raise ValueError("an event has data or data_base64, not both")
        base64.b64decode(ev["data_base64"], validate=True)
    elif "data" in ev:
        data = ev["data"]
        if isinstance(data, (bytes, bytearray, memoryview)):
            del ev["data"]
            ev["data_base64"] = base64.b64encode(data).decode("ascii")
            ev.setdefault("datacontenttype", "application/octet-stream")
        else:
            ct = ev.setdefault("datacontenttype", "text/plain" if isinstance(data, str) else "application/json")
            mt = media_type(ct)
            if mt not in JSON_MEDIA_TYPES and not isinstance(data, str):
                if not mt.endswith("+json"):
                    raise ValueError(f"data for datacontenttype {ct!r} must be a string (or bytes)")
                ev["data"] = json.dumps(data, separators=(",", ":"))  # the Go SDK sends it as text
    ordered = {k: ev.pop(k) for k in _CONTEXT if k in ev}
    tail = {k: ev.pop(k) for k in ("data", "data_base64") if k in ev}
    return {**ordered, **ev, **tail}


def encode(event: CloudEvent) -> bytes:
    """The wire event as JSON bytes (compact, as Go writes it)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
