"""Convolution through the matmul kernel, with activations kept in one channels-last layout.

A ``conv2d`` with a constant weight, static shapes and f32 operands becomes one 2-D matmul
(the conv itself would be a host fallback); with ``groups`` up to :data:`MAX_GROUPS`, one
matmul per group on its channels' ``slice`` (a remap the A pack gathers through), joined by a
``concat`` along channels; a depthwise conv (``groups == C == O``, any count) is a ``sum``
over the window taps of the patches [N·OH·OW, KH·KW, C] times the weight [KH·KW, C] (a tap
reduction, vectorised along C). The matmul steps:

1. the input as the NHWC **activation matrix** [N·H·W, C] (rows are pixels, columns channels);
2. for a window larger than 1×1 or a stride: ``reshape`` to [N, H, W, C], ``pad`` H and W by
   the conv's (top, bottom, left, right) when any is non-zero, ``window_patches``
   [N, OH, OW, KH, KW, C] (im2col as one index remap, which kernel formation makes the matmul's
   A prologue: the pack kernel of A gathers the patches) and ``reshape`` to the im2col matrix
   [N·OH·OW, KH·KW·C]; a 1×1 stride-1 conv needs none of it: the matrix is its A;
3. ``matmul`` with the weight ``transpose`` d to [KH, KW, C, O] and ``reshape`` d to
   [KH·KW·C, O] (rows in the patches' order): computed from a constant alone, so the build
   folds it and packs it once;
4. ``add`` the bias [O] (broadcast over rows: a contraction epilogue).

The result stays an activation matrix [N·OH·OW, O]. **Layout propagation**: the pass walks
the graph once and keeps every 4-D value it can in that form, so that no transpose runs
between convolutions and what follows a conv is the matmul's epilogue (kernel formation
takes elementwise ops of exactly the matmul's shape into it):

- an elementwise op (one or two operands) whose operands are activation matrices of its own
  [N, C, H, W] shape, or per-channel / scalar tensors (shapes like [C, 1, 1] or [1, C, 1, 1],
  reshaped to [C]: batch norm's scale and shift), runs on the matrix (batch norm, relu and the
  residual add of a ResNet block become the conv's epilogue);
- a ``concat`` along channels of same-sized activations is a ``concat`` of the matrices along
  their columns;
- a ``max_pool2d`` / ``avg_pool2d`` without ceil mode is a max / mean over the
  ``window_patches`` of the -inf / zero padded NHWC input (one reduction kernel that gathers
  its taps; an average that leaves the padding out of its divisor divides the taps' sum by a
  constant count per window);
- every other reader of a value gets it in NCHW: ``reshape`` to [N, H, W, C] and ``transpose``
  (made once per value, where first needed), and a graph input or an NCHW result a matrix
  reader needs is ``transpose`` d and ``reshape`` d the other way (once per value). Graph
  outputs are NCHW as before.

An elementwise op none of whose operands is a matrix already is left in NCHW (a conversion
would cost more than it saves). Every new node keeps the source location of the node it
replaces. Other convolutions (more groups than :data:`MAX_GROUPS` that are not depthwise, a
weight computed at run time, symbolic dims, other dtypes) are left as they are.
"""

from __future__ import annotations

import math

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import SourceLoc
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.ops.registry import OpKind

F32_ONLY = frozenset({DType.f32})
"""The dtypes the CPU's pipeline lowers (its contraction kernel's); the cuda target's
preparation passes the half-precision ones too (cuBLAS multiplies them on tensor cores)."""


def conv_to_matmul(graph: Graph, dtypes: frozenset[DType] = F32_ONLY) -> tuple[Graph, bool]:
    """``graph`` with each eligible conv2d (operands of one of ``dtypes``) lowered to im2col +
    matmul and activations kept as NHWC matrices between them; changed when any conv was
    lowered."""
    producers = graph.producers()
    if not any(_eligible(n, producers, dtypes) for n in graph.nodes):
        return graph, False
    layout = _Layout(GraphBuilder(graph.name), dtypes)
    for v in graph.inputs:
        layout.nchw[v] = layout.b.input(v.type, v.name)
    for node in graph.nodes:
        layout.locs.update((v, node.loc) for v in node.outputs)
        layout.locs.update((v, node.loc) for v in node.inputs if layout.locs.get(v) is None)
        if not _rewrite(layout, node, producers):
            inputs = tuple(layout.as_nchw(v) for v in node.inputs)
            layout.b.append(node if inputs == node.inputs else
                            Node(node.op, inputs, node.attrs, node.outputs, node.loc))
            layout.nchw.update((v, v) for v in node.outputs)
    return layout.b.build([layout.as_nchw(v) for v in graph.outputs]), True


