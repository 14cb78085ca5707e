"""Roofline bounds: min(peak, bandwidth x intensity), peaks stored once and raised when beaten."""

from __future__ import annotations

import pytest

from tilefuse.tune.database import SQLiteDatabase
from tilefuse.tune.roofline import MeasuredRoofline, NoRoofline, PeakProbe, Peaks, bound_at


def test_bound_is_the_slower_of_compute_and_traffic_and_peaks_are_measured_once(tmp_path):
    db = SQLiteDatabase(tmp_path / "t.sqlite")
    calls = []

    def measure() -> Peaks:
        calls.append(1)
        return Peaks(1e11, 1e10)

    roof = MeasuredRoofline(db, "cpu", measure)
    assert roof.bound_seconds(1e11, 1e6) == pytest.approx(1.0)       # compute bound
    assert roof.bound_seconds(1e6, 1e10) == pytest.approx(1.0)       # bandwidth bound
    assert roof.attainable_flops(1e6, 1e10) == pytest.approx(1e6)    # bandwidth x intensity
    MeasuredRoofline(db, "cpu", measure)
    assert calls == [1]


def test_a_kernel_faster_than_the_peak_raises_the_stored_peak(tmp_path):
    db = SQLiteDatabase(tmp_path / "t.sqlite")
    roof = MeasuredRoofline(db, "cpu", lambda: Peaks(1e11, 1e10))
    roof.observe(4e11, 1e6, 2.0)            # 2e11 FLOP/s: beats the 1e11 peak
    assert roof.peaks.flops == pytest.approx(2e11) and roof.peaks.bytes == 1e10
    assert roof.bound_seconds(4e11, 1e6) == pytest.approx(2.0)   # now exactly at the bound
    roof.observe(1e9, 1e6, float("inf"))     # a failed candidate changes nothing
    again = MeasuredRoofline(db, "cpu", lambda: Peaks(1.0, 1.0))
    assert again.peaks == roof.peaks


def test_peaks_measured_now_are_medians_and_leave_the_stored_ones(tmp_path):
    """``measure_now`` (the confirmation's paired peaks) times the probe again: positive,
    finite FLOP/s and bytes/s, each from the best of a few runs, with the stored peaks
    untouched."""
    db = SQLiteDatabase(tmp_path / "t.sqlite")
    roof = MeasuredRoofline(db, "cpu", lambda: Peaks(1e11, 1e10),
                            probe=lambda: PeakProbe(((96, 80, 64),), copy_bytes=1 << 20))
    now = roof.measure_now()
    assert 1e6 < now.flops < 1e14 and 1e6 < now.bytes < 1e13
    assert roof.peaks == Peaks(1e11, 1e10) == MeasuredRoofline(db, "cpu").peaks
    assert bound_at(now, 2 * 96 * 80 * 64, 0.0) == pytest.approx(2 * 96 * 80 * 64 / now.flops)
    assert NoRoofline().measure_now() is None
