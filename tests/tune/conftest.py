"""Fixtures of the tuning tests: every peak probe made with its defaults is a small one."""

from __future__ import annotations

import pytest
from helpers_tune import SMALL_PROBE

from tilefuse.tune.roofline import PeakProbe


@pytest.fixture(autouse=True)
def _small_default_peak_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """``PeakProbe()`` with its defaults (what a :class:`MeasuredRoofline` given no probe makes,
    and what the tuner's confirmation measures around each pass) probes as
    :func:`helpers_tune.small_probe` does: the real one (1024³ matmuls, 256 MiB copies, half
    of L3 streamed) took most of a tuning test's CPU time, for bounds these tests do not
    check. A test that passes its own shapes and sizes gets them."""
    monkeypatch.setattr(PeakProbe.__init__, "__defaults__", SMALL_PROBE)
