"""Schedule search: spaces, strategies, cost models, runners, a database, roofline bounds.

One module per concept, each an abstract base with a trivial and a real implementation:

- :mod:`~tilefuse.tune.task` the kernel under tuning (standalone graph, built by the native
  runtime's own builder with the candidate schedule, reference outputs);
- :mod:`~tilefuse.schedules.fingerprint` the database key of a kernel (what builds compute);
- :mod:`~tilefuse.tune.space` ``FixedSpace`` / knob spaces generated from the group;
- :mod:`~tilefuse.tune.search` ``RandomSearch`` / ``EvolutionarySearch``;
- :mod:`~tilefuse.tune.features` loop-IR features; :mod:`~tilefuse.tune.cost_model`
  ``RandomModel`` / ``LightGBMModel`` (a ranking objective);
- :mod:`~tilefuse.tune.runner` ``InProcessRunner`` / ``LocalRunner`` (isolated worker, timeout);
  :mod:`~tilefuse.tune.runner_ray` ``RayRunner`` (Ray tasks, for a cluster);
- :mod:`~tilefuse.schedules.database` ``MemoryDatabase`` / ``SQLiteDatabase`` (WAL): the
  schedule store, its own package (builds read it and never import the tuner);
- :mod:`~tilefuse.tune.roofline` ``NoRoofline`` / ``MeasuredRoofline``;
- :mod:`~tilefuse.tune.tuner` ``tune_group`` / ``tune_task``;
- :mod:`~tilefuse.tune.budget` the budget split by each kernel's share of the time;
- :mod:`~tilefuse.tune.in_model` the model check: verdicts timed in the model's own call,
  taken back where not faster there;
- :mod:`~tilefuse.tune.api` ``tune(model, *example_inputs, trials=..., time_budget=...)`` and
  ``tune_graph(graph, example_inputs, ...)``, the user-facing entries (``python -m
  tilefuse.tune --demo``).

Every name is imported on first use, so a build that only looks up tuned schedules (which
imports :mod:`tilefuse.schedules`) does not load
the tuner, the runners or LightGBM.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "CostModel": "cost_model", "LightGBMModel": "cost_model", "RandomModel": "cost_model",
    "best_model": "cost_model",
    "MemoryDatabase": "database", "SQLiteDatabase": "database", "TuneKey": "database",
    "TuningDatabase": "database",
    "group_fingerprint": "fingerprint", "target_string": "fingerprint",
    "MeasuredRoofline": "roofline", "NoRoofline": "roofline", "Roofline": "roofline",
    "InProcessRunner": "runner", "LocalRunner": "runner", "MeasureOptions": "runner",
    "PlantedFault": "runner", "Runner": "runner", "RayRunner": "runner_ray",
    "EvolutionarySearch": "search", "RandomSearch": "search", "SearchStrategy": "search",
    "FixedSpace": "space", "SearchSpace": "space", "space_for": "space",
    "TuneError": "task", "TuneTask": "task", "tasks_from_graph": "task",
    "ModelCheck": "in_model", "check_in_model": "in_model",
    "Budget": "tuner", "TuneResult": "tuner", "tune_group": "tuner", "tune_task": "tuner",
    "KernelReport": "api", "TuneReport": "api", "default_db_path": "api",
    "open_database": "api", "tune": "api", "tune_graph": "api", "graph_of": "api",
}


def __getattr__(name: str) -> object:
    """``tilefuse.tune.X`` imported from its module on first use (module docstring)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tilefuse.tune' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tilefuse.tune.{module}"), name)


__all__ = sorted(_WHERE)
