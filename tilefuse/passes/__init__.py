"""Graph passes and the pass manager. :data:`GRAPH_PIPELINE` is the one list that runs."""

from tilefuse.passes.algebra import simplify_algebra
from tilefuse.passes.cse import cse
from tilefuse.passes.dce import dce
from tilefuse.passes.decompose import decompose_composites
from tilefuse.passes.manager import Pass, PassRecord, PassSpec, PipelineReport, run_pipeline
from tilefuse.passes.pipeline import GRAPH_PIPELINE
from tilefuse.passes.shape_infer import shape_infer, specialize

__all__ = ["GRAPH_PIPELINE", "Pass", "PassRecord", "PassSpec", "PipelineReport", "cse", "dce",
           "decompose_composites", "run_pipeline", "shape_infer", "simplify_algebra",
           "specialize"]
