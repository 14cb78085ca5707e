"""The user-facing tuner: two entries, both returning a :class:`TuneReport`.

``tune(model, *example_inputs, trials=200, time_budget=600.0, db=None, ...)``
    ``model`` is any of: a NumPy function or a ``tilefuse.jit`` function (traced on the
    inputs), an ONNX model (a path, ``bytes``, an ``onnx.ModelProto`` or a
    ``tilefuse.onnx.OnnxModel``), a ``torch.nn.Module`` (traced to core ATen and converted as
    the torch frontend does, :func:`tilefuse.zoo.torch_graph`; the inputs are NumPy arrays or
    tensors), or a tilefuse :class:`~tilefuse.graph.ir.Graph` (captured: the pass pipeline runs
    first). It is reduced to the optimised graph a build compiles, then :func:`tune_graph`.

``tune_graph(graph, example_inputs=None, *, trials=200, time_budget=600.0, db=None, ...)``
    ``graph`` is the optimised graph a build compiles (``model.lower(*inputs).optimized`` of a
    ``tilefuse.jit`` function or ``OnnxModel``); pass ``optimize=True`` for a captured one.
    ``example_inputs``, when given, are checked against the graph's inputs (count, shape,
    dtype). This is the entry the ``tilefuse tune MODEL`` command calls.

Both form the graph's kernels, measure each tunable one with its default schedule, split the
budget where the time is (:mod:`tilefuse.tune.budget`), tune the hot kernels hottest first
into a SQLite database (each stopping within ``margin`` of its roofline bound, default 10%),
and show progress (best time so far, percent of the bound) when ``progress`` is true or
stderr is a terminal. Later builds of the same kernels (in any model) use the tuned schedules
with no setting when the database is the default one (:mod:`tilefuse.runtime.schedules`).

The database is ``db``, else ``$TILEFUSE_TUNE_DB``, else ``tune.sqlite`` in the kernel cache
directory (``$TILEFUSE_CACHE_DIR``, default ``~/.cache/tilefuse``), where builds find it;
a missing directory is created with mode 0700, and the default directory must pass the kernel
cache's checks (a real directory this user owns, not writable by others).

``runner`` chooses where candidates are measured: the default is a
:class:`~tilefuse.tune.runner.LocalRunner` (an isolated worker process);
:class:`~tilefuse.tune.runner_ray.RayRunner` spreads them over a Ray cluster. The package
re-exports :func:`tune` as ``tilefuse.autotune``.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.codegen.target import host_target
from tilefuse.errors import TilefuseError
from tilefuse.graph.ir import Graph
from tilefuse.runtime.disk_cache import (
    CacheError,
    check_cache_directory,
    create_private_directory,
)
from tilefuse.runtime.schedules import tune_db_path
from tilefuse.schedules.database import SQLiteDatabase
from tilefuse.tune.budget import MIN_SHARE, Allocation, BudgetPlan, profile_kernels
from tilefuse.tune.cost_model import CostModel, best_model
from tilefuse.tune.in_model import ModelCheck, TunedKernel, check_in_model
from tilefuse.tune.progress import Progress
from tilefuse.tune.roofline import MeasuredRoofline, Roofline
from tilefuse.tune.runner import LocalRunner, Runner
from tilefuse.tune.search import EvolutionarySearch, SearchStrategy
from tilefuse.tune.task import TuneError, TuneTask, named_tasks
from tilefuse.tune.tuner import Budget, TuneResult, percent_of_bound, target_string, tune_task

DB_ENV_VAR = "TILEFUSE_TUNE_DB"


# ---- the database ----------------------------------------------------------------------------


def default_db_path(env: Mapping[str, str] | None = None) -> Path:
    """``$TILEFUSE_TUNE_DB`` if set and non-empty, else ``tune.sqlite`` in the kernel cache
    directory (where builds look for it: :func:`tilefuse.runtime.schedules.tune_db_path`)."""
    return tune_db_path(env)


def _make_directory(path: Path) -> None:
    """The database's directory, created 0700 like the kernel cache's (one implementation)."""
    try:
        create_private_directory(path)
    except CacheError as err:
        raise TuneError(f"cannot create the tuning database directory {path} ({err.message}); "
                        f"pass db= or set {DB_ENV_VAR}") from None


def open_database(path: str | os.PathLike[str] | None = None) -> SQLiteDatabase:
    """The tuning database at ``path`` (default: :func:`default_db_path`), created if missing
    (directory 0700, file 0600)."""
    chosen = Path(path) if path is not None else default_db_path()
    _make_directory(chosen.parent)
    if path is None and not os.environ.get(DB_ENV_VAR):
        try:
            check_cache_directory(chosen.parent)
        except TilefuseError as err:
            raise TuneError(f"{err} (or set {DB_ENV_VAR} to a database elsewhere)") from None
    try:
        os.close(os.open(chosen, os.O_CREAT | os.O_WRONLY, 0o600))
        return SQLiteDatabase(chosen)
    except (OSError, sqlite3.Error) as err:
        raise TuneError(f"cannot open the tuning database {chosen}: {err}") from None


# ---- the report ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelReport:
    """One tunable kernel of the graph: its share of the default time, default and best
    median seconds, trials spent tuning it (0: kept its default, ``note`` says why), roofline
    bound and why its search stopped. For a tuned kernel ``default_seconds`` and
    ``best_seconds`` come from the measurements taken alternately after the search (the
    default's median, and that over the verdict's paired gain), and the bound from the peaks
    measured between them (:func:`~tilefuse.tune.tuner.tune_task`); for one that kept its
    default, the profile's measurement and the stored peaks."""

    name: str
    label: str
    share: float
    default_seconds: float
    best_seconds: float
    trials: int
    bound_seconds: float
    note: str
    result: TuneResult | None = None
    count: int = 1
    """Kernels of the graph with this one's fingerprint (tuned once, the database serves all)."""
    model_gain: float | None = None
    """The verdict's gain in the model's own call (:mod:`tilefuse.tune.in_model`); None when
    not checked (the default kept, or no check)."""

    @property
    def tuned(self) -> bool:
        return self.trials > 0

    @property
    def percent_of_bound(self) -> float:
        return percent_of_bound(self.bound_seconds, self.best_seconds)

    @property
    def speedup(self) -> float:
        return self.default_seconds / self.best_seconds if self.best_seconds > 0 else 0.0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:10.4f}" if seconds < float("inf") else f"{'failed':>10}"


