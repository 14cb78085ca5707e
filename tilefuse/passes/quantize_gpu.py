"""Weight quantization for the cuda target: matmuls against constant weights become
``matmul_wq`` (:mod:`tilefuse.ops.quant_gpu`), weight-only, packed in the GPU tile layout.

The CPU's schemes quantize f32 products (int8 also quantizes the activations per row, for
VNNI). On the GPU decode is bound by the bytes of the weights, and the tensor cores take
bf16/f16, so every scheme there is weight-only and takes f32, bf16 and f16 products alike:

- ``int4`` (group 32/64/128, ``+zp``): the CPU's int4 codes and scales
  (:func:`~tilefuse.passes.quantize.quantize_int4`), re-packed for the tile;
- ``int8``: symmetric per output column (:func:`~tilefuse.passes.quantize.quantize_int8`);
- ``fp8``: e4m3 per output column, ``s = max|W[:, n]| / 448``.

A weight is a constant or the ``transpose`` of one (``nn.Linear``'s ``W.T`` past constant
folding's size cap). A following ``add`` of a constant bias [N] and a ``relu`` or exact GELU
are absorbed (the kernel applies them to its f32 sums; ``passes/quantize.py``'s matching).
A ``matmul_w4`` already in the graph (ONNX ``MatMulNBits``) is re-packed the same way.
Products the kernel does not take stay as they are (cuBLAS), logged on the ``passes`` topic
with the reason.
"""

from __future__ import annotations

import numpy as np

from tilefuse.dtypes import DType, from_numpy
from tilefuse.graph.analysis import users
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value
from tilefuse.log import get_logger
from tilefuse.ops.quant import unpack_w4
from tilefuse.ops.quant_gpu import TILE_N, chunk_lanes, pack_tiles, to_e4m3
from tilefuse.passes.rewrite import rewrite_nodes

FLOATS = frozenset({DType.f32, DType.bf16, DType.f16})
K_MULTIPLE = {"int4": 128, "int8": 64, "fp8": 64}
"""K must be a multiple of this (the kernel's smallest K step)."""
FP8_MAX = 448.0
_F32 = np.float32


def quantize_fp8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per output column: (e4m3 bits u8 [K, N], scale f32 [N]) with ``max|W[:, n]|`` at 448."""
    w = np.asarray(w, _F32)
    amax = np.max(np.abs(w), axis=0)
    scale = np.where(amax > 0, amax / _F32(FP8_MAX), _F32(1)).astype(_F32)
    return to_e4m3(np.clip(w / scale, -FP8_MAX, FP8_MAX)), scale


def _constant(value: Value, producers: dict[Value, Node]) -> np.ndarray | None:
    node = producers.get(value)
    if node is None or node.op.name != "constant":
        return None
    literal = node.attrs["value"]
    return literal.array if isinstance(literal, Literal) else None


def _weight(value: Value, producers: dict[Value, Node]) -> np.ndarray | None:
    """The constant matrix ``value`` is: a constant, or ``transpose`` of a 2-D constant
    (``nn.Linear``'s ``W.T``, which constant folding leaves alone past its 64 MiB cap: a
    4096×11008 bf16 MLP weight)."""
    found = _constant(value, producers)
    if found is not None:
        return found
    node = producers.get(value)
    if node is None or node.op.name != "transpose" or tuple(node.attrs["perm"]) != (1, 0):
        return None
    inner = _constant(node.inputs[0], producers)
    return None if inner is None or inner.ndim != 2 else inner.T


def _only_user(value: Value, readers: dict[Value, list[Node]], graph: Graph) -> Node | None:
    found = readers.get(value, [])
    return found[0] if len(found) == 1 and value not in graph.outputs else None


def _bias(node: Node | None, out: Value, producers: dict[Value, Node], n: int
          ) -> np.ndarray | None:
    """The [N] constant of ``add(out, b)`` keeping out's type, as f32."""
    if node is None or node.op.name != "add" or node.outputs[0].type != out.type:
        return None
    other = node.inputs[1] if node.inputs[0] is out else node.inputs[0]
    array = None if other is out else _constant(other, producers)
    if array is None or array.size != n or (array.ndim and array.shape[-1] != n) \
            or from_numpy(array.dtype) not in FLOATS:
        return None
    return np.asarray(array, _F32).reshape(n)


def _refusal(x: Value, w: np.ndarray | None, fmt: str, min_weights: int) -> str | None:
    if w is None or w.ndim != 2 or from_numpy(w.dtype) not in FLOATS:
        return "the weight is not a constant 2-D float matrix"
    if x.dtype not in FLOATS or x.type.rank < 1:
        return f"the activation is {x.dtype}"
    if w.size < min_weights:
        return f"{w.size} weights are too few to pay"
    k, n = w.shape
    if k % K_MULTIPLE[fmt] or n % TILE_N:
        return (f"the GPU kernel needs K a multiple of {K_MULTIPLE[fmt]} and N of {TILE_N}, "
                f"got K = {k}, N = {n}")
    return None


