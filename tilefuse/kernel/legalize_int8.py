"""The CPU's integer ops that ONNX import makes whatever the target (``qconv_i8`` of a
ConvInteger, ``matmul_u8s8`` of a MatMulInteger, ``dynamic_quantize_u8`` of a
DynamicQuantizeLinear, ``matmul_w4`` of a MatMulNBits), written as tilefuse ops for the cuda
target, which has no VNNI kernels (:mod:`tilefuse.runtime.gpu_prepare`): each is then GPU
kernels (integer products through the generated product,
:mod:`tilefuse.kernel.lower_gpu_product`) instead of a host step.

* ``dynamic_quantize_u8``: its reference's steps (min and max over the tensor, the scale and
  zero point, the codes), as the ONNX converter writes small DynamicQuantizeLinears.
* ``matmul_u8s8``: ``(i32(a) - i32(a_zero)) @ i32(w)`` (exact, wrapping as the reference), then
  the fused epilogue's steps in f32.
* ``matmul_w4`` (MatMulNBits) when no cuda quantize pass re-packed it: the dequantized f32
  weight, a cuBLAS product, bias and activation (the reference's arithmetic).
* ``qconv_i8`` with a static activation quantization (``raw``: the i32 sums are the output);
  its reference is, for ``x_scale != 0``::

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
from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.ops.quant import dequantize_w4
from tilefuse.passes.rewrite import rewrite_nodes

_F32 = np.float32
_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "maximum",
           "minimum": "minimum"}


INTEGER_OPS = frozenset({"qconv_i8", "matmul_u8s8", "dynamic_quantize_u8", "matmul_w4"})


def legalize_int8(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with its ``dynamic_quantize_u8``, ``matmul_u8s8`` and static ``qconv_i8`` of
    constant weights written as tilefuse ops (module docstring); changed when there was one."""
    if not any(n.op.name in INTEGER_OPS for n in graph.nodes):
        return graph, False
    constants = {n.outputs[0]: n.attrs["value"].array for n in graph.nodes
                 if n.op.name == "constant"}
    return rewrite_nodes(graph, lambda b, node, inputs: _rule(b, node, inputs, constants))


def _rule(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...],
          constants: dict[Value, np.ndarray]) -> tuple[Value, ...] | None:
    if node.op.name == "dynamic_quantize_u8":
        return _dynamic_quantize(builder, node, inputs)
    if node.op.name == "matmul_u8s8":
        return _u8s8(builder, node, inputs, constants)
    if node.op.name == "matmul_w4":
        return _w4(builder, node, inputs, constants)
    if node.op.name != "qconv_i8" or float(node.attrs["x_scale"]) == 0.0:
        return None
    arrays = [constants.get(v) for v in node.inputs[1:4]]
    if any(a is None for a in arrays):
        return None
    w, w_scale, bias = arrays
    a = node.attrs
    em, const = _emitters(builder, node)

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
    if a["raw"]:   # ONNX ConvInteger: the exact i32 sums alone
        return (acc,)
    factor = (_F32(x_scale) * w_scale.astype(_F32)).astype(_F32)
    out = em("add", em("mul", em("cast", acc, dtype=DType.f32), const(factor)),
             const(bias.astype(_F32)))
    if a["act"] == "relu":
        out = em("relu", out)
    elif a["act"] == "gelu":
        out = em("gelu", out, approximate="none")
    return (_epilogue(em, const, out, a["epilogue"], inputs[4:]),)


def _emitters(builder: GraphBuilder, node: Node) -> tuple[Any, Any]:
    def em(op: str, *values: Value, **attrs: object) -> Value:
        return builder.add1(op, list(values), attrs, node.loc)

    def const(array: np.ndarray) -> Value:
        return builder.add1("constant", [], {"value": Literal(np.asarray(array))}, node.loc)

    return em, const


