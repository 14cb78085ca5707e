"""Measuring one candidate schedule: build it (lower + compile), check its output against the
ops' references on fresh random inputs at the kernel's real shape, then time it (median of
``repeats`` runs, each long enough to time) - :func:`measure_schedule`. The runners
(:mod:`tilefuse.tune.runner`, :mod:`tilefuse.tune.runner_ray`) call it in this process, in
worker processes or on a Ray cluster; :class:`PlantedFault` makes it misbehave on purpose for
the tests of those runners."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tilefuse.codegen.pool import thread_pool
from tilefuse.errors import TilefuseError
from tilefuse.graph.ir import Value
from tilefuse.kernel.plan import KernelKind
from tilefuse.kernel.schedule import Schedule, ScheduleError, validate
from tilefuse.testing import assert_close
from tilefuse.tune.task import BuiltKernel, SessionKernels, TuneTask

OK, INVALID, BUILD_ERROR, WRONG, CRASH, TIMEOUT = ("ok", "invalid", "build_error", "wrong",
                                                   "crash", "timeout")
FAULTS = ("abort", "hang", "corrupt", "raise")


@dataclass(frozen=True)
class MeasureResult:
    """One candidate's outcome: median ``seconds`` (inf unless ``status`` is ok)."""

    schedule: Schedule
    seconds: float
    status: str
    message: str = ""
    times: tuple[float, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == OK and math.isfinite(self.seconds)


@dataclass(frozen=True)
class MeasureOptions:
    """How to time: ``warmup`` runs, then ``repeats`` timings of at least
    ``min_repeat_seconds`` each; ``timeout`` bounds one candidate (build, check and timing);
    ``seed`` seeds the random inputs."""

    warmup: int = 1
    repeats: int = 5
    min_repeat_seconds: float = 2e-3
    timeout: float = 60.0
    startup_timeout: float = 300.0
    seed: int = 0
    flush_bytes: int = 16 << 20
    """Bytes of a scratch buffer written before every timed call (0: none, and nothing else
    of :func:`before_each_call` either), so that each call finds the machine as a kernel
    inside a model does (the kernels before it took the caches), not as the last call of the
    same kernel left it."""


@dataclass(frozen=True)
class PlantedFault:
    """Test hook: on the schedules whose JSON is in ``schedules``, the measuring process
    aborts (``os.abort()``), hangs (sleeps ``hang_seconds``), corrupts the first output after
    the run, or raises."""

    kind: str
    schedules: frozenset[str] = field(default_factory=frozenset)
    hang_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if self.kind not in FAULTS:
            raise TilefuseError(f"fault kind must be one of {FAULTS}, got {self.kind!r}")

    def before_run(self, schedule: Schedule) -> None:
        if schedule.to_json() not in self.schedules:
            return
        if self.kind == "abort":
            os.abort()
        if self.kind == "hang":
            time.sleep(self.hang_seconds)
        if self.kind == "raise":
            raise TilefuseError("planted fault")

    def after_run(self, schedule: Schedule, outputs: list[np.ndarray]) -> None:
        if self.kind == "corrupt" and schedule.to_json() in self.schedules and outputs:
            outputs[0].reshape(-1)[: max(1, outputs[0].size // 7)] += 1.0


@dataclass
class Session:
    """What measuring one task needs once: the inputs, the reference outputs and the scratch
    buffer the timings flush the caches with (:func:`flush_scratch`), and the kernels its
    builds compiled."""

    task: TuneTask
    inputs: dict[Value, np.ndarray]
    reference: list[np.ndarray]
    scratch: np.ndarray | None = None
    kernels: SessionKernels = field(default_factory=SessionKernels)
    """The kernels its builds compiled, by loop IR: a candidate measured again, or another
    that lowers to the same loops, is not compiled again."""

    @staticmethod
    def start(task: TuneTask, options: MeasureOptions) -> Session:
        inputs = task.random_inputs(np.random.default_rng(options.seed))
        return Session(task, inputs, task.reference(inputs), flush_scratch(options))


def build_checked(session: Session, schedule: Schedule, options: MeasureOptions,
                  fault: PlantedFault | None = None) -> BuiltKernel | MeasureResult:
    """Validates, builds, runs once and checks ``schedule`` in this process: the built kernel,
    ready to time, or the failed candidate's result (never raises for a bad candidate)."""
    task = session.task
    try:
        validate(schedule, task.extents())
    except ScheduleError as err:
        return MeasureResult(schedule, math.inf, INVALID, str(err))
    try:
        built = task.build(schedule, session.inputs, kernels=session.kernels)
        if fault is not None:
            fault.before_run(schedule)
        built.run()
    except TilefuseError as err:
        return MeasureResult(schedule, math.inf, BUILD_ERROR, str(err))
    if fault is not None:
        fault.after_run(schedule, built.outputs)
    reduction = task.kind is not KernelKind.ELEMENTWISE
    try:
        for got, want in zip(built.outputs, session.reference):
            assert_close(got, want, reduction=reduction, msg=str(schedule))
    except AssertionError as err:
        return MeasureResult(schedule, math.inf, WRONG, str(err)[:500])
    return built


def timed(session: Session, schedule: Schedule, built: BuiltKernel,
          options: MeasureOptions, inner: int | None = None) -> MeasureResult:
    """The result of timing a checked build (:func:`time_runs`, each call after
    :func:`before_each_call`; the median); ``inner`` as there."""
    times = time_runs(built.run, options, before_each_call(session, built), inner)
    return MeasureResult(schedule, statistics.median(times), OK, times=tuple(times))


def measure_schedule(session: Session, schedule: Schedule, options: MeasureOptions,
                     fault: PlantedFault | None = None) -> MeasureResult:
    """Validates, builds, checks and times ``schedule`` in this process (see the module
    docstring); never raises for a bad candidate."""
    built = build_checked(session, schedule, options, fault)
    if isinstance(built, MeasureResult):
        return built
    return timed(session, schedule, built, options)


FLUSHED_CALLS = 20
"""The most calls a timing makes when each call is flushed and timed on its own."""


def calls_per_timing(seconds: float, options: MeasureOptions, flushed: bool) -> int:
    """How many calls of ``seconds`` one timing makes to last ``min_repeat_seconds`` (at most
    :data:`FLUSHED_CALLS` when each call is flushed and timed alone)."""
    inner = max(1, min(10_000, math.ceil(options.min_repeat_seconds / max(seconds, 1e-9))))
    return min(inner, FLUSHED_CALLS) if flushed else inner


def flush_scratch(options: MeasureOptions) -> np.ndarray | None:
    """The buffer of ``options.flush_bytes`` a session flushes the caches with (None: no
    flush)."""
    if options.flush_bytes <= 0:
        return None
    return np.empty(options.flush_bytes // 4, np.float32)


def before_each_call(session: Session, built: BuiltKernel) -> Callable[[], None] | None:
    """What runs, untimed, before every timed call of ``built``, so that it finds the machine
    as a kernel in a model's call does (None when the session has no scratch):

    1. the scratch is written: the kernel's weights and last outputs leave L1 and L2 (the
       kernels before it in a model used them; L3, 300 MiB here, keeps the weights);
    2. its inputs are written again: in a model their producer just wrote them;
    3. the thread pool's workers are woken (:meth:`ThreadPool.wake`): in a model the kernel
       before left them polling, where after the flush they would sleep and be woken by the
       timed call (~0.25 ms a wake here).

    The flush alone timed ResNet-50's kernels 6-26 % slower than the same kernels in the model's
    call; with 2 and 3, within 0-11 % (docs/PERFORMANCE.md)."""
    if session.scratch is None:
        return None
    sources = [session.inputs[v] for v in session.task.graph.inputs]
    return as_in_a_model(session.scratch, list(zip(built.arrays, sources)))


def as_in_a_model(scratch: np.ndarray, written: Sequence[tuple[np.ndarray, np.ndarray]],
                  wake: bool = True) -> Callable[[], None]:
    """The preparation :func:`before_each_call` describes, for any callable (the benchmarks
    time BLAS peers under it too): write ``scratch``, copy each ``(destination, source)`` of
    ``written``, then, with ``wake``, wake tilefuse's thread pool."""
    pool = thread_pool() if wake else None

    def prepare() -> None:
        scratch.fill(1.0)
        for dst, src in written:
            np.copyto(dst, src)
        if pool is not None:
            pool.wake()
    return prepare


def time_runs(run: Any, options: MeasureOptions,
              flush: Callable[[], None] | None = None, inner: int | None = None) -> list[float]:
    """Seconds per call of ``run``: ``warmup`` calls, then ``repeats`` timings, each of enough
    calls to last ``min_repeat_seconds``, each call after ``flush`` where one is given
    (:func:`before_each_call`; BERT tuned with 16 MiB of it gained 1.01-1.05x in the
    whole layer, without it 0.99-1.02x, with 8 MiB 0.99-1.01x, where the isolated runs
    promised 1.2x: a weak effect, see docs/PERFORMANCE.md). ``inner``, the calls per timing
    that an earlier timing of the same warm build found (:func:`calls_per_timing`), skips the
    warm-up and the call that sizes a timing."""
    if inner is None:
        for _ in range(max(0, options.warmup)):
            run()
        start = time.perf_counter()
        run()
        inner = calls_per_timing(time.perf_counter() - start, options, flush is not None)
    times = []
    for _ in range(max(1, options.repeats)):
        total = 0.0
        if flush is None:
            start = time.perf_counter()
            for _ in range(inner):
                run()
            total = time.perf_counter() - start
        else:
            for _ in range(inner):
                flush()  # as a model leaves the machine (before_each_call); not timed
                start = time.perf_counter()
                run()
                total += time.perf_counter() - start
        times.append(total / inner)
    return times