def _static(shape: tuple) -> bool:
    return all(isinstance(d, int) for d in shape)


def _eligible(node: Node, producers: dict[Value, Node],
              dtypes: frozenset[DType] = F32_ONLY) -> bool:
    if node.op.name != "conv2d":
        return False
    groups, o = node.attrs["groups"], node.inputs[1].shape[0]
    if groups > MAX_GROUPS and not groups == o == node.inputs[0].shape[1]:
        return False  # many groups: only a depthwise conv (one input channel per output)
    weight = producers.get(node.inputs[1])
    if (weight is None or weight.op.name != "constant") and groups != 1:
        return False  # a runtime weight (training): rearranged per call, one group only
    values = (*node.inputs, *node.outputs)
    dtype = node.outputs[0].dtype
    return dtype in dtypes and all(v.dtype is dtype and _static(v.shape) for v in values)


def _activation(v: Value) -> bool:
    return len(v.shape) == 4 and _static(v.shape)


class _Layout:
    """The graph being built, and each original 4-D value's stand-ins in it: ``nchw`` (the
    value itself, or one of its shape), ``mat`` (the activation matrix [N·H·W, C]) and ``nhwc``
    ([N, H, W, C]), each made once, where first needed, with the location of the node that
    computed the value (of its first reader when it has none: a graph input)."""

    def __init__(self, builder: GraphBuilder, dtypes: frozenset[DType] = F32_ONLY):
        self.b = builder
        self.dtypes = dtypes
        self.nchw: dict[Value, Value] = {}
        self.mat: dict[Value, Value] = {}
        self.nhwc: dict[Value, Value] = {}
        self.locs: dict[Value, SourceLoc | None] = {}   # where each value was computed

    def as_nchw(self, v: Value) -> Value:
        if v not in self.nchw:
            self.nchw[v] = self.b.add1("transpose", [self.as_nhwc(v)],
                                       {"perm": (0, 3, 1, 2)}, self.locs.get(v))
        return self.nchw[v]

    def as_mat(self, v: Value) -> Value:
        if v not in self.mat:
            n, c, h, w = v.shape
            self.mat[v] = self.b.add1("reshape", [self.as_nhwc(v)],
                                      {"shape": (n * h * w, c)}, self.locs.get(v))
        return self.mat[v]

    def as_nhwc(self, v: Value) -> Value:
        if v not in self.nhwc:
            n, c, h, w = v.shape
            loc = self.locs.get(v)
            self.nhwc[v] = self.b.add1("reshape", [self.mat[v]], {"shape": (n, h, w, c)}, loc) \
                if v in self.mat else \
                self.b.add1("transpose", [self.nchw[v]], {"perm": (0, 2, 3, 1)}, loc)
        return self.nhwc[v]


def _rewrite(layout: _Layout, node: Node, producers: dict[Value, Node]) -> bool:
    """Emits ``node`` in matrix form and records its output's matrix; False to keep it."""
    if _eligible(node, producers, layout.dtypes):
        layout.mat[node.outputs[0]] = _conv(layout, node)
        return True
    if _spatial_reduction(layout, node):
        x, out = node.inputs[0], node.outputs[0]
        n, c, h, w = x.shape
        taps = layout.b.add1("reshape", [layout.as_mat(x)], {"shape": (n, h * w, c)}, node.loc)
        pooled = layout.b.add1(node.op, [taps], {"axes": (1,), "keepdims": False}, node.loc)
        if node.attrs["keepdims"]:   # [N, C, 1, 1]: its activation matrix is [N, C]
            layout.mat[out] = pooled
        else:
            layout.nchw[out] = pooled
        return True
    if len(node.outputs) != 1 or not _activation(node.outputs[0]):
        return False
    out = node.outputs[0]
    if not any(v in layout.mat for v in node.inputs):
        return False
    if node.op.kind is OpKind.ELEMENTWISE and node.op.arity in (1, 2):
        operands = _elementwise_operands(layout, node)
        if operands is None:
            return False
        layout.mat[out] = layout.b.add1(node.op, operands, node.attrs, node.loc)
        return True
    if node.op.name == "concat" and node.attrs["axis"] in (1, -3) and \
            all(_activation(v) and _pixels(v) == _pixels(out) for v in node.inputs):
        mats = [layout.as_mat(v) for v in node.inputs]
        layout.mat[out] = layout.b.add1("concat", mats, {"axis": 1}, node.loc)
        return True
    if _tap_pool(node):
        layout.mat[out] = _pool(layout, node)
        return True
    return False


MAX_SPATIAL_TAPS = 256
"""The most pixels a global pool reads as taps (``kernel.lower_pool.MAX_WINDOW``: unrolled)."""


