"""A runner that spreads measurements over a Ray cluster (for users with more than one machine).

:class:`RayRunner` sends each candidate as one Ray task (``max_retries=0``): the task's graph
travels once per kernel through Ray's object store (``ray.put`` of :meth:`TuneTask.wire`), the
schedule as JSON; the remote function re-forms the task, makes the inputs and the reference
and runs :func:`~tilefuse.tune.runner.measure_schedule`, the same check-then-time procedure as
the local runners. Failures map as in :class:`~tilefuse.tune.runner.LocalRunner`:

- a candidate that crashes its worker process (segfault, abort) surfaces as Ray's
  ``WorkerCrashedError`` (Ray starts a new worker for the next task): it scores inf, ``crash``;
- a candidate still running ``timeout`` seconds after it was submitted is cancelled with
  ``ray.cancel(force=True)``, which kills its worker: inf, ``timeout``;
- a wrong answer or a failed build is reported by the worker: inf, ``wrong`` / ``build_error``.

At most ``in_flight`` candidates are submitted at once (default: the cluster's CPUs divided by
``num_cpus`` per task), so a candidate's timeout runs from when a worker is free for it, not
from a place in a queue. Nor does it run while a worker starts: when nothing is in flight and
no worker is known to be up (the first batch, and after a crash or a timeout killed one), an
empty task per slot is run first and waited for up to ``startup_timeout``, as the local runner
waits for its worker's handshake. (Starting a Ray worker and importing tilefuse in it took over a
minute on a loaded 2-core machine, which used to score the good candidate after a crash as a
timeout.) Workers must be able to import tilefuse (installed on every node, or
shipped with ``init_kwargs={"runtime_env": ...}``). ``ray.init`` is called with ``address``
and ``init_kwargs`` when Ray is not initialised yet (and shut down by :meth:`close` then);
otherwise the caller's Ray session is used as it is.

Each task measures with ``num_cpus`` CPUs reserved (default 1). Ray sets
``OMP_NUM_THREADS`` in a worker to its task's CPUs when the variable is unset, so ask for as
many CPUs per task as the kernels' threads should get. Ray starts its workers at niceness 15:
on a node busy with other work at niceness 0 they get a few percent of a core, so timings and
timeouts stretch many times over; ``RAY_worker_niceness=0`` in the environment of the process
that starts Ray (the raylet reads it) runs them at 0.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tilefuse.kernel.schedule import Schedule, ScheduleError, validate
from tilefuse.tune.runner import (
    CRASH,
    INVALID,
    TIMEOUT,
    MeasureOptions,
    MeasureResult,
    PlantedFault,
    Runner,
    Session,
    measure_schedule,
)
from tilefuse.tune.task import TuneError, TuneTask


def measure_remote(wire: Mapping[str, Any], schedule_json: str, options: MeasureOptions,
                   fault: PlantedFault | None) -> tuple[float, str, str, tuple[float, ...]]:
    """What one Ray task runs: re-form the task, measure one schedule, return plain data."""
    session = Session.start(TuneTask.from_wire(wire), options)
    r = measure_schedule(session, Schedule.from_json(schedule_json), options, fault)
    return r.seconds, r.status, r.message, r.times


def worker_ready() -> int:
    """The empty task run before timing starts: it returns once a worker has imported this
    module (and so tilefuse), which is what a candidate's task would wait for."""
    return os.getpid()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise TuneError("RayRunner needs ray: pip install 'ray'") from None
    return ray


class RayRunner(Runner):
    """Measures candidates as Ray tasks (module docstring)."""

    def __init__(self, options: MeasureOptions | None = None, fault: PlantedFault | None = None,
                 *, address: str | None = None, init_kwargs: Mapping[str, Any] | None = None,
                 num_cpus: float = 1, in_flight: int | None = None):
        self.ray = _import_ray()
        self.options = options or MeasureOptions()
        self.fault = fault
        self._owns_ray = not self.ray.is_initialized()
        if self._owns_ray:
            self.ray.init(address=address, **dict(init_kwargs or {}))
        self._remote = self.ray.remote(max_retries=0, num_cpus=num_cpus)(measure_remote)
        self._ready = self.ray.remote(max_retries=0, num_cpus=num_cpus)(worker_ready)
        self._workers_up = False   # False until a warm-up returned, and after a worker died
        cpus = float(self.ray.cluster_resources().get("CPU", 1.0))
        self.in_flight = in_flight or max(1, int(cpus // max(num_cpus, 1e-9)))
        self._wire: tuple[str, Any] | None = None   # (task fingerprint, object ref)

    def _wire_ref(self, task: TuneTask) -> Any:
        if self._wire is None or self._wire[0] != task.fingerprint():
            self._wire = (task.fingerprint(), self.ray.put(task.wire()))
        return self._wire[1]

    def measure(self, task: TuneTask, schedules: Sequence[Schedule]) -> list[MeasureResult]:
        results: dict[int, MeasureResult] = {}
        queue: list[int] = []
        for i, schedule in enumerate(schedules):
            try:
                validate(schedule, task.extents())
                queue.append(i)
            except ScheduleError as err:
                results[i] = MeasureResult(schedule, math.inf, INVALID, str(err))
        wire = self._wire_ref(task)
        running: dict[Any, tuple[int, float]] = {}   # ref -> (index, deadline)
        while queue or running:
            if queue and not running and not self._workers_up:
                self._start_workers()
            while queue and len(running) < self.in_flight:
                i = queue.pop(0)
                ref = self._remote.remote(wire, schedules[i].to_json(), self.options, self.fault)
                running[ref] = (i, time.monotonic() + self.options.timeout)
            soonest = min(deadline for _, deadline in running.values())
            ready, _ = self.ray.wait(list(running), num_returns=1,
                                     timeout=max(0.0, soonest - time.monotonic()))
            for ref in ready:
                i, _ = running.pop(ref)
                results[i] = self._collect(ref, schedules[i])
            now = time.monotonic()
            for ref, (i, deadline) in list(running.items()):
                if deadline <= now:
                    self.ray.cancel(ref, force=True)
                    del running[ref]
                    results[i] = MeasureResult(schedules[i], math.inf, TIMEOUT,
                                               f"no answer within {self.options.timeout} s")
                    self._workers_up = False
        return [results[i] for i in range(len(schedules))]

    def _start_workers(self) -> None:
        """Runs one empty task per slot and waits up to ``startup_timeout`` for them, so that
        the candidates' clocks start on running workers. A worker that does not come up in
        time is left to the candidates' own timeouts, as before."""
        refs = [self._ready.remote() for _ in range(self.in_flight)]
        done, late = self.ray.wait(refs, num_returns=len(refs),
                                   timeout=self.options.startup_timeout)
        for ref in late:
            self.ray.cancel(ref)   # not force: that would kill a worker still starting
        self._workers_up = bool(done) and not late

    def _collect(self, ref: Any, schedule: Schedule) -> MeasureResult:
        """The result of a finished task; a dead worker or an error raised in it is a crash."""
        try:
            seconds, status, message, times = self.ray.get(ref)
        except self.ray.exceptions.RayError as err:
            self._workers_up = False
            return MeasureResult(schedule, math.inf, CRASH,
                                 f"ray worker failed: {type(err).__name__}: {str(err)[:300]}")
        return MeasureResult(schedule, seconds, status, message, tuple(times))

    def close(self) -> None:
        if self._owns_ray and self.ray.is_initialized():
            self.ray.shutdown()
        self._owns_ray = False


__all__ = ["RayRunner", "measure_remote", "worker_ready"]
