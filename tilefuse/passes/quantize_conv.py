"""What the quantize pass reads through to put a product on ``qconv_i8``: the window of a
lowered convolution and the QuantizeLinear/DequantizeLinear pair of a QDQ model.

After ``conv_lowering`` a convolution's A operand is ``reshape(window_patches(P))`` with P the
(padded) NHWC input built by ``reshape`` / ``pad`` from an activation matrix S
(:func:`conv_window`). In a QDQ model S is ``DequantizeLinear(QuantizeLinear(y))`` as the ONNX
converters write it (:func:`qdq_source`)::

    codes = cast(clip(round(add(round(div(y, s)), z))), i8 | u8)    (add absent when z = 0)
    S     = mul(sub(cast(movement*(codes), f32), z), s)              (sub absent when z = 0)

where ``movement*`` are transposes / reshapes of the codes (a layout change between Q and DQ).
The product then reads y itself, with (s, z, clip range) as the kernel's static quantization:
the codes the kernel makes are those the pair makes, and ``(codes - z) · s`` is the value the
f32 graph multiplied, so the integer product is the QDQ model's product exactly (up to the f32
sum order). Zero padding of S is zero padding of y: QuantizeLinear(0) = z, centred 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Literal, Node, Value
from tilefuse.kernel.lower_qconv import Static

_CODES = {"i8": (-128, 127), "u8": (0, 255)}


@dataclass(frozen=True)
class ConvWindow:
    """A lowered convolution's A operand: the window attrs, the NHWC input P and the
    reshape / pad nodes that made P from S (in order, S first)."""

    attrs: dict
    p: Value
    steps: tuple[Node, ...]
    s: Value


@dataclass(frozen=True)
class QdqSource:
    """The y that a QuantizeLinear/DequantizeLinear pair reads, the movement nodes between the
    two casts (replayed on y) and the static quantization."""

    y: Value
    movements: tuple[Node, ...]
    static: Static


def _const(value: Value, producers: dict[Value, Node]) -> np.ndarray | None:
    node = producers.get(value)
    if node is None or node.op.name != "constant":
        return None
    literal = node.attrs["value"]
    return literal.array if isinstance(literal, Literal) else None


def _scalar(value: Value, producers: dict[Value, Node]) -> float | None:
    array = _const(value, producers)
    if array is None or array.size != 1 or array.dtype != np.float32:
        return None
    return float(array.reshape(()))


def conv_window(a: Value, producers: dict[Value, Node]) -> ConvWindow | None:
    """The window behind matmul operand ``a`` (static shapes, unit dilation along W), else
    None. A plain 2-D ``a`` [M, K] is not a window: see :func:`matrix_window`."""
    flat = producers.get(a)
    if flat is None or flat.op.name != "reshape":
        return None
    window = producers.get(flat.inputs[0])
    if window is None or window.op.name != "window_patches" or window.attrs["dilations"][1] != 1:
        return None
    p = window.inputs[0]
    if not all(isinstance(d, int) for d in (*p.shape, *a.shape)):
        return None
    steps: list[Node] = []
    s = p
    while True:
        node = producers.get(s)
        if node is None or node.op.name not in ("reshape", "pad"):
            break
        if node.op.name == "pad" and (node.attrs["mode"] != "constant"
                                      or float(node.attrs["value"]) != 0.0):
            break
        steps.insert(0, node)
        s = node.inputs[0]
    attrs = {k: tuple(window.attrs[k]) for k in ("kernel", "strides", "dilations")}
    return ConvWindow(attrs, p, tuple(steps), s)


def _strip(value: Value, op: str, producers: dict[Value, Node]) -> Value:
    node = producers.get(value)
    while node is not None and node.op.name == op:
        value = node.inputs[0]
        node = producers.get(value)
    return value


def _binary(value: Value, op: str, producers: dict[Value, Node]
            ) -> tuple[Value, float] | None:
    """(x, c) when ``value`` is ``op(x, c)`` (or ``op(c, x)`` for mul) with c a scalar."""
    node = producers.get(value)
    if node is None or node.op.name != op or node.outputs[0].type.dtype != value.type.dtype:
        return None
    for i in ((0, 1), (1, 0)) if op == "mul" else ((0, 1),):
        c = _scalar(node.inputs[i[1]], producers)
        if c is not None and node.inputs[i[0]].type == value.type:
            return node.inputs[i[0]], c
    return None


def qdq_source(s: Value, producers: dict[Value, Node]) -> QdqSource | None:
    """The QuantizeLinear/DequantizeLinear pair that makes ``s`` (module docstring), else None."""
    if s.dtype.name != "f32":
        return None
    found = _binary(s, "mul", producers)
    if found is None:
        return None
    centred, scale = found
    zero = 0.0
    found = _binary(centred, "sub", producers)
    if found is not None:
        centred, zero = found
    cast = producers.get(centred)
    if cast is None or cast.op.name != "cast":
        return None
    codes = cast.inputs[0]
    movements: list[Node] = []
    node = producers.get(codes)
    while node is not None and node.op.name in ("transpose", "reshape"):
        movements.insert(0, node)
        codes = node.inputs[0]
        node = producers.get(codes)
    if node is None or node.op.name != "cast" or codes.dtype.name not in _CODES:
        return None
    clip = producers.get(node.inputs[0])
    if clip is None or clip.op.name != "clip":
        return None
    lo, hi = _CODES[codes.dtype.name]
    if (clip.attrs.get("min"), clip.attrs.get("max")) != (float(lo), float(hi)):
        return None
    v = _strip(clip.inputs[0], "round", producers)
    if zero != 0.0:
        found = _binary(v, "add", producers)
        if found is None or found[1] != zero:
            return None
        v = _strip(found[0], "round", producers)
    found = _binary(v, "div", producers)
    if found is None or found[1] != scale or scale <= 0 or zero != int(zero) \
            or not lo <= zero <= hi:
        return None
    return QdqSource(found[0], tuple(movements), Static(scale, int(zero), lo, hi))


def replay(builder: GraphBuilder, nodes: tuple[Node, ...], value: Value) -> Value:
    """``value`` through copies of the one-input ``nodes`` (their attrs; shapes follow)."""
    for node in nodes:
        value = builder.add1(node.op, [value], node.attrs, node.loc)
    return value


__all__ = ["ConvWindow", "QdqSource", "conv_window", "qdq_source", "replay"]
