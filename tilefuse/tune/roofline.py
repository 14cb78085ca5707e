"""Roofline bounds: how fast a kernel could possibly run on this machine.

A kernel doing ``flops`` over ``bytes`` of compulsory traffic (every input read, every output
written once) cannot beat ``min(peak_flops, bandwidth × intensity)`` FLOP/s, i.e. it needs at
least ``max(flops / peak_flops, bytes / bandwidth)`` seconds. The tuner stops a kernel within a
margin of that time, and a user can see whether a kernel is slow by design.

- :class:`NoRoofline` (trivial): a bound of 0 s, so the tuner never stops early.
- :class:`MeasuredRoofline`: peaks measured once per target (FLOP/s: the cores' FMA roof,
  a register-only FMA loop on every core (:mod:`~tilefuse.tune.fma_peak`), or the fastest of
  NumPy's sgemm and tilefuse's own matmul kernel on the :data:`PROBE_SHAPES` products if that
  is faster; bytes/s: a large copy into a reused buffer; the best of :data:`STORED_REPEATS`
  runs) and kept in the tuning database. A database written before the FMA roof existed
  (its compute peak a matmul's rate, half the roof when measured on a busy host) gets the FMA
  roof measured and stored beside it (``flops_fma``); the larger of the two is the roof. A
  kernel measured faster than a peak allows proves the peak low (it was measured on a busy
  machine, or BLAS is slower than tilefuse's kernel): :meth:`Roofline.observe` raises the
  stored peak to what was achieved, so a bound is never above 100% of reach. Its
  :meth:`~MeasuredRoofline.measure_now` measures the peaks again in about half a second: the
  tuner's confirmation takes them between its passes, so that a kernel's share of its bound
  compares timings a second apart, not a kernel now against a peak taken in another spell
  of a shared host whose speed moves by 10-30 % (:func:`~tilefuse.tune.tuner.tune_task`).

The memory roof depends on where a kernel's data sits: :attr:`Peaks.levels` holds the
bandwidth of L1, L2 and L3 (:mod:`~tilefuse.tune.bandwidth`: native read and copy streams on
every core, sized for each level), and a kernel is bounded by the first level its working set
(its compulsory bytes) fits in, DRAM (:attr:`Peaks.bytes`) past the last. Kernels are timed
repeatedly on the same buffers, so a working set that fits a cache is in it.
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.schedules.database import TuningDatabase
from tilefuse.tune.bandwidth import Level, StreamProbe, cache_sizes
from tilefuse.tune.fma_peak import FmaProbe


@dataclass(frozen=True)
class Peaks:
    """FLOP/s, DRAM bytes/s (read + write), and the cache levels' roofs, smallest first
    (none: every kernel is bounded by DRAM)."""

    flops: float
    bytes: float
    levels: tuple[Level, ...] = ()

    def level_for(self, nbytes: float) -> Level:
        """The level a working set of ``nbytes`` fits in (DRAM past the caches); a cache's
        bandwidth is never taken below DRAM's (:meth:`Roofline.observe` may raise DRAM's)."""
        for level in self.levels:
            if nbytes <= level.capacity:
                return Level(level.name, level.capacity, max(level.bandwidth, self.bytes))
        return Level("DRAM", math.inf, self.bytes)


class Roofline(abc.ABC):
    """Gives the least time a kernel of given work can take."""

    @abc.abstractmethod
    def bound_seconds(self, flops: float, nbytes: float) -> float:
        """A lower bound on the seconds of a kernel doing ``flops`` over ``nbytes``."""

    def observe(self, flops: float, nbytes: float, seconds: float) -> None:  # noqa: B027
        """A kernel doing ``flops`` over ``nbytes`` ran in ``seconds`` (raises peaks it
        beats; nothing by default)."""

    def measure_now(self) -> Peaks | None:
        """The peaks measured again now, in a fraction of a second, for a bound paired with
        kernel timings taken beside it (:func:`bound_at`); None when this roofline measures
        nothing."""
        return None


def bound_at(peaks: Peaks, flops: float, nbytes: float) -> float:
    """The least seconds of a kernel doing ``flops`` over ``nbytes`` at ``peaks`` (the
    memory roof of the level ``nbytes`` fits in)."""
    return max(flops / peaks.flops, nbytes / peaks.level_for(nbytes).bandwidth)


def mean_peaks(a: Peaks, b: Peaks) -> Peaks:
    """The mean of two measurements of the peaks (levels matched by name)."""
    theirs = {lv.name: lv for lv in b.levels}
    levels = tuple(Level(lv.name, lv.capacity, (lv.bandwidth + theirs[lv.name].bandwidth) / 2)
                   for lv in a.levels if lv.name in theirs)
    return Peaks((a.flops + b.flops) / 2, (a.bytes + b.bytes) / 2, levels)


class NoRoofline(Roofline):
    """The trivial roofline: no bound."""

    def bound_seconds(self, flops: float, nbytes: float) -> float:
        return 0.0


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


PROBE_SHAPES = ((1024, 1024, 1024), (512, 768, 3072), (2048, 256, 512))
"""The (M, K, N) f32 products the compute peak is the fastest of: square, wide with a short M
(a transformer's FFN), and one whose B stays in L2 (a convolution's): their kernels reach
different rates here, and 1024³ alone was beaten by ResNet-50's 3x3 convolutions by 13-25 %."""


