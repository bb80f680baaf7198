"""Shared test setup: the package under test (src/ unless installed), the
worker_harness plugin (registered here when the package is not installed,
so its pytest11 entry point is not there), and paths for subprocesses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
try:
    import virtufin_worker
except ImportError:  # running from the source tree without PYTHONPATH=src
    sys.path.insert(0, str(HERE.parent / "src"))
    import virtufin_worker

# The directory holding the package under test: PYTHONPATH for subprocesses.
PACKAGE_ROOT = Path(virtufin_worker.__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("virtufin_worker"):
        from virtufin_worker import testing

        config.pluginmanager.register(testing, "virtufin_worker")


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess that imports the package under test."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env
