"""Rooflines per cache level: a kernel is bounded by the bandwidth of the level its working
set fits in, the levels are measured once and stored, and no kernel of a small model shows
above its bound."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

from tilefuse.tune.bandwidth import Level, StreamProbe, cache_sizes
from tilefuse.tune.database import SQLiteDatabase
from tilefuse.tune.roofline import MeasuredRoofline, PeakProbe, Peaks, bound_at, mean_peaks

LEVELS = (Level("L1", 64e3, 400e9), Level("L2", 2e6, 200e9), Level("L3", 32e6, 100e9))


def test_the_level_follows_the_working_set():
    peaks = Peaks(1e12, 20e9, LEVELS)
    assert [peaks.level_for(n).name for n in (1e3, 64e3, 65e3, 2e6, 3e6, 32e6, 33e6)] == \
        ["L1", "L1", "L2", "L2", "L3", "L3", "DRAM"]
    assert bound_at(peaks, 0.0, 32e3) == pytest.approx(32e3 / 400e9)
    assert bound_at(peaks, 0.0, 1e6) == pytest.approx(1e6 / 200e9)
    assert bound_at(peaks, 0.0, 1e9) == pytest.approx(1e9 / 20e9)
    assert bound_at(peaks, 1e9, 32e3) == pytest.approx(1e-3)           # compute bound
    # a cache measured slower than DRAM (a noisy probe) is never the lower roof
    slow = Peaks(1e12, 20e9, (Level("L1", 64e3, 5e9),))
    assert bound_at(slow, 0.0, 32e3) == pytest.approx(32e3 / 20e9)
    assert bound_at(Peaks(1e12, 20e9), 0.0, 32e3) == pytest.approx(32e3 / 20e9)  # no levels
    mean = mean_peaks(peaks, Peaks(3e12, 40e9, tuple(
        Level(lv.name, lv.capacity, 3 * lv.bandwidth) for lv in LEVELS)))
    assert mean.flops == 2e12 and mean.bytes == 30e9
    assert [lv.bandwidth for lv in mean.levels] == [800e9, 400e9, 200e9]


def test_levels_are_stored_once_and_observe_raises_the_right_one(tmp_path):
    db = SQLiteDatabase(tmp_path / "t.sqlite")
    calls = []

    def measure() -> Peaks:
        calls.append(1)
        return Peaks(1e12, 20e9, LEVELS)

    roof = MeasuredRoofline(db, "cpu", measure)
    assert MeasuredRoofline(db, "cpu", measure).peaks == roof.peaks and calls == [1]
    roof.observe(0.0, 1e6, 1e6 / 300e9)              # an L2 kernel at 300 GB/s
    assert [lv.bandwidth for lv in roof.peaks.levels] == [400e9, pytest.approx(300e9), 100e9]
    assert roof.peaks.bytes == 20e9
    roof.observe(0.0, 1e9, 1e9 / 25e9)               # a DRAM kernel at 25 GB/s
    assert roof.peaks.bytes == pytest.approx(25e9)
    assert MeasuredRoofline(db, "cpu", measure).peaks == roof.peaks and calls == [1]


def test_an_old_database_without_levels_gets_them_measured(tmp_path):
    db = SQLiteDatabase(tmp_path / "t.sqlite")
    db.set_peak("cpu", "flops", 1e12)
    db.set_peak("cpu", "bytes", 20e9)
    roof = MeasuredRoofline(db, "cpu", lambda: Peaks(5.0, 5.0, LEVELS))
    assert roof.peaks == Peaks(1e12, 20e9, LEVELS)   # the stored peaks kept, levels added


def test_sizes_come_from_sysfs_and_scale_with_cores(tmp_path):
    for i, (level, kind, size, shared) in enumerate(
            [(1, "Data", "48K", "0"), (1, "Instruction", "32K", "0"),
             (2, "Unified", "1024K", "0"), (3, "Unified", "32768K", "0-1")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for name, text in (("level", str(level)), ("type", kind), ("size", size),
                           ("shared_cpu_list", shared)):
            (d / name).write_text(text + "\n")
    assert cache_sizes(2, tmp_path) == {"L1": 96 << 10, "L2": 2 << 20, "L3": 32 << 20}
    assert cache_sizes(1, tmp_path / "missing")["L3"] == 32 << 20   # defaults


def test_measured_levels_are_faster_than_dram():
    """The native streams run: every level positive and finite, L1 well above DRAM (a cache
    ~10x DRAM here; 2x leaves room for a busy host)."""
    probe = StreamProbe()
    [l1] = probe.levels({"L1": cache_sizes()["L1"]}, repeats=3)
    dram = probe.read_bandwidth(np.ones(16 << 20, np.float32), repeats=2)
    assert math.isfinite(l1.bandwidth) and dram > 0
    assert l1.bandwidth > 2 * dram


MODEL = '''
import numpy as np

def f(a, b, c):
    return a * 2.0 + 1.0, np.tanh(b) * 0.5, c * c + 3.0
'''


def test_no_kernel_of_a_small_model_is_above_its_cache_bound(tmp_path, monkeypatch, capsys):
    """explain with measured peaks: three elementwise kernels whose working sets fit L1, L2
    and L3 are bounded by those levels, none above 100 % (110 %: timing noise)."""
    from tilefuse.cli import main
    from tilefuse.codegen.target import host_target
    from tilefuse.tune.fingerprint import target_string

    sizes = cache_sizes()
    db = SQLiteDatabase(tmp_path / "t.sqlite")
    target = target_string(host_target())
    MeasuredRoofline(db, target, probe=lambda: PeakProbe(((96, 80, 64),), copy_bytes=64 << 20,
                                                         sizes=sizes))   # the real levels
    db.set_peak(target, "flops", 1e15)   # the tiny probe matmul's rate would bound by compute
    db.close()
    (tmp_path / "smallmodel.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # working sets (input + output, f32): a quarter of L1, of L2 and of L3
    n1, n2, n3 = (sizes[k] // 4 // 8 for k in ("L1", "L2", "L3"))
    report = tmp_path / "e.json"
    assert main(["explain", "smallmodel:f", "--input", f"a={n1}", "--input", f"b={n2}",
                 "--input", f"c={n3}", "--db", str(tmp_path / "t.sqlite"), "--rounds", "5",
                 "--json", str(report)]) == 0
    sys.modules.pop("smallmodel", None)
    out = capsys.readouterr().out
    assert "L1 (<=" in out and "DRAM" in out
    kernels = json.loads(report.read_text())["kernels"]
    by_bytes = sorted(kernels, key=lambda k: k["bytes"])
    assert [k["bound_by"] for k in by_bytes] == ["L1", "L2", "L3"], out
    assert all(0 < k["percent_of_bound"] <= 110 for k in kernels), out
