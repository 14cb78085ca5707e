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
- :class:`LocalRunner` measures in worker processes (one per core by default), started with
  the ``spawn`` context: the task travels as plain data, each worker makes its inputs and
  reference once. A batch runs in two phases: the workers build and check its candidates at
  once (``("build", json)``: compiling is single-threaded, so on two cores two builds take the
  time of one; the worker keeps each checked build), then, after a short pause, the
  candidates are timed by the workers holding them, one timing at a time while every other
  worker waits (a kernel is never timed while anything else compiles: it uses all the cores),
  interleaved: ``repeats`` rounds, each timing every candidate once (``("repeat", json)``;
  ``("time", json)`` in the last round, after which the worker keeps the build among its
  recent ones, for the same schedule asked again; only the first round warms up and sizes
  the timing), the order reversed every other round, so that a slow spell of this
  shared machine falls on all of a batch's candidates alike rather than on the one being
  timed. A worker that dies (a segfault, an abort) or does not answer within ``timeout``
  seconds is killed and replaced for the next candidate, and the candidate scores inf; the
  other checked builds it held are built again, and measured, on its replacement. A plain
  schedule JSON still asks for a whole measurement.

:class:`~tilefuse.tune.runner_ray.RayRunner` spreads the measurements over a Ray cluster: it
ships ``task.wire()`` and schedule JSON to remote workers running :func:`measure_schedule` and
maps their replies to :class:`MeasureResult`.

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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from tilefuse.codegen.pool import thread_pool
from tilefuse.codegen.target import usable_cpus
from tilefuse.errors import TilefuseError
from tilefuse.kernel.schedule import Schedule, ScheduleError, validate
from tilefuse.tune.measure import (  # noqa: F401 - the runners' public names, re-exported
    BUILD_ERROR,
    CRASH,
    FAULTS,
    FLUSHED_CALLS,
    INVALID,
    OK,
    TIMEOUT,
    WRONG,
    MeasureOptions,
    MeasureResult,
    PlantedFault,
    Session,
    as_in_a_model,
    before_each_call,
    build_checked,
    calls_per_timing,
    flush_scratch,
    measure_schedule,
    time_runs,
    timed,
)
from tilefuse.tune.task import BuiltKernel, TuneTask


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
            self._sessions = {key: Session.start(task, self.options)}
        return [measure_schedule(self._sessions[key], s, self.options) for s in schedules]


BUILT = "built"
"""A worker's answer to ``("build", json)`` when the candidate built and checked:
``(BUILT, reused)``, ``reused`` when it was a recent build of the same schedule."""
SWITCH = "task"
"""The verb of ``(SWITCH, wire)``: the worker takes another task (:func:`worker_loop`)."""


def worker_loop(conn: Connection, wire: dict[str, Any], options: MeasureOptions,
                fault: PlantedFault | None, slot: int = 0) -> None:
    """A worker process: make the task's session, say ready, then answer each message until
    None or the pipe closes (:func:`worker_answer`). ``("task", wire)`` makes the session of
    another task (its builds dropped) and says ready again: one process serves every task of
    a tuning run, since starting one (spawn, imports) costs ~3.5 s here, more than measuring
    a kernel's default. Its thread is pinned to CPU ``slot`` and its pool's workers to the
    next ones (:meth:`ThreadPool.pin`: a kernel timed between pipe messages otherwise shared
    a core with the pool's worker in one timing of three, at up to twice its time), so the
    workers of slots 0 and 1 build on different cores."""
    session = Session.start(TuneTask.from_wire(wire), options)
    thread_pool().pin(slot)
    conn.send(("ready", os.getpid()))
    builds = WorkerBuilds()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        if isinstance(message, tuple) and message[0] == SWITCH:
            builds = WorkerBuilds()
            session = Session.start(TuneTask.from_wire(message[1]), options)
            conn.send(("ready", os.getpid()))
            continue
        conn.send(worker_answer(session, builds, message, options, fault))


@dataclass
class KeptBuild:
    """A checked build a worker holds between the rounds of its timing, with the calls per
    timing its first timing found (None before it: that one warms up and sizes)."""

    built: BuiltKernel
    inner: int | None = None


RECENT_BUILDS = 8
"""Checked builds a worker keeps after their timing, for the same schedule asked again on the
same task (the tuner's confirmation measures its contenders and the default 4 more times:
each pass rebuilt them, ~0.4 s of LLVM per ResNet-50 kernel, a fifth of a kernel's tuning)."""