@dataclass
class TuneReport:
    """What :func:`tune` did; ``str(report)`` is a table, hottest kernel first."""

    kernels: list[KernelReport]
    db: Path
    wall_seconds: float
    trials: int = 0
    notes: list[str] = field(default_factory=list)

    def kernel(self, name: str) -> KernelReport:
        for k in self.kernels:
            if k.name == name:
                return k
        raise TuneError(f"no kernel {name!r} in this report")

    @property
    def default_seconds(self) -> float:
        """All the graph's tunable kernels with their defaults (each counted as often as it
        occurs)."""
        return sum(k.default_seconds * k.count for k in self.kernels)

    @property
    def best_seconds(self) -> float:
        return sum(k.best_seconds * k.count for k in self.kernels)

    def __str__(self) -> str:
        head = (f"{'kernel':<40} {'share':>6} {'default ms':>10} {'best ms':>10} {'speedup':>7} "
                f"{'model':>6} {'trials':>6} {'% bound':>7}  stopped")
        lines = [head, "-" * len(head)]
        for k in self.kernels:
            model = f"{k.model_gain:5.2f}x" if k.model_gain is not None else f"{'':>6}"
            lines.append(f"{k.label[:40]:<40} {100 * k.share:5.1f}% {_ms(k.default_seconds)} "
                         f"{_ms(k.best_seconds)} {k.speedup:6.2f}x {model} {k.trials:>6} "
                         f"{k.percent_of_bound:6.1f}%  {k.note}")
        overall = self.default_seconds / self.best_seconds if self.best_seconds > 0 else 0.0
        lines.append(f"{'all kernels':<40} {'':>6} {_ms(self.default_seconds)} "
                     f"{_ms(self.best_seconds)} {overall:6.2f}x")
        lines.append(f"{self.trials} trials in {self.wall_seconds:.1f} s; database {self.db}")
        return "\n".join(lines + self.notes)


# ---- tracing ---------------------------------------------------------------------------------


