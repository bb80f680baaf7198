"""require() and the version string the node parses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import virtufin_worker
from virtufin_worker import DevKitVersionError, require
from virtufin_worker.version import parse_version


def test_version_line_is_a_plain_literal() -> None:
    text = Path(virtufin_worker.__file__).read_text()
    assert re.search(r'^__version__ = "0\.1\.0"$', text, re.M)
    assert virtufin_worker.__version__ == "0.1.0"


@pytest.mark.parametrize("needed", ["0", "0.1", "0.1.0", "0.0.9"])
def test_require_ok(needed: str) -> None:
    require(needed)


@pytest.mark.parametrize("needed", ["0.1.1", "0.2", "1", "10.0.0"])
def test_require_too_old(needed: str) -> None:
    with pytest.raises(DevKitVersionError) as e:
        require(needed)
    assert str(e.value) == f"this worker needs virtufin_worker >= {needed}; the node provides 0.1.0"
    assert isinstance(e.value, RuntimeError)


@pytest.mark.parametrize("bad", ["", "1.x", "1.2.3.4", "v1", "1..2"])
def test_require_bad_version(bad: str) -> None:
    with pytest.raises(ValueError):
        require(bad)


def test_parse_version() -> None:
    assert parse_version("1") == (1, 0, 0)
    assert parse_version("0.10") == (0, 10, 0)
    assert parse_version("0.10") > parse_version("0.9.9")
