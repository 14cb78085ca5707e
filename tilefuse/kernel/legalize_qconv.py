"""``qconv_i8`` with a static activation quantization, written as tilefuse ops for targets
without the VNNI kernel (the cuda target: :mod:`tilefuse.runtime.gpu_prepare`).

The op's reference (:mod:`tilefuse.ops.quant`) is, for ``x_scale != 0``::

    p (NHWC f32, read as ``nhwc``) -> zero pads of H and W -> windows [M, KH·KW·C]
    codes = clip(nan_to_num(rint(a / x_scale)), x_min - x_zero, x_max - x_zero)   (i32)
    acc = codes @ w                                                              (exact i32)
    out = act(f32(acc) · f32(x_scale · w_scale) + bias), then the fused epilogue steps

Here the codes are computed elementwise on p before the padding (a padded zero has code 0
while the zero point is in the code range, which the kernel requires), the windows are
``pad`` + ``window_patches`` + ``reshape``, the product is an i32 ``matmul`` (the GPU's
generated integer product, exact and wrapping as NumPy's) and the rest elementwise ops in f32
in the reference's order, so the result equals the reference's bit for bit up to GELU's
``erf``. ONNX ConvInteger (:mod:`tilefuse.onnx.conv_integer`) makes such nodes. A dynamic
``qconv_i8`` (``x_scale`` 0: the CPU's ``quantize="int8"``, which the cuda target never
makes) is left as it is.
"""

from __future__ import annotations

import math

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.passes.rewrite import rewrite_nodes

_F32 = np.float32
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "maximum",
           "minimum": "minimum"}


def legalize_qconvs(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with every static ``qconv_i8`` of constant weights written as tilefuse ops
    (module docstring); changed when there was one."""
    if not any(n.op.name == "qconv_i8" for n in graph.nodes):
        return graph, False
    constants = {n.outputs[0]: n.attrs["value"].array for n in graph.nodes
                 if n.op.name == "constant"}
    return rewrite_nodes(graph, lambda b, node, inputs: _rule(b, node, inputs, constants))


def _rule(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...],
          constants: dict[Value, np.ndarray]) -> tuple[Value, ...] | None:
    if node.op.name != "qconv_i8" or float(node.attrs["x_scale"]) == 0.0:
        return None
    arrays = [constants.get(v) for v in node.inputs[1:4]]
    if any(a is None for a in arrays):
        return None
    w, w_scale, bias = arrays
    a = node.attrs
    loc = node.loc

    def em(op: str, *values: Value, **attrs: object) -> Value:
        return builder.add1(op, list(values), attrs, loc)

    def const(array: np.ndarray) -> Value:
        return builder.add1("constant", [], {"value": Literal(np.asarray(array))}, loc)

    p = inputs[0]
    if a["nhwc"] is not None and tuple(p.shape) != tuple(a["nhwc"]):
        p = em("reshape", p, shape=tuple(int(d) for d in a["nhwc"]))
    x_scale, x_zero = _F32(a["x_scale"]), int(a["x_zero"])
    r = em("round", em("div", p, const(x_scale)))
    r = em("where", em("isnan", r), const(_F32(0)), r)
    codes = em("cast", em("clip", r, min=float(a["x_min"] - x_zero),
                          max=float(a["x_max"] - x_zero)), dtype=DType.i32)
    top, bottom, left, right = (int(v) for v in a["pads"])
    if top or bottom or left or right:
        codes = em("pad", codes, pads=(0, 0, top, bottom, left, right, 0, 0), mode="constant",
                   value=0.0)
    windows = em("window_patches", codes, kernel=tuple(a["kernel"]),
                 strides=tuple(a["strides"]), dilations=tuple(a["dilations"]))
    k = w.shape[0]
    rows = em("reshape", windows, shape=(math.prod(windows.shape) // k, k))
    acc = em("matmul", rows, const(w.astype(np.int32)))
    factor = (_F32(x_scale) * w_scale.astype(_F32)).astype(_F32)
    out = em("add", em("mul", em("cast", acc, dtype=DType.f32), const(factor)),
             const(bias.astype(_F32)))
    if a["act"] == "relu":
        out = em("relu", out)
    elif a["act"] == "gelu":
        out = em("gelu", out, approximate="none")
    operands = inputs[4:]
    for step in a["epilogue"]:
        if step[0] == "round":
            out = em("round", out)
        elif step[0] == "relu":
            out = em("relu", out)
        elif step[0] == "clip":
            out = em("clip", out, min=float(step[1]), max=float(step[2]))
        else:
            other = const(_F32(step[2])) if step[1] == "s" else operands[step[2]]
            pair = (other, out) if step[3] else (out, other)
            out = em(_BINARY[step[0]], *pair)
    return (out,)


__all__ = ["legalize_qconvs"]
