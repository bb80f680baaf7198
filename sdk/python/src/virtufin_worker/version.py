"""The DevKit's version check for workers: :func:`require`.

A worker that needs a newer DevKit than the node ships calls
``require("0.2")`` at module level; on an older node the import fails with
:class:`DevKitVersionError`, so CreateWorker is refused (INVALID_ARGUMENT)
at the node's load check instead of failing on events later.
"""

from __future__ import annotations


class DevKitVersionError(RuntimeError):
    """The installed DevKit is older than the worker needs."""


def parse_version(version: str) -> tuple[int, int, int]:
    """``"1"``, ``"1.2"`` or ``"1.2.3"`` as (major, minor, patch).
    Raises ValueError."""
    parts = version.strip().split(".") if isinstance(version, str) else []
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and p.isascii() for p in parts):
        raise ValueError(f"invalid version {version!r}: expected MAJOR[.MINOR[.PATCH]] (digits)")
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return numbers[0], numbers[1], numbers[2]


def require(min_version: str) -> None:
    """Raises :class:`DevKitVersionError` if this DevKit is older than
    min_version (ValueError if min_version is not a version)."""
    from . import __version__

    if parse_version(__version__) < parse_version(min_version):
        raise DevKitVersionError(
            f"this worker needs virtufin_worker >= {min_version}; the node provides {__version__}"
        )
