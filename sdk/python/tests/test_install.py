"""pip install into a fresh virtualenv, offline: the wheel holds a real copy
of the runner (not the repository's symlink), the CLI works from the
installed package, and pytest finds the fixture by the pytest11 entry point.

Marked ``install`` (deselect with ``-m "not install"``); skipped when venv
or ensurepip is missing. The package builds itself (_build/virtufin_build.py),
so neither setuptools nor wheel is needed, with or without build isolation.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent  # sdk/python
RUNNER_LINK = PROJECT / "src" / "virtufin_worker" / "_runner.py"

pytestmark = [
    pytest.mark.install,
    pytest.mark.skipif(
        any(importlib.util.find_spec(m) is None for m in ("venv", "ensurepip")),
        reason="venv or ensurepip is missing",
    ),
    pytest.mark.skipif(not RUNNER_LINK.is_file(), reason="the runner is not next to the sources"),
]


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    proc = subprocess.run(list(map(str, args)), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{args}: {proc.stdout}\n{proc.stderr}"
    return proc


def test_pip_install_offline(tmp_path: Path) -> None:
    # The repository layout the symlink needs: sdk/python next to engines/python/runner.py.
    source = tmp_path / "repo" / "sdk" / "python"
    shutil.copytree(
        PROJECT,
        source,
        symlinks=True,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".mypy_cache", ".pytest_cache"),
    )
    runner = tmp_path / "repo" / "engines" / "python" / "runner.py"
    runner.parent.mkdir(parents=True)
    shutil.copyfile(RUNNER_LINK, runner)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--system-site-packages", venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index", source)

    where = run(python, "-c", "import virtufin_worker, sys; print(virtufin_worker.__file__)", cwd=tmp_path)
    package = Path(where.stdout.strip()).parent
    assert package.is_relative_to(venv), package
    installed_runner = package / "_runner.py"
    assert installed_runner.is_file() and not installed_runner.is_symlink()
    assert installed_runner.read_bytes() == runner.read_bytes()
    for data in ("py.typed", "templates/command/worker.py.tmpl", "templates/api/stubs.json.tmpl"):
        assert (package / data).is_file(), data

    work = tmp_path / "work"
    run(python, "-m", "virtufin_worker", "new", "hello", "--kind", "command", "--dir", work)
    project = work / "hello"
    out = run(python, "-m", "virtufin_worker", "run", "worker.py", "--event", "event.json", cwd=project)
    assert '"ok": true' in out.stdout and '"Hello, Ada!"' in out.stdout
    script = run(venv / "bin" / "virtufin-worker", "version")
    assert script.stdout.strip() == "0.1.0"

    # The fixture comes from the entry point: no -p, no conftest.
    tests = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project)
    assert "3 passed" in tests.stdout


def test_pip_install_without_setuptools_or_wheel(tmp_path: Path) -> None:
    # A virtualenv without the system's packages and with setuptools
    # removed: what a pyenv python3 without `wheel` gives a newcomer. Both
    # the isolated build (pip's default) and --no-build-isolation work.
    source = tmp_path / "repo" / "sdk" / "python"
    shutil.copytree(PROJECT, source, symlinks=False,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".mypy_cache", ".pytest_cache", "tests"))
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "setuptools", "wheel"], capture_output=True, timeout=120)
    check = run(python, "-c", "import importlib.util as u; print(u.find_spec('setuptools'), u.find_spec('wheel'))")
    assert check.stdout.strip() == "None None", check.stdout
    for isolation in ([], ["--no-build-isolation", "--force-reinstall"]):
        run(python, "-m", "pip", "install", "-q", "--no-index", *isolation, source)
        script = run(venv / "bin" / "virtufin-worker", "version")
        assert script.stdout.strip() == "0.1.0"
