"""pytest plugin: the ``worker_harness`` fixture.

Installed with the package, pytest loads this module by itself (entry point
``pytest11``), so a worker's test is one line::

    def test_greets(worker_harness):
        assert worker_harness("worker.py").run({"type": "t", "data": {}}).outputs[0]["data"] == ...

``worker_harness(path_or_source, **options)`` returns a
:class:`~virtufin_worker.harness.Harness` (options as its constructor's,
e.g. ``gateway_stubs={...}``); a relative path is looked up next to the
test file first, then in the current directory. Every harness is closed at
the end of the test. Without installing the package, load the plugin with
``pytest -p virtufin_worker.testing``.

:class:`HarnessFactory` is the same thing without pytest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .harness import Harness


class HarnessFactory:
    """Makes harnesses that are closed together by :meth:`close`."""

    def __init__(self, base: str | os.PathLike[str] | None = None) -> None:
        self.base = Path(base) if base is not None else None
        self.harnesses: list[Harness] = []

    def __call__(self, path_or_source: str | os.PathLike[str] | bytes, **options: Any) -> Harness:
        harness = Harness(self.resolve(path_or_source), **options)
        self.harnesses.append(harness)
        return harness

    def resolve(self, path_or_source: str | os.PathLike[str] | bytes) -> str | os.PathLike[str] | bytes:
        """A relative worker path next to the test file, if it is there."""
        if isinstance(path_or_source, bytes) or (isinstance(path_or_source, str) and "\n" in path_or_source):
            return path_or_source
        path = Path(path_or_source)
        if self.base is not None and not path.is_absolute() and (self.base / path).exists():
            return self.base / path
        return path

    def close(self) -> None:
        """Closes every harness made so far."""
        while self.harnesses:
            self.harnesses.pop().close()


try:
    import pytest
except ImportError:  # pragma: no cover - only pytest loads this as a plugin
    pass
else:

    @pytest.fixture
    def worker_harness(request: pytest.FixtureRequest) -> Iterator[HarnessFactory]:
        """A factory of :class:`~virtufin_worker.harness.Harness` objects,
        closed after the test."""
        factory = HarnessFactory(request.path.parent)
        try:
            yield factory
        finally:
            factory.close()
