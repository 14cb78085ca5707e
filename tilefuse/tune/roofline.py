"""Roofline bounds: how fast a kernel could possibly run on this machine.

A kernel doing ``flops`` over ``bytes`` of compulsory traffic (every input read, every output
written once) cannot beat ``min(peak_flops, bandwidth × intensity)`` FLOP/s, i.e. it needs at
least ``max(flops / peak_flops, bytes / bandwidth)`` seconds. The tuner stops a kernel within a
margin of that time, and a user can see whether a kernel is slow by design.

- :class:`NoRoofline` (trivial): a bound of 0 s, so the tuner never stops early.
- :class:`MeasuredRoofline`: peaks measured once per target (FLOP/s: the fastest of NumPy's
  sgemm and tilefuse's own matmul kernel on the :data:`PROBE_SHAPES` products; bytes/s: a
  large copy into a reused buffer; the best of :data:`STORED_REPEATS` runs) and kept in the tuning
  database. A
  kernel measured faster than a peak allows proves the peak low (it was measured on a busy
  machine, or BLAS is slower than tilefuse's kernel): :meth:`Roofline.observe` raises the
  stored peak to what was achieved, so a bound is never above 100% of reach. Its
  :meth:`~MeasuredRoofline.measure_now` measures the peaks again in about half a second: the
  tuner's confirmation takes them between its passes, so that a kernel's share of its bound
  compares timings a second apart, not a kernel now against a peak taken in another spell
  of a shared host whose speed moves by 10-30 % (:func:`~tilefuse.tune.tuner.tune_task`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.schedules.database import TuningDatabase


@dataclass(frozen=True)
class Peaks:
    flops: float
    bytes: float


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
    """The least seconds of a kernel doing ``flops`` over ``nbytes`` at ``peaks``."""
    return max(flops / peaks.flops, nbytes / peaks.bytes)


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
    NumPy's BLAS and by tilefuse's kernel with its default schedule; the fastest FLOP rate
    counts) and a copy of ``copy_bytes`` into a buffer already touched (read + write:
    2 × 256 MiB, more than the 300 MiB of L3 here)."""

    def __init__(self, shapes: tuple[tuple[int, int, int], ...] = PROBE_SHAPES,
                 copy_bytes: int = 256 << 20):
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

    def peaks(self, repeats: int, statistic: Callable[[Callable[[], object], int], float]
              ) -> Peaks:
        """Peaks from ``statistic`` (e.g. the best time) of ``repeats`` runs each."""
        flops = max(work / statistic(fn, repeats) for work, fn in self.matmuls)
        return Peaks(flops, self.copied / statistic(self.copy, repeats))


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
        if flops is None or nbytes is None:
            # the stored peaks: ``measure``, else the probe measure_now uses, set up once
            peaks = measure() if measure is not None else self._get_probe().peaks(
                STORED_REPEATS, _best_seconds)
            flops, nbytes = peaks.flops, peaks.bytes
            db.set_peak(target, "flops", flops)
            db.set_peak(target, "bytes", nbytes)
        self.peaks = Peaks(flops, nbytes)

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
        achieved = Peaks(max(self.peaks.flops, flops / seconds),
                         max(self.peaks.bytes, nbytes / seconds))
        if achieved.flops > self.peaks.flops:
            self.db.set_peak(self.target, "flops", achieved.flops)
        if achieved.bytes > self.peaks.bytes:
            self.db.set_peak(self.target, "bytes", achieved.bytes)
        self.peaks = achieved


__all__ = ["PROBE_SHAPES", "STORED_REPEATS", "MeasuredRoofline", "NoRoofline", "PeakProbe",
           "Peaks", "Roofline", "bound_at"]
