"""The conformance suite's exclusion list.

``exclusions.txt`` holds one entry a line: ``<directory>/<test name>: <reason>``; ``#`` starts a
comment. Each test records its bucket in its report's ``user_properties``; the hooks that count
them (terminal summary, and docs/CONFORMANCE.md when ``TILEFUSE_CONFORMANCE_REPORT`` names a
file) live in tests/conftest.py, which the pytest-xdist controller loads too: there the reports
of every worker arrive, so the counts are the whole session's.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

pytest.importorskip("onnx")   # the "onnx" extra; without it this suite is skipped

EXCLUSIONS = Path(__file__).with_name("exclusions.txt")


@pytest.fixture(autouse=True)
def _round_trip_every_graph() -> None:
    """Overrides the suite-wide graph text round trip (tests/conftest.py) here: the backend
    models carry their weights as constants (a light model's ~100 MB of them), and printing
    every graph each pass builds as text took a light run past the machine's memory. The text
    format stays round-trip tested on every other directory's graphs, tests/onnx's included."""


@functools.cache
def exclusions() -> dict[str, str]:
    """Test id (``node/test_abs``) → reason."""
    out: dict[str, str] = {}
    for number, raw in enumerate(EXCLUSIONS.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        test, sep, reason = line.partition(":")
        if not sep or not reason.strip() or "/" not in test:
            raise ValueError(f"{EXCLUSIONS.name}:{number}: expected '<dir>/<test>: <reason>'")
        if test.strip() in out:
            raise ValueError(f"{EXCLUSIONS.name}:{number}: {test.strip()} is listed twice")
        out[test.strip()] = reason.strip()
    return out