@dataclass
class WorkerBuilds:
    """A worker's checked builds of its current task, by schedule JSON: ``kept`` are in a
    batch's timing; ``recent`` were timed, the last :data:`RECENT_BUILDS` of them."""

    kept: dict[str, KeptBuild] = field(default_factory=dict)
    recent: dict[str, BuiltKernel] = field(default_factory=dict)

    def reuse(self, text: str) -> bool:
        """Holds a recent build of ``text`` for a new timing (which warms up and sizes again,
        as a fresh build's would), if there is one."""
        built = self.recent.pop(text, None)
        if built is not None:
            self.kept[text] = KeptBuild(built)
        return built is not None

    def done(self, text: str) -> KeptBuild:
        """``text``'s timing ended: its build moves to ``recent``, the oldest dropped."""
        held = self.kept.pop(text)
        self.recent[text] = held.built
        while len(self.recent) > RECENT_BUILDS:
            del self.recent[next(iter(self.recent))]
        return held


def worker_answer(session: Session, builds: WorkerBuilds, message: str | tuple[str, str],
                  options: MeasureOptions, fault: PlantedFault | None) -> tuple[Any, ...]:
    """A schedule JSON: measure it, answer ``(seconds, status, message, times)``.
    ``("build", json)``: build and check it (or take its recent checked build) and keep the
    build, answer ``(BUILT, reused)``, or the failed candidate's 4-tuple. ``("repeat", json)``: one
    timing of the kept build, the 4-tuple; ``("time", json)``: the same, the last one (the
    build moves to the recent ones). Only a build's first timing warms up and sizes itself:
    the later rounds call a build that is warm (its check and first timing ran it), each call
    after :func:`before_each_call` as before, so a round costs its timed calls only (on W1 the
    warm-up and sizing calls were two thirds of the calls a candidate's timing made)."""
    if isinstance(message, str):
        r = measure_schedule(session, Schedule.from_json(message), options, fault)
    else:
        verb, text = message
        schedule = Schedule.from_json(text)
        if verb == "build":
            if builds.reuse(text):
                return (BUILT, True)
            built = build_checked(session, schedule, options, fault)
            if not isinstance(built, MeasureResult):
                builds.kept[text] = KeptBuild(built)
                return (BUILT, False)
            r = built
        else:
            held = builds.kept[text] if verb == "repeat" else builds.done(text)
            r = timed(session, schedule, held.built, replace(options, repeats=1), held.inner)
            if r.ok and held.inner is None:
                held.inner = calls_per_timing(r.seconds, options, session.scratch is not None)
    return r.seconds, r.status, r.message, r.times


class _Worker:
    """One worker process and its end of the pipe; :meth:`wait_ready` waits for its start."""

    def __init__(self, task: TuneTask, options: MeasureOptions, fault: PlantedFault | None,
                 slot: int = 0):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_loop,
                                   args=(child, task.wire(), options, fault, slot), daemon=True)
        self.process.start()
        child.close()
        self.startup_timeout = options.startup_timeout
        self.ready = False

    def switch(self, task: TuneTask) -> None:
        """Asks the (ready) worker to take ``task`` instead; :meth:`wait_ready` then waits for
        its new session."""
        self.conn.send((SWITCH, task.wire()))
        self.ready = False

    def wait_ready(self) -> None:
        """Returns once the worker has made its session; TilefuseError (and the worker
        killed) when it dies or takes longer than ``startup_timeout``."""
        if self.ready:
            return
        if not self.conn.poll(self.startup_timeout):
            self.kill()
            raise TilefuseError("tuning worker did not start in time")
        try:
            self.conn.recv()
        except (EOFError, OSError) as err:
            self.kill()
            raise TilefuseError(f"tuning worker died while starting "
                                f"(exit code {self.process.exitcode})") from err
        self.ready = True

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


def default_build_workers() -> int:
    """One build worker per core this process may run on."""
    return usable_cpus()


SETTLE_SECONDS = 0.1
"""The pause between a parallel build phase and the timings that follow it (a precaution: an
interleaved A/B on W1 found no difference between 0, 0.3 and 1 s beyond the machine's noise)."""


@dataclass(frozen=True)
class Span:
    """When the runner waited on a worker (``time.perf_counter`` seconds) for one candidate
    of the last batch: ``phase`` is build (build and check) or time."""

    phase: str
    index: int
    start: float
    end: float