def graph_of(source: Any, args: Sequence[Any]) -> Graph:
    """The optimised graph a build of ``source`` compiles for ``args`` (the module docstring
    lists what ``source`` may be)."""
    if isinstance(source, Graph):
        return optimize_graph(source)
    if isinstance(source, str | os.PathLike | bytes) or _is_model_proto(source):
        from tilefuse import onnx

        source = onnx.load(source)
    if _is_torch_module(source):
        from tilefuse.zoo import torch_graph

        arrays = [a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)
                  for a in args]
        return optimize_graph(torch_graph(source, arrays, type(source).__name__))
    lower = getattr(source, "lower", None)
    if callable(lower):
        return lower(*args).optimized
    if callable(source):
        from tilefuse.frontend.jit import jit

        return jit(source).lower(*args).optimized
    raise TuneError(f"cannot tune a {type(source).__name__}: pass a function, a tilefuse.jit "
                    f"function, an ONNX model (path, bytes, ModelProto or OnnxModel), a torch "
                    f"module, or a graph")


def optimize_graph(graph: Graph) -> Graph:
    """``graph`` through the pass pipeline builds run (what they compile)."""
    from tilefuse.driver import optimize

    return optimize(graph)[0]


def _is_model_proto(source: Any) -> bool:
    return type(source).__name__ == "ModelProto" and hasattr(source, "graph")


