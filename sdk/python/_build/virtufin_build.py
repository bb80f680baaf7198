"""The DevKit's own PEP 517 build backend: standard library only.

``pip install ./sdk/python`` must work offline with whatever Python 3.11+
is ``python3`` (a pyenv build has no ``wheel`` package, and setuptools
before 70.1 cannot build a wheel without it), so the package builds itself:
a pure-Python wheel of ``src/virtufin_worker`` (symlinks such as
``_runner.py`` are stored as the files they point to), its metadata and
entry points read from ``pyproject.toml``'s ``[project]`` table.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent  # sdk/python
PACKAGE = "virtufin_worker"
SOURCE = ROOT / "src" / PACKAGE
TAG = "py3-none-any"


def _project() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def _version() -> str:
    text = (SOURCE / "__init__.py").read_text(encoding="utf-8")
    m = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if m is None:
        raise RuntimeError(f"no __version__ in {SOURCE / '__init__.py'}")
    return m.group(1)


def _dist_name(project: dict[str, Any]) -> str:
    return re.sub(r"[-_.]+", "_", project["name"]).lower()


def _metadata(project: dict[str, Any], version: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project.get('description', '')}",
        f"Requires-Python: {project.get('requires-python', '>=3')}",
    ]
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    readme = project.get("readme")
    body = ""
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        body = (ROOT / readme).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n\n" + body


def _entry_points(project: dict[str, Any]) -> str:
    groups: dict[str, dict[str, str]] = {}
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    groups.update(project.get("entry-points", {}))
    out = []
    for group, entries in groups.items():
        out.append(f"[{group}]")
        out += [f"{name} = {target}" for name, target in entries.items()]
        out.append("")
    return "\n".join(out)


def _package_files() -> Iterator[tuple[str, bytes]]:
    for path in sorted(SOURCE.rglob("*")):
        rel = path.relative_to(SOURCE)
        if path.is_dir() or "__pycache__" in rel.parts or path.suffix == ".pyc":
            continue
        yield f"{PACKAGE}/{rel.as_posix()}", path.read_bytes()  # follows symlinks


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def _write_wheel(directory: str, files: list[tuple[str, bytes]]) -> str:
    project = _project()
    version = _version()
    dist = _dist_name(project)
    info = f"{dist}-{version}.dist-info"
    files = files + [
        (f"{info}/METADATA", _metadata(project, version).encode()),
        (f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: virtufin_build\nRoot-Is-Purelib: true\nTag: {TAG}\n".encode()),
        (f"{info}/entry_points.txt", _entry_points(project).encode()),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files)
    record += f"{info}/RECORD,,\n"
    name = f"{dist}-{version}-{TAG}.whl"
    with zipfile.ZipFile(Path(directory) / name, "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, data in files + [(f"{info}/RECORD", record.encode())]:
            zi = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(zi, data)
    return name


# PEP 517 hooks.


def get_requires_for_build_wheel(config_settings: Any = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: Any = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: Any = None) -> list[str]:
    return []


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> str:
    return _write_wheel(wheel_directory, list(_package_files()))


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None) -> str:
    """PEP 660: a wheel whose .pth puts src/ on sys.path."""
    pth = (str(ROOT / "src") + "\n").encode()
    return _write_wheel(wheel_directory, [(f"_{PACKAGE}_editable.pth", pth)])


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    project = _project()
    base = f"{_dist_name(project)}-{_version()}"
    name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as tar:
        for rel in ("pyproject.toml", "README.md", "_build/virtufin_build.py"):
            tar.add(ROOT / rel, arcname=f"{base}/{rel}")
        for arcname, data in _package_files():
            ti = tarfile.TarInfo(f"{base}/src/{arcname}")
            ti.size, ti.mode = len(data), 0o644
            tar.addfile(ti, io.BytesIO(data))
    return name