def _spatial_reduction(layout: _Layout, node: Node) -> bool:
    """A global pool of an activation matrix: a float max / mean / sum over exactly the H and
    W axes of a [N, C, H, W] value that is a matrix (ONNX's GlobalAveragePool, a torch
    ``mean((2, 3))``). It becomes a reduction over the taps of the matrix reshaped to
    [N, H·W, C], vectorised along the contiguous C, instead of a transpose back to NCHW and a
    row reduction per channel over H·W strided pixels (squeezenet's 13x13x1000 mean: ~55 us
    for 0.7 MB)."""
    if node.op.name not in ("max", "mean", "sum") or len(node.inputs) != 1 or \
            node.inputs[0] not in layout.mat or not _activation(node.inputs[0]):
        return False
    x, out = node.inputs[0], node.outputs[0]
    axes = tuple(sorted(a % 4 for a in (node.attrs["axes"] or range(4))))
    return axes == (2, 3) and x.dtype.is_float and out.dtype is x.dtype and \
        x.shape[2] * x.shape[3] <= MAX_SPATIAL_TAPS


def _tap_pool(node: Node) -> bool:
    """A float pool without ceil-mode overhang (whose divisor the taps would not show)."""
    return node.op.name in ("max_pool2d", "avg_pool2d") and not node.attrs["ceil_mode"] and \
        node.outputs[0].dtype.is_float


def _pixels(v: Value) -> tuple:
    return (v.shape[0], *v.shape[2:])


def _elementwise_operands(layout: _Layout, node: Node) -> list[Value] | None:
    """The operands of an elementwise ``node`` in matrix form, or None where one cannot be."""
    c = node.outputs[0].shape[1]
    operands = []
    for v in node.inputs:
        if v.shape == node.outputs[0].shape:
            operands.append(layout.as_mat(v))
            continue
        padded = (1,) * (4 - len(v.shape)) + tuple(v.shape)
        if len(v.shape) > 4 or not _static(v.shape) or padded[0] != 1 or padded[2:] != (1, 1):
            return None
        if padded[1] not in (1, c):
            return None
        source = layout.as_nchw(v)
        operands.append(layout.b.add1("reshape", [source], {"shape": (padded[1],)}, node.loc))
    return operands


MAX_GROUPS = 16
"""A grouped convolution with at most this many groups is one matmul per group."""


def _conv(layout: _Layout, node: Node) -> Value:
    """The conv as an activation matrix: one matmul (one per group, concatenated along
    channels), or for a depthwise conv a sum over the window taps of patches × weights."""
    b, loc = layout.b, node.loc
    x, w = node.inputs[0], layout.nchw[node.inputs[1]]
    groups, c = node.attrs["groups"], x.shape[1]
    o, cg, kh, kw = w.shape
    if groups > 1 and groups == c == o:
        taps = _taps(layout, node, x, (kh, kw), node.attrs["dilation"], 0.0)
        w_hwc = b.add1("transpose", [w], {"perm": (2, 3, 1, 0)}, loc)  # [KH, KW, 1, C]
        w_tc = b.add1("reshape", [w_hwc], {"shape": (kh * kw, c)}, loc)
        y = b.add1("sum", [b.add1("mul", [taps, w_tc], {}, loc)], {"axes": (1,)}, loc)
    else:
        og = o // groups
        parts = [b.add1("matmul", [_im2col(layout, node, x, g * cg, cg), _weight(
            b, node, w, g * og, og)], {}, loc) for g in range(groups)]
        y = parts[0] if groups == 1 else b.add1("concat", parts, {"axis": 1}, loc)
    if len(node.inputs) == 3:
        y = b.add1("add", [y, layout.as_nchw(node.inputs[2])], {}, loc)
    return y


def _channels(b: GraphBuilder, v: Value, start: int, count: int, loc: SourceLoc | None
              ) -> Value:
    """``v``'s last axis from ``start``, ``count`` long (``v`` itself when that is all)."""
    *rest, last = v.shape
    if (start, count) == (0, last):
        return v
    return b.add1("slice", [v], {"starts": (0,) * len(rest) + (start,),
                                 "stops": (*rest, start + count),
                                 "steps": (1,) * (len(rest) + 1)}, loc)