def _packed(w: np.ndarray, options) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(tile-packed codes, scales [K/G or 1, N], zeros, group) of the f32 weight ``w``."""
    from tilefuse.passes.quantize import _group_for, quantize_int4, quantize_int8

    k, n = w.shape
    if options.mode == "int4":
        group = _group_for(k, options)
        packed, scales, zeros = quantize_int4(w, group, options.zero_points)
        codes = unpack_w4(packed)
        return pack_tiles(codes, "int4", chunk_lanes("int4", group)), scales, zeros, group
    if options.mode == "int8":
        q, scale = quantize_int8(w)
        codes = q.view(np.uint8)
    else:
        codes, scale = quantize_fp8(w)
    return (pack_tiles(codes, options.mode, chunk_lanes(options.mode, 128)),
            scale.reshape(1, n), np.zeros((1, n), np.uint8), 128)


def quantize_weights_gpu(graph: Graph, options, min_weights: int) -> tuple[Graph, bool]:
    """``graph`` with its products against constant weights as ``matmul_wq`` (module
    docstring); ``options`` is the pass's :class:`~tilefuse.passes.quantize.QuantizeOptions`."""
    from tilefuse.passes.quantize import _activation

    log = get_logger("passes")
    producers = graph.producers()
    readers = users(graph)
    plans: dict[Node, tuple[np.ndarray, Node | None, str]] = {}
    absorbed: dict[Node, Value] = {}
    for node in graph.nodes:
        if node.op.name not in ("matmul", "matmul_w4"):
            continue
        out = node.outputs[0]
        if node.op.name == "matmul_w4":
            operands = [_constant(v, producers) for v in node.inputs[1:]]
            if any(a is None for a in operands) or out.shape[-1] % TILE_N \
                    or node.inputs[0].shape[-1] % 128:
                log.info("%s stays matmul_w4 (not the GPU kernel's: runtime operands or "
                         "shape)", out.type)
                continue
            plans[node] = (np.empty(0), None, "none")
            continue
        w = _weight(node.inputs[1], producers)
        why = _refusal(node.inputs[0], w, options.mode, min_weights)
        if why is not None:
            if w is not None:
                log.info("%s stays %s (cuBLAS): %s", out.type, out.dtype, why)
            continue
        add = _only_user(out, readers, graph)
        if _bias(add, out, producers, w.shape[1]) is None:
            add = None
        last = add.outputs[0] if add is not None else out
        act, act_nodes = _activation(last, readers, producers, graph)
        plans[node] = (w, add, act)
        for extra in (add, *act_nodes):
            if extra is not None:
                absorbed[extra] = out
    if not plans:
        return graph, False
    made: dict[Value, Value] = {}

    def rule(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...]) -> list[Value] | None:
        if node in absorbed:
            return [made[absorbed[node]]]
        if node not in plans:
            return None

        def const(array: np.ndarray) -> Value:
            return builder.add1("constant", [], {"value": Literal(np.ascontiguousarray(array))},
                                node.loc)

        if node.op.name == "matmul_w4":
            value = _from_w4(builder, node, inputs, producers, const)
        else:
            w, add, act = plans[node]
            n = w.shape[1]
            bias = _bias(add, node.outputs[0], producers, n) if add is not None else None
            packed, scales, zeros, group = _packed(np.asarray(w, _F32), options)
            attrs = {"format": options.mode, "group": group,
                     "zero_points": options.mode == "int4" and options.zero_points, "act": act}
            value = builder.add1("matmul_wq", [inputs[0], const(packed), const(scales),
                                               const(zeros),
                                               const(np.zeros(n, _F32) if bias is None
                                                     else bias)], attrs, node.loc)
        made[node.outputs[0]] = value
        return [value]

    return rewrite_nodes(graph, rule)


def _from_w4(builder: GraphBuilder, node: Node, inputs: tuple[Value, ...],
             producers: dict[Value, Node], const) -> Value:
    """A ``matmul_w4`` (constant operands) re-packed as ``matmul_wq``; f32 in and out."""
    wq, scales, zeros, bias = (_constant(v, producers) for v in node.inputs[1:])
    group = node.attrs["group"]
    codes = unpack_w4(wq)
    zp = not bool((zeros == 8).all())
    return builder.add1("matmul_wq", [inputs[0], const(pack_tiles(codes, "int4",
                                                                  chunk_lanes("int4", group))),
                                      const(np.asarray(scales, _F32)), const(zeros),
                                      const(np.asarray(bias, _F32))],
                        {"format": "int4", "group": group, "zero_points": zp,
                         "act": node.attrs["act"]}, node.loc)


__all__ = ["FP8_MAX", "K_MULTIPLE", "quantize_fp8", "quantize_weights_gpu"]
