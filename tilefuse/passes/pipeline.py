"""The graph pipeline: one flat list of passes, in the order they run.

Later milestones append to it (constant folding, simplification, fusion, layout, memory plan);
each entry says why it is where it is.
"""

from __future__ import annotations

from tilefuse.passes.algebra import simplify_algebra
from tilefuse.passes.attention import fuse_attention
from tilefuse.passes.conv_lowering import conv_to_matmul
from tilefuse.passes.cse import cse
from tilefuse.passes.dce import dce
from tilefuse.passes.decompose import decompose_composites
from tilefuse.passes.manager import PassSpec
from tilefuse.passes.shape_infer import shape_infer

GRAPH_PIPELINE: tuple[PassSpec, ...] = (
    # First, so every later pass can trust each node's output types.
    PassSpec("shape_infer", shape_infer, "re-infer every output type from the op rules"),
    # Before DCE/CSE: composites become the simple ops that fusion recognises (one vocabulary
    # whether softmax arrived as one op or written by hand), and CSE can share their pieces.
    PassSpec("decompose", decompose_composites,
             "expand softmax, log_softmax, layer_norm, rms_norm into simple ops"),
    # Exact peepholes (pow(x, 2) -> x*x); after decompose so composites' pieces are seen too.
    PassSpec("algebra", simplify_algebra, "exact algebraic peepholes such as pow(x, 2) -> x*x"),
    # After decompose/algebra, before DCE/CSE: a conv2d with a constant weight becomes im2col
    # movement ops + one 2-D matmul (the fast contraction kernel, bias and a following
    # activation as its epilogue) instead of a host fallback; CSE then shares what repeats.
    PassSpec("conv_lowering", conv_to_matmul,
             "conv2d with a constant weight (groups=1, f32) -> im2col slices + matmul"),
    # Before CSE: no point hashing nodes whose results nobody reads.
    PassSpec("dce", dce, "drop nodes whose outputs reach no graph output"),
    # Merges repeated (op, inputs, attrs); drops the duplicates itself.
    PassSpec("cse", cse, "merge repeated computations (commutative inputs in any order)"),
    # After CSE (one value per score tensor), before the last DCE (which drops the replaced ops).
    PassSpec("attention", fuse_attention, "softmax(q·kᵀ·s + mask)·v -> one attention node"),
    # Cleanup for whatever the passes above (and those later inserted before it) left unused.
    PassSpec("dce", dce, "drop nodes left dead by the rewrites above"),
)
