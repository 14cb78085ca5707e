"""Equality saturation with egglog: the graph's regions become one e-graph, rule sets (identity,
layout, matmul; one module each) run to saturation under node/time limits, a bytes-and-FLOPs
cost model extracts the cheapest equivalent graph and the decoder turns it back into graph IR."""

from tilefuse.passes.eqsat.saturate import (
    ALL_RULES,
    Limits,
    SaturationResult,
    equality_saturation,
    equality_saturation_reassociating,
    saturate,
)

__all__ = ["ALL_RULES", "Limits", "SaturationResult", "equality_saturation",
           "equality_saturation_reassociating", "saturate"]
