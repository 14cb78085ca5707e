"""Runners: build (lower + compile) and time candidate schedules.

Every measurement follows :func:`measure_schedule`: validate, build, run once, compare every
output with the reference (the ops' NumPy references on the same fresh random inputs, at the
kernel's real shape; contraction and row kernels get the reduction tolerance), then warm up and
time ``repeats`` runs (each long enough to time: a run under ``min_repeat_seconds`` is repeated
inside one timing) and keep the median. A candidate that does not validate, fails to build,
computes a wrong answer, crashes the process or runs past the timeout scores ``inf``, with a
status saying which.

- :class:`InProcessRunner` (trivial) measures in the calling process: no isolation, for
  debugging and for kernels known to be safe.
- :class:`LocalRunner` measures in one worker process per task, started with the ``spawn``
  context: the task travels as plain data, the worker makes its inputs and reference once and
  then measures schedule after schedule (sent as JSON). A worker that dies (a segfault, an
  abort) or does not answer within ``timeout`` seconds is killed and replaced for the next
  candidate, and the candidate scores inf.

A Ray runner (measurements spread over a cluster) would be another :class:`Runner`: it ships
``task.wire()`` and schedule JSON to remote workers running :func:`worker_loop`'s logic and maps
their replies to :class:`MeasureResult`; it is not part of this slice.

:class:`PlantedFault` makes a worker misbehave on chosen schedules (abort, hang, corrupt the
output, raise), so tests can check that the tuner goes on.
"""

from __future__ import annotations

import abc
import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from tilefuse.errors import TilefuseError
from tilefuse.graph.ir import Value
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.schedule import Schedule, ScheduleError, validate
from tilefuse.testing import assert_close
from tilefuse.tune.task import TuneTask

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
    """What measuring one task needs once: the inputs and the reference outputs."""

    task: TuneTask
    inputs: dict[Value, np.ndarray]
    reference: list[np.ndarray]

    @staticmethod
    def start(task: TuneTask, seed: int) -> Session:
        inputs = task.random_inputs(np.random.default_rng(seed))
        return Session(task, inputs, task.reference(inputs))


def measure_schedule(session: Session, schedule: Schedule, options: MeasureOptions,
                     fault: PlantedFault | None = None) -> MeasureResult:
    """Validates, builds, checks and times ``schedule`` in this process (see the module
    docstring); never raises for a bad candidate."""
    task = session.task
    try:
        validate(schedule, task.extents())
    except ScheduleError as err:
        return MeasureResult(schedule, math.inf, INVALID, str(err))
    try:
        built = task.build(schedule, session.inputs)
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
    times = time_runs(built.run, options)
    return MeasureResult(schedule, statistics.median(times), OK, times=tuple(times))


def time_runs(run: Any, options: MeasureOptions) -> list[float]:
    """Seconds per call of ``run``: ``warmup`` calls, then ``repeats`` timings, each of enough
    calls to last ``min_repeat_seconds``."""
    for _ in range(max(0, options.warmup)):
        run()
    start = time.perf_counter()
    run()
    once = max(time.perf_counter() - start, 1e-9)
    inner = max(1, min(10_000, math.ceil(options.min_repeat_seconds / once)))
    times = []
    for _ in range(max(1, options.repeats)):
        start = time.perf_counter()
        for _ in range(inner):
            run()
        times.append((time.perf_counter() - start) / inner)
    return times


