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

from tilefuse.graph.analysis import users
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.ops.quant import Static
from tilefuse.passes.rewrite import rewrite_nodes

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


# ---- fused epilogues ----------------------------------------------------------------------------

_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")


def _step(node: Node, t: Value, producers: dict[Value, Node], out: Value
          ) -> tuple[tuple, Value | None] | None:
    """The epilogue step of elementwise ``node`` reading the chain value ``t`` and the operand
    it adds (None for a scalar), or None when it cannot be fused."""
    if node.outputs[0].type != out.type:
        return None
    name = node.op.name
    if name in ("round", "relu") and node.inputs == (t,):
        return (name,), None
    if name == "clip" and node.inputs == (t,):
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
        return ("clip", float("-inf") if lo is None else float(lo),
                float("inf") if hi is None else float(hi)), None
    if name not in _BINARY or len(node.inputs) != 2 or (node.inputs[0] is t) == \
            (node.inputs[1] is t):
        return None
    swapped = node.inputs[1] is t
    other = node.inputs[0] if swapped else node.inputs[1]
    c = _scalar(other, producers)
    if c is not None:
        return (name, "s", c, swapped), None
    n = out.shape[-1]
    if other.dtype.name == "f32" and tuple(other.shape) in ((), (1,), (n,), tuple(out.shape)):
        return (name, "t", -1, swapped), other
    return None


def _chain(q: Node, readers: dict[Value, list[Node]], producers: dict[Value, Node],
           graph: Graph, taken: set[Node]) -> tuple[list[Node], tuple, list[Value]]:
    """The elementwise nodes after ``q`` that its epilogue can take: a chain in which each
    value has one reader, the next node, none ``taken`` by another chain and none reading a
    value that another chain keeps in registers. After ``matmul_u8s8`` (i32) the chain starts
    with its cast to f32, and its operands are scalars or [N] vectors. An exact GELU written
    out (``0.5*v * (1 + erf(v / sqrt 2))``, which reads v twice) may end the chain."""
    from tilefuse.passes.quantize import _gelu_chain

    outputs = set(graph.outputs)
    out = q.outputs[0]
    t, nodes, steps, operands = out, [], [], []
    if q.op.name == "matmul_u8s8":
        first = readers.get(out, [])
        if out in outputs or len(first) != 1 or first[0].op.name != "cast" \
                or first[0].outputs[0].dtype.name != "f32" or first[0] in taken:
            return [], (), []
        nodes.append(first[0])
        out = t = first[0].outputs[0]
    while t not in outputs and len(readers.get(t, ())) == 1:
        node = readers[t][0]
        if node in taken or any(producers.get(v) in taken for v in node.inputs if v is not t):
            break
        if node.op.name == "cast" and node.outputs[0].dtype.name in _CODES:
            back = readers.get(node.outputs[0], [])
            lo, hi = _CODES[node.outputs[0].dtype.name]
            if node.outputs[0] in outputs or len(back) != 1 or back[0].op.name != "cast" \
                    or back[0].outputs[0].type != out.type or len(steps) < 2 \
                    or steps[-2] != ("round",) or steps[-1][0] != "clip" \
                    or not lo <= steps[-1][1] <= steps[-1][2] <= hi:
                break
            nodes += [node, back[0]]     # round, clip, then i8 and back: the identity
            t = back[0].outputs[0]
            continue
        found = _step(node, t, producers, out)
        if found is None:
            break
        step, operand = found
        if operand is not None and q.op.name == "matmul_u8s8" and operand.type.rank > 1:
            break
        if operand is not None:
            if operand not in operands:
                operands.append(operand)
            step = (*step[:2], operands.index(operand), step[3])
        steps.append(step)
        nodes.append(node)
        t = node.outputs[0]
    gelu = _gelu_chain(t, readers, producers, graph) if nodes and nodes[-1].op.name != "cast" \
        else None
    if gelu is not None and not any(n in taken for n in gelu):
        steps.append(("gelu",))
        nodes += gelu      # its last node (the final mul) writes the value
    while len(nodes) > 1 and nodes[-1].op.name == "cast" and nodes[-2].op.name == "cast":
        nodes = nodes[:-2]   # never end on the codes' round trip
    return nodes, _simplified(steps), operands


def _simplified(steps: list[tuple]) -> tuple:
    """``steps`` without the second ``round`` of round, ± an integer, round (QuantizeLinear's
    zero point): an integer-valued float plus an integer is already an integer."""
    out: list[tuple] = []
    for step in steps:
        if step == ("round",) and len(out) >= 2 and out[-2] == ("round",) \
                and out[-1][0] in ("add", "sub") and out[-1][1] == "s" \
                and float(out[-1][2]).is_integer():
            continue
        out.append(step)
    return tuple(out)


def fuse_epilogues(graph: Graph) -> tuple[Graph, bool]:
    """``graph`` with the elementwise chain after each ``qconv_i8`` (a QDQ model's batch norm,
    QuantizeLinear/DequantizeLinear, residual add, relu) or ``matmul_u8s8`` (a
    ``quantize_dynamic`` file's cast, rescale and bias) in its tile epilogue: the kernel
    writes the chain's last value, and the product never goes through memory."""
    producers = graph.producers()
    readers = users(graph)
    plans: dict[Node, tuple[Node, tuple, list[Value]]] = {}   # tail -> (qconv, steps, ops)
    skipped: set[Node] = set()
    for node in graph.nodes:
        if node.op.name not in ("qconv_i8", "matmul_u8s8") or node.attrs["epilogue"] \
                or (node.op.name == "qconv_i8" and node.attrs["raw"]):   # ConvInteger's i32
            continue
        nodes, steps, operands = _chain(node, readers, producers, graph, skipped | set(plans))
        if not steps:
            continue
        plans[nodes[-1]] = (node, steps, operands)
        skipped.update([node, *nodes[:-1]])
    if not plans:
        return graph, False
    made: dict[Value, Value] = {}
    new_inputs: list[list[Value]] = []

    def resolve(value: Value) -> Value:
        if value in graph.inputs:
            return new_inputs[0][graph.inputs.index(value)]
        return made.get(value, value)

    def rule(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        if not new_inputs:
            new_inputs.append(builder._inputs)   # the rebuilt graph's inputs, in order
        if node in skipped:
            return list(node.outputs)   # read only by the chain, which goes with it
        if node not in plans:
            return None
        q, steps, operands = plans[node]
        attrs = {**q.attrs, "epilogue": steps}
        value = builder.add1(q.op, [resolve(v) for v in (*q.inputs, *operands)], attrs, q.loc)
        made[node.outputs[0]] = value
        return [value]

    return rewrite_nodes(graph, rule)


__all__ = ["ConvWindow", "QdqSource", "conv_window", "fuse_epilogues", "qdq_source", "replay"]