class LocalRunner(Runner):
    """Measures in spawned worker processes with a timeout (module docstring). A batch is
    built and checked on up to ``build_workers`` workers at once (default: one per core),
    then timed one candidate at a time in the order given while every other worker waits,
    so no compile shares the machine with a timing. ``workers_started`` counts the processes
    started (a replaced worker adds one), ``builds_reused`` the candidates a worker did not
    build again (:class:`WorkerBuilds`); ``spans`` records the last batch's phases."""

    def __init__(self, options: MeasureOptions | None = None,
                 fault: PlantedFault | None = None, build_workers: int | None = None,
                 settle_seconds: float = SETTLE_SECONDS):
        self.options = options or MeasureOptions()
        self.fault = fault
        self.build_workers = max(1, build_workers or default_build_workers())
        self.settle_seconds = settle_seconds
        self.workers_started = 0
        self.builds_reused = 0
        self.spans: list[Span] = []
        self._workers: list[_Worker | None] = [None] * self.build_workers
        self._key: str | None = None
        self._homes: dict[str, int] = {}   # schedule JSON -> the slot that built it last

    def _start(self, task: TuneTask, slots: Sequence[int]) -> None:
        """Starts (without waiting) workers for those of ``slots`` that have none; on a new
        task, the running workers switch to it (:data:`SWITCH`; one still starting is waited
        for first, so its ready answer is not taken for the switch's) and dead ones go."""
        if self._key != task.fingerprint():
            self._key = task.fingerprint()
            self._homes.clear()
            for k in range(len(self._workers)):
                self._switch(k, task)
        for k in slots:
            worker = self._workers[k]
            if worker is not None and not worker.alive():
                worker.kill()
                worker = None
            if worker is None:
                self.workers_started += 1
                self._workers[k] = _Worker(task, self.options, self.fault, k)

    def _switch(self, k: int, task: TuneTask) -> None:
        """Slot ``k``'s worker, if any, takes ``task``; one that died or cannot start goes."""
        worker = self._workers[k]
        if worker is None:
            return
        try:
            worker.wait_ready()
            if worker.alive():
                worker.switch(task)
                return
        except (TilefuseError, OSError):
            pass
        self._drop(k)

    def _ready(self, task: TuneTask, k: int) -> _Worker:
        """Slot ``k``'s worker, started: TilefuseError when it cannot start."""
        self._start(task, [k])
        worker = self._workers[k]
        assert worker is not None
        try:
            worker.wait_ready()
        except TilefuseError:
            self._workers[k] = None
            raise
        return worker

    def _drop(self, k: int) -> None:
        self._homes = {text: slot for text, slot in self._homes.items() if slot != k}
        worker = self._workers[k]
        if worker is not None:
            worker.kill()
        self._workers[k] = None

    def measure(self, task: TuneTask, schedules: Sequence[Schedule]) -> list[MeasureResult]:
        self.spans = []
        results: list[MeasureResult | None] = [None] * len(schedules)
        for i, schedule in enumerate(schedules):
            try:
                validate(schedule, task.extents())
            except ScheduleError as err:
                results[i] = MeasureResult(schedule, math.inf, INVALID, str(err))
        todo = [i for i, r in enumerate(results) if r is None]
        held = self._build_all(task, [(i, schedules[i]) for i in todo], results)
        if held and self.build_workers > 1:
            time.sleep(self.settle_seconds)  # let the machine settle after the parallel builds
        self._time_interleaved(task, schedules, [i for i in todo if results[i] is None], held,
                               results)
        return [r for r in results if r is not None]

    def _time_interleaved(self, task: TuneTask, schedules: Sequence[Schedule], order: list[int],
                          held: dict[int, tuple[int, _Worker]],
                          results: list[MeasureResult | None]) -> None:
        """Times the held builds of ``order`` in rounds (module docstring): the median of
        each one's ``repeats`` timings. A build whose worker died is built again and measured
        whole on its replacement; a timing that fails is the candidate's result."""
        times: dict[int, list[float]] = {i: [] for i in order}
        rounds = max(1, self.options.repeats)
        for round_ in range(rounds):
            verb = "time" if round_ == rounds - 1 else "repeat"  # the last drops the build
            for i in order if round_ % 2 == 0 else order[::-1]:
                if results[i] is not None:
                    continue
                k, worker = held[i]
                start = time.perf_counter()
                if self._workers[k] is worker and worker.alive():
                    r = self._ask(k, (verb, schedules[i].to_json()), schedules[i])
                    if r.ok:
                        times[i].extend(r.times)
                    else:
                        results[i] = r
                else:  # its worker died after building it: build it again, and measure it
                    results[i] = self._measure_one(task, k, schedules[i])
                self.spans.append(Span("time", i, start, time.perf_counter()))
        for i in order:
            if results[i] is None:
                results[i] = MeasureResult(schedules[i], statistics.median(times[i]), OK,
                                           times=tuple(times[i]))

    def _build_all(self, task: TuneTask, items: list[tuple[int, Schedule]],
                   results: list[MeasureResult | None]) -> dict[int, tuple[int, _Worker]]:
        """Builds and checks ``items`` on the workers at once, each taking the next candidate
        when it is done: index -> (slot, worker) holding the build; failures go to
        ``results``."""
        queue = deque(items)
        slots = min(self.build_workers, len(items))
        if slots:
            self._start(task, range(slots))
        held: dict[int, tuple[int, _Worker]] = {}
        busy: dict[int, tuple[_Worker, int, Schedule, float]] = {}
        while queue or busy:
            for k in range(slots):
                if k in busy or not queue:
                    continue
                pick = self._pick(queue, k, slots)
                if pick is None:
                    continue
                i, schedule = pick
                try:
                    worker = self._ready(task, k)
                    worker.conn.send(("build", schedule.to_json()))
                except (TilefuseError, OSError) as err:
                    self._drop(k)
                    results[i] = MeasureResult(schedule, math.inf, CRASH, str(err))
                    continue
                busy[k] = (worker, i, schedule, time.perf_counter())
            if busy:
                self._collect(busy, held, results)
        return held

    def _pick(self, queue: deque[tuple[int, Schedule]], k: int, slots: int
              ) -> tuple[int, Schedule] | None:
        """The next candidate for slot ``k``: the first it built before (its worker holds the
        checked build: :class:`WorkerBuilds`), else the first no other slot of this batch
        built, else None (they wait for their own slot, which answers them at once)."""
        homes = [self._homes.get(s.to_json(), -1) for _, s in queue]
        own = [j for j, home in enumerate(homes) if home == k]
        free = [j for j, home in enumerate(homes) if not 0 <= home < slots]
        j = (own or free or [None])[0]
        if j is None:
            return None
        item = queue[j]
        del queue[j]
        return item

    def _collect(self, busy: dict[int, tuple[_Worker, int, Schedule, float]],
                 held: dict[int, tuple[int, _Worker]],
                 results: list[MeasureResult | None]) -> None:
        """Waits for the first answer (or timeout) of the busy workers and files it."""
        first = min(start for *_, start in busy.values())
        left = max(0.0, first + self.options.timeout - time.perf_counter())
        answered = set(wait([w.conn for w, *_ in busy.values()], left))
        now = time.perf_counter()
        for k, (worker, i, schedule, start) in list(busy.items()):
            if worker.conn in answered:
                del busy[k]
                self.spans.append(Span("build", i, start, now))
                reply = self._receive(k, schedule)
                if isinstance(reply, MeasureResult):
                    results[i] = reply
                else:
                    held[i] = (k, worker)
                    self._homes[schedule.to_json()] = k
            elif now - start >= self.options.timeout:
                del busy[k]
                self._drop(k)
                results[i] = MeasureResult(schedule, math.inf, TIMEOUT,
                                           f"no answer within {self.options.timeout} s")

    def _receive(self, k: int, schedule: Schedule) -> MeasureResult | str:
        """Slot ``k``'s answer: :data:`BUILT`, or a result (CRASH when the worker died)."""
        worker = self._workers[k]
        assert worker is not None
        try:
            reply = worker.conn.recv()
        except (EOFError, OSError):
            self._drop(k)
            return MeasureResult(schedule, math.inf, CRASH,
                                 f"worker died (exit code {worker.process.exitcode})")
        if reply[0] == BUILT:
            self.builds_reused += bool(reply[1])
            return BUILT
        seconds, status, message, times = reply
        return MeasureResult(schedule, seconds, status, message, tuple(times))

    def _ask(self, k: int, message: str | tuple[str, str], schedule: Schedule) -> MeasureResult:
        """Sends ``message`` to slot ``k``'s worker and waits up to the timeout for the
        result."""
        worker = self._workers[k]
        assert worker is not None
        try:
            worker.conn.send(message)
            if not worker.conn.poll(self.options.timeout):
                self._drop(k)
                return MeasureResult(schedule, math.inf, TIMEOUT,
                                     f"no answer within {self.options.timeout} s")
        except (EOFError, OSError):
            self._drop(k)
            return MeasureResult(schedule, math.inf, CRASH,
                                 f"worker died (exit code {worker.process.exitcode})")
        reply = self._receive(k, schedule)
        assert isinstance(reply, MeasureResult)
        return reply

    def _measure_one(self, task: TuneTask, k: int, schedule: Schedule) -> MeasureResult:
        """Builds, checks and times ``schedule`` on slot ``k``'s worker (started if need be)."""
        try:
            self._ready(task, k)
        except TilefuseError as err:
            return MeasureResult(schedule, math.inf, CRASH, str(err))
        return self._ask(k, schedule.to_json(), schedule)

    def close(self) -> None:
        for k, worker in enumerate(self._workers):
            if worker is not None:
                worker.stop()
            self._workers[k] = None


__all__ = ["BUILD_ERROR", "BUILT", "CRASH", "INVALID", "OK", "RECENT_BUILDS", "SWITCH", "TIMEOUT",
           "WRONG", "InProcessRunner", "KeptBuild", "LocalRunner", "MeasureOptions",
           "MeasureResult", "PlantedFault", "Runner", "Session", "Span", "WorkerBuilds",
           "as_in_a_model", "before_each_call", "build_checked", "calls_per_timing",
           "default_build_workers", "flush_scratch", "measure_schedule", "time_runs", "timed",
           "worker_answer", "worker_loop"]