def _is_torch_module(source: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(source, torch.nn.Module)


def check_inputs(graph: Graph, example_inputs: Sequence[Any]) -> None:
    """TuneError unless ``example_inputs`` match ``graph``'s inputs in count, shape, dtype."""
    if len(example_inputs) != len(graph.inputs):
        raise TuneError(f"graph @{graph.name} takes {len(graph.inputs)} inputs, got "
                        f"{len(example_inputs)} example inputs")
    for i, (value, array) in enumerate(zip(graph.inputs, example_inputs)):
        array = np.asarray(array)
        want = (tuple(value.shape), value.dtype.np)
        if (array.shape, array.dtype) != want:
            raise TuneError(f"example input {i} ({value.name or '#' + str(i)}) of "
                            f"@{graph.name} must be {want[1]}{list(want[0])}, got "
                            f"{array.dtype}{list(array.shape)}")


# ---- tuning ----------------------------------------------------------------------------------


@dataclass
class _Run:
    """The pieces of one :func:`tune` call."""

    db: SQLiteDatabase
    runner: Runner
    roofline: Roofline
    model: Callable[[int], CostModel]
    strategy: SearchStrategy
    progress: Progress
    seed: int

    def tune(self, allocation: Allocation, budget: Budget) -> TuneResult:
        self.progress.start(allocation.kernel.label)
        return tune_task(allocation.kernel.task, budget, self.db, self.runner,
                         self.model(self.seed), self.strategy, roofline=self.roofline,
                         seed=self.seed, on_round=self.progress)


def tune(source: Any, *example_inputs: Any, trials: int = 200, time_budget: float = 600.0,
         db: str | os.PathLike[str] | None = None, **options: Any) -> TuneReport:
    """Tunes the kernels of ``source`` (a function, ONNX model, torch module or graph: see the
    module docstring) traced on ``example_inputs``; ``options`` are :func:`tune_graph`'s."""
    start = time.perf_counter()
    graph = graph_of(source, example_inputs)
    return tune_graph(graph, None, trials=trials, db=db,
                      time_budget=time_budget - (time.perf_counter() - start), **options)


def tune_graph(graph: Graph, example_inputs: Sequence[Any] | None = None, *, trials: int = 200,
               time_budget: float = 600.0, db: str | os.PathLike[str] | None = None,
               runner: Runner | None = None, min_share: float = MIN_SHARE, per_round: int = 8,
               roofline: Roofline | None = None, model: Callable[[int], CostModel] = best_model,
               strategy: SearchStrategy | None = None, progress: bool | None = None,
               margin: float | None = 0.1, seed: int = 0, check_model: bool = True
               ) -> TuneReport:
    """Tunes the kernels of the optimised ``graph`` into the database ``db`` (module
    docstring). ``trials`` and ``time_budget`` (seconds of wall clock, measuring included)
    are split by :mod:`tilefuse.tune.budget`; ``runner`` defaults to an isolated
    :class:`LocalRunner`; ``model(seed)`` makes each kernel's cost model; ``progress`` is
    :class:`~tilefuse.tune.progress.Progress`'s ``show``. A kernel stops within ``margin``
    (0.1: 10%) of its roofline bound; ``None`` never stops early. ``check_model``: time the
    verdicts in the model's own call afterwards and take back those not faster there
    (:mod:`tilefuse.tune.in_model`; a few seconds past ``time_budget``)."""
    start = time.perf_counter()
    if example_inputs is not None:
        check_inputs(graph, example_inputs)
    named = named_tasks(graph)
    database = open_database(db)
    roofline = roofline or MeasuredRoofline(database, target_string(host_target()))
    own_runner = runner is None
    run = _Run(database, runner or LocalRunner(), roofline, model,
               strategy or EvolutionarySearch(), Progress(progress), seed)
    try:
        kernels = profile_kernels(named, run.runner)
        plan = BudgetPlan.make(kernels, Budget(trials, time_budget, per_round,
                                      -1.0 if margin is None else margin), min_share)
        for a in plan.allocations:
            why = f" ({a.reason})" if a.reason else ""
            run.progress.note(f"{a.kernel.label}: {100 * a.kernel.share:.1f}% of the default "
                              f"time, {a.trials} trials planned{why}")
        rows = _tune_plan(run, plan, trials, start + time_budget)
        notes = []
        if check_model:
            rows, check = _checked_in_model(graph, named, rows, database, example_inputs)
            notes = [check.summary()] if check is not None else []
    finally:
        run.progress.finish()
        if own_runner:
            run.runner.close()
    spent = sum(r.trials for r in rows)
    return TuneReport(rows, Path(database.path), time.perf_counter() - start, spent, notes)


def _checked_in_model(graph: Graph, named: Sequence[tuple[str, TuneTask]],
                      rows: list[KernelReport], db: SQLiteDatabase,
                      example_inputs: Sequence[Any] | None
                      ) -> tuple[list[KernelReport], ModelCheck | None]:
    """``rows`` after :func:`~tilefuse.tune.in_model.check_in_model`: each checked verdict
    with its gain in the model, one taken back at its default's time."""
    names: dict[str, list[str]] = {}
    for name, task in named:
        names.setdefault(task.fingerprint(), []).append(name)
    # a tuning run measures its default first: history.schedules[0]
    tuned = [TunedKernel(r.result.key, tuple(names[r.result.key.fingerprint]),
                         r.result.schedule, r.result.history.schedules[0])
             for r in rows if r.result is not None and r.result.history.schedules]
    arrays = None if example_inputs is None else [np.asarray(a) for a in example_inputs]
    try:
        check = check_in_model(graph, tuned, db, arrays)
    except TilefuseError as err:   # the tuning stands; only its check could not run
        return [replace(r, note=f"{r.note}; not checked in the model: {err}")
                if r.result is not None else r for r in rows], None
    if check is None:
        return rows, None
    out = []
    for r in rows:
        gain = check.gains.get(r.name)
        if gain is None:
            out.append(r)
        elif r.name in check.reverted:
            out.append(replace(r, best_seconds=r.default_seconds, model_gain=gain,
                               note=f"{r.note}; default kept: not faster in the model"))
        else:
            out.append(replace(r, model_gain=gain))
    return out, check


def _tune_plan(run: _Run, plan: BudgetPlan, trials: int, deadline: float
               ) -> list[KernelReport]:
    """Tunes the plan's kernels hottest first; a report row per kernel, tuned or not."""
    results: dict[str, TuneResult] = {}
    left = trials
    for i, a in enumerate(plan.tuned()):
        budget = plan.budget_at(i, left, deadline - time.perf_counter())
        results[a.kernel.name] = result = run.tune(a, budget)
        left = max(0, left - len(result.history.seconds))
    rows = []
    for a in plan.allocations:
        k = a.kernel
        bound = run.roofline.bound_seconds(*k.task.work())
        r = results.get(k.name)
        if r is None:
            rows.append(KernelReport(k.name, k.label, k.share, k.default_seconds,
                                     k.default_seconds, 0, bound, f"default kept: {a.reason}",
                                     count=k.count))
        else:
            rows.append(KernelReport(k.name, k.label, k.share, r.default_seconds, r.seconds,
                                     len(r.history.seconds), r.bound_seconds, r.stopped, r,
                                     k.count))
    return rows


__all__ = ["DB_ENV_VAR", "KernelReport", "TuneReport", "check_inputs", "default_db_path",
           "graph_of", "open_database", "optimize_graph", "tune", "tune_graph"]
