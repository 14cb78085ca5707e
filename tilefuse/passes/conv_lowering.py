"""Convolution through the matmul kernel: ``conv2d`` rewritten as im2col + one 2-D matmul.

A ``conv2d`` with ``groups == 1``, a constant weight, static shapes and f32 operands becomes ops
the native backend runs (the conv itself would be a host fallback):

1. ``transpose`` x to NHWC [N, H, W, C] (the small tensor; the im2col tensor is KH·KW/stride²
   times larger, so its layout comes straight out of the slices, never from a transpose);
2. ``pad`` H and W by the conv's (top, bottom, left, right), when any is non-zero;
3. ``window_patches`` [N, OH, OW, KH, KW, C] of the padded input (im2col as one index remap,
   so kernel formation makes it the matmul's A prologue: the pack kernel of A gathers the
   patches; no slices, no stack) and ``reshape`` to the im2col matrix [N·OH·OW, KH·KW·C]
   (a 1×1 stride-1 conv needs neither: the NHWC input is already that matrix);
4. ``matmul`` with the weight ``transpose`` d to [KH, KW, C, O] and ``reshape`` d to
   [KH·KW·C, O] (rows in the patches' order): computed from a constant alone, so the build
   folds it and packs it once;
5. ``add`` the bias [O] (broadcast over rows: a contraction epilogue);
6. ``reshape`` to [N, OH, OW, O] and ``transpose`` back to NCHW [N, O, OH, OW].

Every new node keeps the conv's source location.

A following elementwise op (relu, ...) is deliberately left after the final transpose: it then
joins the reshape + transpose in one native elementwise kernel. Moved into the matmul epilogue
instead, it would leave a reshape + transpose pair alone in a MOVEMENT group, which
``lower_movement`` (one node per group) cannot lower, so it would run on the host. (A conv read
by no elementwise op still leaves that pair alone: it runs on the host until such groups are
lowered as elementwise ones.)

Other convolutions (grouped, a weight computed at run time, symbolic dims, other dtypes) are left
as they are.
"""

from __future__ import annotations

from tilefuse.dtypes import DType
from tilefuse.errors import SourceLoc
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Node, Value
from tilefuse.passes.rewrite import rewrite_nodes


def conv_to_matmul(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with each eligible conv2d lowered to im2col + matmul; changed when any was."""
    producers = graph.producers()

    def lower(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        return [_lower(builder, node, list(inputs))] if _eligible(node, producers) else None

    return rewrite_nodes(graph, lower)


def _static(shape: tuple) -> bool:
    return all(isinstance(d, int) for d in shape)


def _eligible(node: Node, producers: dict[Value, Node]) -> bool:
    if node.op.name != "conv2d" or node.attrs["groups"] != 1:
        return False
    weight = producers.get(node.inputs[1])
    if weight is None or weight.op.name != "constant":
        return False
    values = (*node.inputs, *node.outputs)
    return all(v.dtype is DType.f32 and _static(v.shape) for v in values)


def _lower(b: GraphBuilder, node: Node, inputs: list[Value]) -> Value:
    loc: SourceLoc | None = node.loc
    x, w = inputs[0], inputs[1]
    n, c = x.shape[0], x.shape[1]
    o, _, kh, kw = w.shape
    _, _, oh, ow = node.outputs[0].shape
    sh, sw = node.attrs["stride"]
    dh, dw = node.attrs["dilation"]
    top, left, bottom, right = node.attrs["padding"]

    nhwc = b.add1("transpose", [x], {"perm": (0, 2, 3, 1)}, loc)
    if top or left or bottom or right:
        nhwc = b.add1("pad", [nhwc], {"pads": (0, 0, top, bottom, left, right, 0, 0)}, loc)
    depth = c * kh * kw
    if (kh, kw, sh, sw) == (1, 1, 1, 1):
        cols = b.add1("reshape", [nhwc], {"shape": (n * oh * ow, depth)}, loc)
    else:
        patches = b.add1("window_patches", [nhwc], {"kernel": (kh, kw), "strides": (sh, sw),
                                                    "dilations": (dh, dw)}, loc)
        cols = b.add1("reshape", [patches], {"shape": (n * oh * ow, depth)}, loc)
    # the OIHW weight as [KH·KW·C, O], rows in the patches' (kh, kw, c) order: folded at build
    w_hwio = b.add1("transpose", [w], {"perm": (2, 3, 1, 0)}, loc)
    wt = b.add1("reshape", [w_hwio], {"shape": (depth, o)}, loc)
    y = b.add1("matmul", [cols, wt], {}, loc)
    if len(inputs) == 3:
        y = b.add1("add", [y, inputs[2]], {}, loc)
    y = b.add1("reshape", [y], {"shape": (n, oh, ow, o)}, loc)
    return b.add1("transpose", [y], {"perm": (0, 3, 1, 2)}, loc)


__all__ = ["conv_to_matmul"]
