"""mypy --strict on the package, and on command workers whose match over
the command Enum ends in assert_never: complete passes, a missing member
fails. Skipped only when mypy is not importable."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PACKAGE_ROOT

from virtufin_worker import scaffold

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(cache: Path, *args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if PACKAGE_ROOT.name != "site-packages":  # not installed: point mypy at src/
        env["MYPYPATH"] = str(PACKAGE_ROOT)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_package_passes_mypy_strict(mypy_cache: Path) -> None:
    proc = mypy(mypy_cache, PACKAGE_ROOT / "virtufin_worker")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout


def test_assert_never_catches_a_missing_command(mypy_cache: Path, tmp_path: Path) -> None:
    source = scaffold.render("command", "orders")["worker.py"]
    missing = "            case Command.COUNT:\n                return self.response(event, {\"count\": len(payload.get(\"items\", []))})\n"
    assert missing in source
    complete = tmp_path / "complete" / "worker.py"
    incomplete = tmp_path / "incomplete" / "worker.py"
    for path, text in ((complete, source), (incomplete, source.replace(missing, ""))):
        path.parent.mkdir()
        path.write_text(text)

    ok = mypy(mypy_cache, "worker.py", cwd=complete.parent)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    failed = mypy(mypy_cache, "worker.py", cwd=incomplete.parent)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert 'Argument 1 to "assert_never" has incompatible type "Literal[Command.COUNT]"' in failed.stdout