class Runner(abc.ABC):
    """Measures candidate schedules of a task; use as a context manager to release workers."""

    @abc.abstractmethod
    def measure(self, task: TuneTask, schedules: Sequence[Schedule]) -> list[MeasureResult]:
        """One result per schedule, in order; bad candidates score inf, nothing raises."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Releases any worker."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessRunner(Runner):
    """The trivial runner: measures in this process (a crashing candidate takes it down)."""

    def __init__(self, options: MeasureOptions | None = None):
        self.options = options or MeasureOptions()
        self._sessions: dict[str, Session] = {}

    def measure(self, task: TuneTask, schedules: Sequence[Schedule]) -> list[MeasureResult]:
        key = task.fingerprint()
        if key not in self._sessions:
            self._sessions = {key: Session.start(task, self.options.seed)}
        return [measure_schedule(self._sessions[key], s, self.options) for s in schedules]


def worker_loop(conn: Connection, wire: dict[str, Any], options: MeasureOptions,
                fault: PlantedFault | None) -> None:
    """A worker process: make the task's session, say ready, then answer each schedule JSON
    with ``(seconds, status, message, times)`` until None or the pipe closes."""
    session = Session.start(TuneTask.from_wire(wire), options.seed)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            text = conn.recv()
        except (EOFError, OSError):
            return
        if text is None:
            return
        r = measure_schedule(session, Schedule.from_json(text), options, fault)
        conn.send((r.seconds, r.status, r.message, r.times))


class _Worker:
    """One worker process and its end of the pipe."""

    def __init__(self, task: TuneTask, options: MeasureOptions, fault: PlantedFault | None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_loop, args=(child, task.wire(), options, fault),
                                   daemon=True)
        self.process.start()
        child.close()
        self.key = task.fingerprint()
        if not self.conn.poll(options.startup_timeout):
            self.kill()
            raise TilefuseError("tuning worker did not start in time")
        try:
            self.conn.recv()
        except (EOFError, OSError) as err:
            self.kill()
            raise TilefuseError(f"tuning worker died while starting "
                                f"(exit code {self.process.exitcode})") from err

    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
            self.process.join(5)
        except (OSError, ValueError):
            pass
        self.kill()


class LocalRunner(Runner):
    """Measures in a spawned worker process per task with a timeout (module docstring).
    ``workers_started`` counts the processes started (a replaced worker adds one)."""

    def __init__(self, options: MeasureOptions | None = None,
                 fault: PlantedFault | None = None):
        self.options = options or MeasureOptions()
        self.fault = fault
        self.workers_started = 0
        self._worker: _Worker | None = None

    def _worker_for(self, task: TuneTask) -> _Worker:
        worker = self._worker
        if worker is not None and (worker.key != task.fingerprint() or not worker.alive()):
            worker.stop()
            worker = self._worker = None
        if worker is None:
            self.workers_started += 1
            worker = self._worker = _Worker(task, self.options, self.fault)
        return worker

    def measure(self, task: TuneTask, schedules: Sequence[Schedule]) -> list[MeasureResult]:
        return [self._measure_one(task, s) for s in schedules]

    def _measure_one(self, task: TuneTask, schedule: Schedule) -> MeasureResult:
        try:
            validate(schedule, task.extents())
        except ScheduleError as err:
            return MeasureResult(schedule, math.inf, INVALID, str(err))
        try:
            worker = self._worker_for(task)
        except TilefuseError as err:
            self._worker = None
            return MeasureResult(schedule, math.inf, CRASH, str(err))
        try:
            worker.conn.send(schedule.to_json())
            if not worker.conn.poll(self.options.timeout):
                worker.kill()
                self._worker = None
                return MeasureResult(schedule, math.inf, TIMEOUT,
                                     f"no answer within {self.options.timeout} s")
            seconds, status, message, times = worker.conn.recv()
        except (EOFError, OSError):
            worker.kill()
            self._worker = None
            return MeasureResult(schedule, math.inf, CRASH,
                                 f"worker died (exit code {worker.process.exitcode})")
        return MeasureResult(schedule, seconds, status, message, tuple(times))

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None


__all__ = ["BUILD_ERROR", "CRASH", "INVALID", "OK", "TIMEOUT", "WRONG", "InProcessRunner",
           "LocalRunner", "MeasureOptions", "MeasureResult", "PlantedFault", "Runner", "Session",
           "measure_schedule", "time_runs", "worker_loop"]