def _epilogue(em: Any, const: Any, out: Value, steps: tuple, operands: tuple[Value, ...]
              ) -> Value:
    """The fused epilogue's steps (:func:`tilefuse.ops.quant.run_epilogue`) as ops on ``out``."""
    for step in steps:
        if step[0] == "round":
            out = em("round", out)
        elif step[0] == "relu":
            out = em("relu", out)
        elif step[0] == "gelu":
            out = em("gelu", out, approximate="none")
        elif step[0] == "clip":
            out = em("clip", out, min=float(step[1]), max=float(step[2]))
        else:
            other = const(_F32(step[2])) if step[1] == "s" else operands[step[2]]
            pair = (other, out) if step[3] else (out, other)
            out = em(_BINARY[step[0]], *pair)
    return out


def _u8s8(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...],
          constants: dict[Value, np.ndarray]) -> tuple[Value, ...] | None:
    """(a - a_zero) @ w in exact i32, then the epilogue in f32 (module docstring)."""
    w = constants.get(node.inputs[2])
    if w is None:
        return None
    em, const = _emitters(builder, node)
    a, zero = inputs[0], inputs[1]
    k = w.shape[0]
    rows = math.prod(a.shape[:-1])
    centred = em("sub", em("cast", a, dtype=DType.i32),
                 em("cast", em("reshape", zero, shape=()), dtype=DType.i32))
    acc = em("matmul", em("reshape", centred, shape=(rows, k)), const(w.astype(np.int32)))
    out = acc
    if node.attrs["epilogue"]:
        operands = tuple(em("reshape", v, shape=()) if math.prod(v.shape) == 1 else v
                         for v in inputs[3:])
        out = _epilogue(em, const, em("cast", acc, dtype=DType.f32), node.attrs["epilogue"],
                        operands)
    return (em("reshape", out, shape=tuple(node.outputs[0].shape)),)


def _w4(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...],
        constants: dict[Value, np.ndarray]) -> tuple[Value, ...] | None:
    """ONNX MatMulNBits' ``matmul_w4`` without the cuda quantize pass (which re-packs it for
    the GPU's int4 kernel, ``matmul_wq``): its weight dequantized here (the reference's f32
    grid), an f32 product (cuBLAS), the bias and the activation."""
    arrays = [constants.get(v) for v in node.inputs[1:]]
    if any(a is None for a in arrays):
        return None
    wq, scales, zeros, bias = arrays
    em, const = _emitters(builder, node)
    w = dequantize_w4(wq, scales, zeros, int(node.attrs["group"]))
    out = em("add", em("matmul", inputs[0], const(w)), const(bias.astype(_F32)))
    if node.attrs["act"] == "relu":
        out = em("relu", out)
    elif node.attrs["act"] == "gelu":
        out = em("gelu", out, approximate="none")
    return (out,)


def _dynamic_quantize(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]
                      ) -> tuple[Value, ...]:
    """ONNX DynamicQuantizeLinear's steps in f32, as the reference takes them."""
    em, const = _emitters(builder, node)
    (x,) = inputs
    zero = const(_F32(0))

    def codes(v: Value) -> Value:   # nan_to_num(clip(v, 0, 255), nan=0) as u8
        v = em("clip", v, min=0.0, max=255.0)
        return em("cast", em("where", em("isnan", v), zero, v), dtype=DType.u8)

    lo = em("minimum", em("min", x, axes=None, keepdims=False), zero)
    hi = em("maximum", em("max", x, axes=None, keepdims=False), zero)
    scale = em("div", em("sub", hi, lo), const(_F32(255)))
    point = em("round", em("neg", em("div", lo, scale)))
    point = em("where", em("isnan", point), zero, em("clip", point, min=0.0, max=255.0))
    q = em("add", em("round", em("div", x, scale)), point)
    return codes(q), scale, em("cast", point, dtype=DType.u8)


__all__ = ["INTEGER_OPS", "legalize_int8"]