def _im2col(layout: _Layout, node: Node, x: Value, start: int, count: int) -> Value:
    """The im2col matrix [N·OH·OW, KH·KW·count] of channels ``start`` to ``start + count``."""
    b, loc = layout.b, node.loc
    _, _, kh, kw = node.inputs[1].shape
    n, _, oh, ow = node.outputs[0].shape
    sh, sw = node.attrs["stride"]
    top, left, bottom, right = node.attrs["padding"]
    if (kh, kw, sh, sw, top, left, bottom, right) == (1, 1, 1, 1, 0, 0, 0, 0):
        return _channels(b, layout.as_mat(x), start, count, loc)
    if count == x.shape[1]:
        nhwc = layout.as_nhwc(x)
    else:  # a group's channels: each group slices the matrix (one gather chain per group)
        nhwc = b.add1("reshape", [_channels(b, layout.as_mat(x), start, count, loc)],
                      {"shape": (n, *x.shape[2:], count)}, loc)
    if top or left or bottom or right:
        nhwc = b.add1("pad", [nhwc], {"pads": (0, 0, top, bottom, left, right, 0, 0)}, loc)
    patches = b.add1("window_patches", [nhwc], {"kernel": (kh, kw), "strides": (sh, sw),
                                                "dilations": node.attrs["dilation"]}, loc)
    return b.add1("reshape", [patches], {"shape": (n * oh * ow, kh * kw * count)}, loc)


def _weight(b: GraphBuilder, node: Node, w: Value, start: int, count: int) -> Value:
    """Output channels ``start`` to ``start + count`` of the OIHW weight as [KH·KW·C, count],
    rows in the patches' (kh, kw, c) order: computed from a constant, folded at build."""
    o, cg, kh, kw = w.shape
    if count != o:
        w = b.add1("slice", [w], {"starts": (start, 0, 0, 0), "stops": (start + count, cg, kh, kw),
                                  "steps": (1, 1, 1, 1)}, node.loc)
    w_hwio = b.add1("transpose", [w], {"perm": (2, 3, 1, 0)}, node.loc)
    return b.add1("reshape", [w_hwio], {"shape": (kh * kw * cg, count)}, node.loc)


def _taps(layout: _Layout, node: Node, x: Value, kernel: tuple[int, int],
          dilation: tuple[int, int], fill: float) -> Value:
    """The window taps [N·OH·OW, KH·KW, C] of ``x`` padded with ``fill`` (a window as large as
    the input reads the matrix as it is)."""
    b, loc = layout.b, node.loc
    n, c, oh, ow = node.outputs[0].shape
    (kh, kw), padding = kernel, node.attrs["padding"]
    top, left, bottom, right = padding
    if (oh, ow, *padding) == (1, 1, 0, 0, 0, 0) and kernel == tuple(x.shape[2:]):
        return b.add1("reshape", [layout.as_mat(x)], {"shape": (n, kh * kw, c)}, loc)
    nhwc = layout.as_nhwc(x)
    if top or left or bottom or right:
        nhwc = b.add1("pad", [nhwc], {"pads": (0, 0, top, bottom, left, right, 0, 0),
                                      "value": fill}, loc)
    patches = b.add1("window_patches", [nhwc], {"kernel": kernel, "strides": node.attrs["stride"],
                                                "dilations": dilation}, loc)
    return b.add1("reshape", [patches], {"shape": (n * oh * ow, kh * kw, c)}, loc)


def _pool(layout: _Layout, node: Node) -> Value:
    """A pool as max / mean over the window taps of the padded NHWC input: [N·OH·OW, C]; an
    average that leaves the padding out of its divisor is the taps' sum over the count of
    input taps in each window (a constant [N·OH·OW, 1])."""
    b, is_max = layout.b, node.op.name == "max_pool2d"
    taps = _taps(layout, node, node.inputs[0], node.attrs["kernel"],
                 node.attrs.get("dilation", (1, 1)), -math.inf if is_max else 0.0)
    if is_max or node.attrs["count_include_pad"] or not any(node.attrs["padding"]):
        return b.add1("max" if is_max else "mean", [taps], {"axes": (1,)}, node.loc)
    dtype = node.outputs[0].dtype
    counts = b.add1("constant", [], {"value": Literal(_window_counts(node).astype(dtype.np),
                                                      dtype)}, node.loc)
    return b.add1("div", [b.add1("sum", [taps], {"axes": (1,)}, node.loc), counts], {},
                  node.loc)


def _window_counts(node: Node) -> np.ndarray:
    """How many input elements each window of an average pool covers, as [N·OH·OW, 1]."""
    n, _, oh, ow = node.outputs[0].shape
    top, left, _, _ = node.attrs["padding"]
    per_axis = [np.minimum(np.arange(o) * s - before + k, size) -
                np.maximum(np.arange(o) * s - before, 0)
                for o, s, before, k, size in zip((oh, ow), node.attrs["stride"], (top, left),
                                                 node.attrs["kernel"], node.inputs[0].shape[2:])]
    counts = np.multiply.outer(*per_axis).astype(np.float32)
    return np.broadcast_to(counts, (n, oh, ow)).reshape(n * oh * ow, 1).copy()


__all__ = ["conv_to_matmul"]
