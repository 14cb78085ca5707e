"""Graph passes and the pass manager. :data:`GRAPH_PIPELINE` is the one list that runs.

The pipeline and the pass manager are imported on first use: the pipeline imports equality
saturation (egglog), which ``import tilefuse`` does not load. The single passes are imported
here (their names are also their modules' names, which a lazy import would shadow).
"""

from __future__ import annotations

import importlib
from typing import Any

from tilefuse.passes.algebra import simplify_algebra
from tilefuse.passes.cse import cse
from tilefuse.passes.dce import dce
from tilefuse.passes.decompose import decompose_composites
from tilefuse.passes.shape_infer import shape_infer, specialize

_LAZY = {
    "Pass": "manager", "PassRecord": "manager", "PassSpec": "manager",
    "PipelineReport": "manager", "run_pipeline": "manager",
    "GRAPH_PIPELINE": "pipeline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = ["GRAPH_PIPELINE", "Pass", "PassRecord", "PassSpec", "PipelineReport", "cse", "dce",
           "decompose_composites", "run_pipeline", "shape_infer", "simplify_algebra",
           "specialize"]