class PeakProbe:
    """The measurements behind the peaks, set up once: f32 matmuls of ``shapes`` (each by
    NumPy's BLAS and by tilefuse's kernel with its default schedule) and the FMA loop of
    :class:`~tilefuse.tune.fma_peak.FmaProbe` (the fastest FLOP rate counts), a copy of
    ``copy_bytes`` into a buffer already touched (read + write: 2 × 256 MiB, more than the
    32-300 MiB of L3 of the hosts here) and a native read of it
    (DRAM: the faster of the two), and the cache levels' streams
    (:class:`~tilefuse.tune.bandwidth.StreamProbe`) sized by ``sizes`` (default: sysfs)."""

    def __init__(self, shapes: tuple[tuple[int, int, int], ...] = PROBE_SHAPES,
                 copy_bytes: int = 256 << 20, sizes: dict[str, int] | None = None):
        rng = np.random.default_rng(0)
        self.matmuls: list[tuple[float, Callable[[], object]]] = []
        for m, k, n in shapes:
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            c = np.empty((m, n), np.float32)
            self.matmuls.append((2.0 * m * k * n, lambda a=a, b=b, c=c: np.matmul(a, b, out=c)))
            self.matmuls.append((2.0 * m * k * n, _tilefuse_matmul(a, b, c)))
        src = np.ones(copy_bytes // 4, np.float32)
        dst = np.zeros_like(src)
        self.copied = 2.0 * src.nbytes
        self.copy = lambda: np.copyto(dst, src)
        self.src = src
        self.sizes = cache_sizes() if sizes is None else sizes
        self.streams = StreamProbe()
        self.fma = FmaProbe()

    def levels(self, repeats: int) -> tuple[Level, ...]:
        """The cache levels' roofs, the best of ``repeats`` runs of each stream."""
        return tuple(self.streams.levels(self.sizes, repeats))

    def peaks(self, repeats: int, statistic: Callable[[Callable[[], object], int], float]
              ) -> Peaks:
        """Peaks from ``statistic`` (e.g. the best time) of ``repeats`` runs each (the
        streams: the best)."""
        flops = max([self.fma.flops_per_second(repeats),
                     *(work / statistic(fn, repeats) for work, fn in self.matmuls)])
        dram = max(self.copied / statistic(self.copy, repeats),
                   self.streams.read_bandwidth(self.src, repeats))
        return Peaks(flops, dram, self.levels(repeats))


FMA_KEY = "flops_fma"
"""The database's name for the FMA roof (:mod:`~tilefuse.tune.fma_peak`), stored beside
``flops`` so that a database written before it existed gets it measured once."""


STORED_REPEATS = 8
"""Runs of each probe measurement behind the stored peaks (the best counts)."""


PAIRED_REPEATS = 3
"""Runs of each probe measurement behind :meth:`MeasuredRoofline.measure_now` (the best
counts; ~0.6 s in all here)."""


def _tilefuse_matmul(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Callable[[], None]:
    """``c = a @ b`` by tilefuse's matmul kernel (default schedule, B packed once)."""
    from tilefuse.codegen import compile_kernel, host_target
    from tilefuse.driver import plan_kernels
    from tilefuse.graph.builder import GraphBuilder
    from tilefuse.kernel.lower_matmul import lower_matmul
    from tilefuse.kernel.schedule import default_schedule

    builder = GraphBuilder("peak")
    x = builder.input((a.shape, DType.f32), "a")
    w = builder.input((b.shape, DType.f32), "b")
    [group] = plan_kernels(builder.build([builder.add1("matmul", [x, w])])).groups
    lowered = lower_matmul(group, default_schedule(group, host_target()), constant_b=True)
    [fn] = lowered.functions
    kernel = compile_kernel(fn)
    arrays = {lowered.constant_b: lowered.prepare_b(b)}
    args = [arrays.get(p.name) if p.name in arrays else
            (a if lowered.bindings[p.name] is x else c) for p in fn.buffers]
    return lambda: kernel(*args)


class MeasuredRoofline(Roofline):
    """Peaks from ``db`` for ``target``, measured (and stored) when missing."""

    def __init__(self, db: TuningDatabase, target: str,
                 measure: Callable[[], Peaks] | None = None,
                 probe: Callable[[], PeakProbe] = PeakProbe):
        self.db, self.target, self.make_probe = db, target, probe
        self._probe: PeakProbe | None = None
        flops, nbytes = db.peak(target, "flops"), db.peak(target, "bytes")
        levels = _stored_levels(db, target)
        if flops is None or nbytes is None or levels is None:
            # the stored peaks: ``measure``, else the probe measure_now uses, set up once
            peaks = measure() if measure is not None else self._get_probe().peaks(
                STORED_REPEATS, _best_seconds)
            if flops is None or nbytes is None:
                flops, nbytes = peaks.flops, peaks.bytes
                db.set_peak(target, "flops", flops)
                db.set_peak(target, "bytes", nbytes)
                db.set_peak(target, FMA_KEY, flops)   # measured with the FMA roof (or given)
            levels = peaks.levels
            _store_levels(db, target, levels)
        fma = db.peak(target, FMA_KEY)
        if fma is None:
            # stored by a tilefuse whose compute peak was a matmul's rate only
            probe = self._probe.fma if self._probe is not None else FmaProbe()
            fma = probe.flops_per_second(STORED_REPEATS) if measure is None else flops
            db.set_peak(target, FMA_KEY, fma)
        self.peaks = Peaks(max(flops, fma), nbytes, levels)

    def _get_probe(self) -> PeakProbe:
        if self._probe is None:
            self._probe = self.make_probe()
        return self._probe

    def measure_now(self) -> Peaks:
        """The best of :data:`PAIRED_REPEATS` runs of each probe measurement, now (the stored
        peaks are the best of more, taken once, perhaps in another spell of the host)."""
        return self._get_probe().peaks(PAIRED_REPEATS, _best_seconds)

    def attainable_flops(self, flops: float, nbytes: float) -> float:
        """``min(peak_flops, bandwidth × arithmetic intensity)``."""
        return min(self.peaks.flops, self.peaks.bytes * flops / max(nbytes, 1.0))

    def bound_seconds(self, flops: float, nbytes: float) -> float:
        return bound_at(self.peaks, flops, nbytes)

    def observe(self, flops: float, nbytes: float, seconds: float) -> None:
        if not (seconds > 0 and seconds < float("inf")):
            return
        rate = nbytes / seconds
        level = self.peaks.level_for(nbytes)
        dram = max(self.peaks.bytes, rate) if level.name == "DRAM" else self.peaks.bytes
        levels = tuple(Level(lv.name, lv.capacity, max(lv.bandwidth, rate))
                       if lv.name == level.name else lv for lv in self.peaks.levels)
        achieved = Peaks(max(self.peaks.flops, flops / seconds), dram, levels)
        if achieved.flops > self.peaks.flops:
            self.db.set_peak(self.target, "flops", achieved.flops)
        if achieved.bytes > self.peaks.bytes:
            self.db.set_peak(self.target, "bytes", achieved.bytes)
        if achieved.levels != self.peaks.levels:
            _store_levels(self.db, self.target, achieved.levels)
        self.peaks = achieved


def _stored_levels(db: TuningDatabase, target: str) -> tuple[Level, ...] | None:
    """The cache levels stored for ``target`` (``levels``: their count; ``capacity_L1``,
    ``bytes_L1``, ...), None when none were stored."""
    count = db.peak(target, "levels")
    if count is None:
        return None
    levels = []
    for i in range(1, int(count) + 1):
        capacity, bandwidth = db.peak(target, f"capacity_L{i}"), db.peak(target, f"bytes_L{i}")
        if capacity is None or bandwidth is None:
            return None
        levels.append(Level(f"L{i}", capacity, bandwidth))
    return tuple(levels)


def _store_levels(db: TuningDatabase, target: str, levels: tuple[Level, ...]) -> None:
    for i, level in enumerate(levels, 1):
        db.set_peak(target, f"capacity_L{i}", level.capacity)
        db.set_peak(target, f"bytes_L{i}", level.bandwidth)
    db.set_peak(target, "levels", float(len(levels)))


__all__ = ["PROBE_SHAPES", "STORED_REPEATS", "MeasuredRoofline", "NoRoofline", "PeakProbe",
           "Peaks", "Roofline", "bound_at", "mean_peaks"]
