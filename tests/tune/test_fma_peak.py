"""The compute roof: a register-only FMA loop on every core, stored beside the matmul peak."""

from __future__ import annotations

import math
import time

import numpy as np

from tilefuse.tune.bandwidth import Level
from tilefuse.tune.database import SQLiteDatabase
from tilefuse.tune.fma_peak import FmaProbe, _fma_ir
from tilefuse.tune.roofline import FMA_KEY, MeasuredRoofline, Peaks, _store_levels


def test_the_loop_is_register_only_fmas():
    """Every round is ``chains`` vector FMAs and nothing touches memory in the loop."""
    import llvmlite.binding as llvm

    from tilefuse.codegen.target import host_target, target_machine

    target = host_target()
    tm = target_machine(target)
    probe = FmaProbe(threads=1)
    module = llvm.parse_assembly(_fma_ir(target.triple, str(tm.target_data), probe.lanes,
                                         probe.chains))
    asm = tm.emit_assembly(module)
    fmas = [line for line in asm.splitlines() if "vfmadd" in line]
    assert len(fmas) == probe.chains and not any("(" in line for line in fmas)
    assert probe.flops_per_round() == 2 * probe.lanes * probe.chains


def test_the_fma_roof_is_not_below_a_real_kernel():
    """A roof below what NumPy's sgemm reaches would put kernels above 100 % of their bound;
    best against best, every core each (0.8: a busy host's noise)."""
    fma = FmaProbe().flops_per_second(5)
    a = np.random.default_rng(0).standard_normal((512, 512), dtype=np.float32)
    c = np.empty_like(a)
    best = math.inf
    for _ in range(7):
        start = time.perf_counter()
        np.matmul(a, a, out=c)
        best = min(best, time.perf_counter() - start)
    assert math.isfinite(fma) and fma >= 0.8 * 2 * 512 ** 3 / best


def test_an_old_database_gets_the_fma_roof_measured_once(tmp_path):
    """Peaks stored by a tilefuse that measured only matmuls (a low compute peak) are raised
    to the FMA roof, which is stored; the stored matmul peak is left as it was."""
    db = SQLiteDatabase(tmp_path / "t.sqlite")
    db.set_peak("cpu", "flops", 1e9)
    db.set_peak("cpu", "bytes", 1e10)
    _store_levels(db, "cpu", (Level("L1", 1e5, 1e11),))
    roof = MeasuredRoofline(db, "cpu")
    fma = db.peak("cpu", FMA_KEY)
    assert fma is not None and fma > 1e9 and roof.peaks.flops == fma
    assert db.peak("cpu", "flops") == 1e9
    assert MeasuredRoofline(db, "cpu", lambda: Peaks(1.0, 1.0)).peaks.flops == fma
