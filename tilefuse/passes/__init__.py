"""Graph passes and the pass manager. :data:`GRAPH_PIPELINE` is the one list that runs.

Every name is imported on first use: the pipeline imports equality saturation (egglog), which
``import tilefuse`` does not load.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "simplify_algebra": "algebra", "cse": "cse", "dce": "dce",
    "decompose_composites": "decompose",
    "Pass": "manager", "PassRecord": "manager", "PassSpec": "manager",
    "PipelineReport": "manager", "run_pipeline": "manager",
    "GRAPH_PIPELINE": "pipeline",
    "shape_infer": "shape_infer", "specialize": "shape_infer",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = ["GRAPH_PIPELINE", "Pass", "PassRecord", "PassSpec", "PipelineReport", "cse", "dce",
           "decompose_composites", "run_pipeline", "shape_infer", "simplify_algebra",
           "specialize"]
