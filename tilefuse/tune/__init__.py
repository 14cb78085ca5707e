"""Schedule search: spaces, strategies, cost models, runners, a database, roofline bounds.

One module per concept, each an abstract base with a trivial and a real implementation:

- :mod:`~tilefuse.tune.task` the kernel under tuning (standalone graph, build, reference);
- :mod:`~tilefuse.tune.space` ``FixedSpace`` / knob spaces generated from the group;
- :mod:`~tilefuse.tune.search` ``RandomSearch`` / ``EvolutionarySearch``;
- :mod:`~tilefuse.tune.cost_model` ``RandomModel`` / ``LightGBMModel`` on loop-IR features;
- :mod:`~tilefuse.tune.runner` ``InProcessRunner`` / ``LocalRunner`` (isolated worker, timeout);
- :mod:`~tilefuse.tune.database` ``MemoryDatabase`` / ``SQLiteDatabase`` (WAL);
- :mod:`~tilefuse.tune.roofline` ``NoRoofline`` / ``MeasuredRoofline``;
- :mod:`~tilefuse.tune.tuner` ``tune_group`` / ``tune_task``;
- :mod:`~tilefuse.tune.budget` the budget split by each kernel's share of the time;
- :mod:`~tilefuse.tune.api` ``tune(fn, *example_args, trials=..., time_budget=...)``, the
  user-facing entry (``python -m tilefuse.tune --demo``).
"""

from tilefuse.tune.cost_model import CostModel, LightGBMModel, RandomModel, best_model
from tilefuse.tune.database import MemoryDatabase, SQLiteDatabase, TuneKey, TuningDatabase
from tilefuse.tune.roofline import MeasuredRoofline, NoRoofline, Roofline
from tilefuse.tune.runner import InProcessRunner, LocalRunner, MeasureOptions, PlantedFault, Runner
from tilefuse.tune.search import EvolutionarySearch, RandomSearch, SearchStrategy
from tilefuse.tune.space import FixedSpace, SearchSpace, space_for
from tilefuse.tune.task import TuneError, TuneTask, tasks_from_graph

_TUNER = ("Budget", "TuneResult", "target_string", "tune_group", "tune_task")
_API = ("KernelReport", "TuneReport", "default_db_path", "open_database", "tune")


def __getattr__(name: str) -> object:
    """The tuner's and the API's names, imported on first use (so ``python -m
    tilefuse.tune.tuner`` does not find its module imported twice)."""
    if name in _TUNER:
        from tilefuse.tune import tuner

        return getattr(tuner, name)
    if name in _API:
        from tilefuse.tune import api

        return getattr(api, name)
    raise AttributeError(f"module 'tilefuse.tune' has no attribute {name!r}")


__all__ = ["Budget", "CostModel", "EvolutionarySearch", "FixedSpace", "InProcessRunner",
           "KernelReport", "LightGBMModel", "LocalRunner", "MeasureOptions", "MeasuredRoofline",
           "MemoryDatabase",
           "NoRoofline", "PlantedFault", "RandomModel", "RandomSearch", "Roofline", "Runner",
           "SQLiteDatabase", "SearchSpace", "SearchStrategy", "TuneError", "TuneKey",
           "TuneReport", "TuneResult", "TuneTask", "TuningDatabase", "best_model",
           "default_db_path", "open_database", "space_for", "target_string",
           "tasks_from_graph", "tune", "tune_group", "tune_task"]
