"""Project templates: ``python -m virtufin_worker new NAME --kind KIND``.

Writes ``NAME/worker.py``, ``NAME/test_worker.py`` (using the
``worker_harness`` fixture) and ``NAME/event.json`` (a sample event that
the test and ``python -m virtufin_worker run`` accept); the ``api`` kind
adds ``NAME/stubs.json``, gateway stubs for ``run --gateway-stub``. Every
generated worker passes its own generated test as it is.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

KINDS = ("plain", "command", "api")
TEMPLATES = Path(__file__).with_name("templates")
_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")
_SUFFIX = ".tmpl"


def validate_name(name: str) -> str:
    """name if it is a valid worker name (raises ValueError)."""
    if not _NAME.match(name):
        raise ValueError(
            f"invalid name {name!r}: use lower-case letters, digits and '-', starting with a letter"
        )
    return name


def render(kind: str, name: str) -> dict[str, str]:
    """The files of a new worker of kind: file name to content."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    validate_name(name)
    files = {}
    for template in sorted((TEMPLATES / kind).iterdir()):
        if template.name.endswith(_SUFFIX):
            text = template.read_text(encoding="utf-8")
            files[template.name[: -len(_SUFFIX)]] = text.replace("{{name}}", name)
    return files


def create(name: str, kind: str = "plain", directory: str | os.PathLike[str] = ".") -> list[Path]:
    """Writes a new worker into directory/name and returns the files.
    Raises ValueError for a bad name or kind, FileExistsError rather than
    overwrite a file."""
    files = render(kind, name)
    target = Path(directory) / name
    for file in files:
        if (target / file).exists():
            raise FileExistsError(f"{target / file} exists already")
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for file, text in files.items():
        path = target / file
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
