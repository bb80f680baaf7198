"""CloudEvent helpers: the event type workers see and return, and builders.

Inside WorkManager an event is a plain dict in CloudEvents structured form:
``specversion``, ``id``, ``source``, ``type``, ``datacontenttype``,
``data``, ``subject``, ``time``, ... with extensions (``correlationid``,
``fencingtoken``) as top-level keys. Outputs need only ``type``: the runner
fills ``specversion`` and the node fills ``id``, ``source`` and the
correlation id (see the worker contract in engines/python/README.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Union

CloudEvent = dict[str, Any]
"""A CloudEvent in structured form, as a dict."""

Output = Union[CloudEvent, Sequence[CloudEvent], None]
"""What ``process`` may return: no event, one event, or several in order."""

CORRELATION_ID = "correlationid"
"""The extension the node copies from an input to all of its outputs."""

_EXTENSION_NAME = re.compile(r"[a-z0-9]+\Z")


def new_event(
    type: str,
    data: Any = None,
    *,
    source: str | None = None,
    subject: str | None = None,
    **extensions: Any,
) -> CloudEvent:
    """Builds an output event; arguments that are None are left out.

    Extensions are given as keywords (``new_event("t", d, tenant="acme")``);
    their names must be lower-case letters and digits, as CloudEvents
    requires.
    """
    if not isinstance(type, str) or not type:
        raise ValueError("an event type must be a non-empty string")
    event: CloudEvent = {"type": type}
    if source is not None:
        event["source"] = source
    if subject is not None:
        event["subject"] = subject
    for name, value in extensions.items():
        if not _EXTENSION_NAME.match(name):
            raise ValueError(
                f"extension name {name!r}: CloudEvents extension names are lower-case letters and digits"
            )
        if value is not None:
            event[name] = value
    if data is not None:
        event["data"] = data
    return event


def with_correlation_id(input: CloudEvent, output: CloudEvent) -> CloudEvent:
    """Copies the input's ``correlationid`` onto output (nothing when the
    input has none) and returns output.

    The node does the same for every output anyway (and removes a
    correlation id the input did not have); this makes it visible in the
    worker's own code and tests.
    """
    value = input.get(CORRELATION_ID)
    if value is not None:
        output[CORRELATION_ID] = value
    return output
