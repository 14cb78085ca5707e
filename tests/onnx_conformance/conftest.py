"""The conformance suite's exclusion list and bucket bookkeeping.

``exclusions.txt`` holds one entry a line: ``<directory>/<test name>: <reason>``; ``#`` starts a
comment. Each test records its bucket in its report's ``user_properties``; at the end of the
session the counts per directory print in the terminal summary and, when
``TILEFUSE_CONFORMANCE_REPORT`` names a file, :mod:`conformance_report` writes it
(docs/CONFORMANCE.md).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnx")   # the "onnx" extra; without it this suite is skipped

EXCLUSIONS = Path(__file__).with_name("exclusions.txt")
REPORT_ENV = "TILEFUSE_CONFORMANCE_REPORT"
_ROWS: list[tuple[str, str, str, str]] = []


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


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == "conformance":
            _ROWS.append(value)


def _counts() -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for directory, _, bucket, _ in _ROWS:
        per = counts.setdefault(directory, {})
        per[bucket] = per.get(bucket, 0) + 1
    return counts


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _ROWS:
        return
    terminalreporter.section("ONNX conformance buckets")
    for directory, per in _counts().items():
        shown = ", ".join(f"{b} {n}" for b, n in sorted(per.items()))
        terminalreporter.write_line(f"{directory}: {shown}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(REPORT_ENV)
    if not target or not _ROWS:
        return
    import onnx
    from conformance_report import render

    rows = sorted(_ROWS, key=lambda r: (r[0], r[1]))
    Path(target).write_text(render(rows, onnx.__version__))
