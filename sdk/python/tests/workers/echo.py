"""A worker file for the fixture tests: echoes the input's data."""

from typing import Any


def process(event: dict[str, Any]) -> dict[str, Any]:
    return {"type": "echoed", "data": event.get("data")}
