"""The graph pipeline: one flat list of passes, in the order they run.

Later milestones append to it (constant folding, simplification, fusion, layout, memory plan);
each entry says why it is where it is.
"""

from __future__ import annotations

from tilefuse.passes.algebra import simplify_algebra
from tilefuse.passes.attention import fuse_attention
from tilefuse.passes.constant_fold import constant_fold
from tilefuse.passes.conv_lowering import conv_to_matmul
from tilefuse.passes.cse import cse
from tilefuse.passes.dce import dce
from tilefuse.passes.decompose import decompose_composites
from tilefuse.passes.eqsat import equality_saturation, equality_saturation_reassociating
from tilefuse.passes.manager import PassSpec
from tilefuse.passes.shape_infer import shape_infer

_EQSAT = PassSpec("eqsat", equality_saturation,
                  "equality saturation (egglog): identities, transposes, matmul merges and folds")


def graph_pipeline(*, reassociate: bool = False) -> tuple[PassSpec, ...]:
    """The pipeline; ``reassociate=True`` lets equality saturation re-associate constant
    matmuls (``(x @ A) @ B`` -> ``x @ (A @ B)``), which changes NaN/Inf semantics (an inf in
    ``x`` gives ±inf where NumPy gives NaN), so it is off unless asked for."""
    if not reassociate:
        return GRAPH_PIPELINE
    eqsat = PassSpec("eqsat", equality_saturation_reassociating,
                     "equality saturation with re-association of constant matmuls")
    return tuple(eqsat if spec is _EQSAT else spec for spec in GRAPH_PIPELINE)


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
    # After CSE (equal constants already one value): transpose(W), reshape(W), ... of constants
    # become constants, so equality saturation sees plain weights (a merge or scale rule needs
    # a constant leaf) and kernel formation no transposes of weights.
    PassSpec("constant_fold", constant_fold,
             "all-constant nodes -> constants (results <= 64 MiB, not growing the constant data)"),
    # The rule sets (identity, layout, matmul) to saturation under node/time limits, extracted
    # by bytes moved + FLOPs; before attention recognition, which matches on the simplified
    # graph (merged Q/K/V projections reach it as slices of one matmul).
    _EQSAT,
    # eqsat moves work onto constants (concat of Q/K/V weights, W*c): fold it once here.
    PassSpec("constant_fold", constant_fold, "fold what eqsat moved onto constants"),
    PassSpec("dce", dce, "drop what eqsat and folding replaced"),
    # After CSE (one value per score tensor), before the last DCE (which drops the replaced ops).
    PassSpec("attention", fuse_attention, "softmax(q·kᵀ·s + mask)·v -> one attention node"),
    # Cleanup for whatever the passes above (and those later inserted before it) left unused.
    PassSpec("dce", dce, "drop nodes left dead by the rewrites above"),
)
