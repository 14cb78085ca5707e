"""Vector-by-matrix products as row reductions on the cuda target (a decode step's GEMVs).

A ``matmul`` of one row ``x [1, K]`` by a constant ``W [K, N]`` (a linear layer's folded,
transposed weight) moves ``K·N`` weight elements for ``2·K·N`` operations: it is bound by
memory, and cuBLAS's M = 1 kernels reach about 1.4 TB/s of the H200's 4.8 on them (the decode
step's 28 products, measured). As ``y[n] = Σ_k W'[n, k]·x[k]`` over the weight stored
transposed (``W' [N, K]``, a constant laid out at build time) it is a row reduction: a warp
per output element walking its contiguous row of ``K`` weights in 16-byte loads, ``x`` read
from cache, the products and their sum in f32 (as cuBLAS accumulates), the result rounded
once to the product's dtype; elementwise consumers fuse into the same kernel.

:func:`gemv_rows` rewrites each such product, and each product of few rows against a
transposed operand (:func:`_transposed_rows`: a decode step's scores ``q · kᵀ`` over the
cache), only when ``TILEFUSE_GPU_GEMV=1``. Measured on an H200 in the decode step
(2026-12-03, ``benchmarks/gpu_decode.py --ab``): the weight row reductions moved 1.1-1.7 TB/s,
no faster than cuBLAS (0.69 ms a step either way), and cost compile time (a transposed copy
of every weight); the scores as a row reduction took 145 µs a layer where cuBLAS took 3.4 µs,
because RoPE's gather (:mod:`tilefuse.runtime.gpu_views`) fused into it left it a thread per
row. Both stay off by default until a GEMV that holds several rows per warp exists.
"""

from __future__ import annotations

import math
import os

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Node, Value

GEMV_DTYPES = frozenset({DType.bf16, DType.f16, DType.f32})
MIN_K = 256
"""Shorter rows leave a warp too little to read; cuBLAS keeps them."""
ENV = "TILEFUSE_GPU_GEMV"


def _weight(producer: dict[Value, Node], node: Node) -> np.ndarray | None:
    """``node``'s constant 2-D right operand when it is a one-row GEMV this module takes."""
    if node.op.name != "matmul" or node.attrs:
        return None
    a, b = node.inputs[:2]
    if len(b.shape) < 2 or any(d != 1 for d in b.shape[:-2]) or len(a.shape) < 2 \
            or a.dtype not in GEMV_DTYPES \
            or b.dtype is not a.dtype or node.outputs[0].dtype is not a.dtype:
        return None
    if not all(isinstance(d, int) for d in a.shape) or math.prod(a.shape[:-1]) != 1:
        return None
    const = producer.get(b)
    if const is None or const.op.name != "constant" or \
            not isinstance(const.attrs.get("value"), Literal):
        return None
    k, n = b.shape[-2:]
    if k < MIN_K or n < 32:
        return None
    return const.attrs["value"].array.reshape(k, n)


MAX_ROWS = 16
"""Products of at most this many rows against a transposed operand are row reductions."""


def _transposed_rows(producer: dict[Value, Node], node: Node) -> Value | None:
    """``x`` when ``node`` is ``matmul(a [..., M, K], transpose(x [..., N, K]))`` with few rows
    ``M`` (a decode step's scores ``q · kᵀ`` against the cache): the product is then a row
    reduction over rows of ``x`` as they lie (no transposed copy of the keys)."""
    if node.op.name != "matmul" or node.attrs:
        return None
    a, b = node.inputs[:2]
    rank = len(a.shape)
    if rank < 3 or len(b.shape) != rank or a.shape[:-2] != b.shape[:-2] \
            or not all(isinstance(d, int) for d in (*a.shape, *b.shape)) \
            or a.dtype not in GEMV_DTYPES or b.dtype is not a.dtype \
            or node.outputs[0].dtype is not a.dtype or a.shape[-2] > MAX_ROWS \
            or a.shape[-1] % 32:
        return None
    t = producer.get(b)
    if t is None or t.op.name != "transpose" or \
            tuple(t.attrs["perm"]) != (*range(rank - 2), rank - 1, rank - 2):
        return None
    return t.inputs[0]


def gemv_rows(graph: Graph) -> Graph:
    """``graph`` with each one-row product by a constant matrix as a row reduction over the
    transposed matrix (module docstring); the same graph when there is none."""
    producer = graph.producers()
    if os.environ.get(ENV, "0") != "1":
        return graph
    found = {n: w for n in graph.nodes if (w := _weight(producer, n)) is not None}
    rows = {n: x for n in graph.nodes if (x := _transposed_rows(producer, n)) is not None}
    if not found and not rows:
        return graph
    b = GraphBuilder(graph.name)
    renamed: dict[Value, Value] = {v: b.input(v.type, v.name) for v in graph.inputs}
    transposed: dict[Value, Value] = {}
    for node in graph.nodes:
        inputs = tuple(renamed.get(v, v) for v in node.inputs)
        if node in rows:
            renamed[node.outputs[0]] = _row_product(b, node, inputs[0],
                                                    renamed.get(rows[node], rows[node]))
            continue
        weight = found.get(node)
        if weight is None:
            b.append(node if inputs == node.inputs else
                     Node(node.op, inputs, node.attrs, node.outputs, node.loc))
            continue
        a, dtype, loc = inputs[0], node.outputs[0].dtype, node.loc
        k = weight.shape[0]
        w = transposed.get(node.inputs[1])
        if w is None:   # one transposed copy per weight, however many products read it
            w = transposed[node.inputs[1]] = b.add1(
                "constant", [], {"value": Literal(np.ascontiguousarray(weight.T))}, loc)
        row = b.add1("reshape", [a], {"shape": (1, k)}, loc)
        if dtype is not DType.f32:
            w = b.add1("cast", [w], {"dtype": DType.f32}, loc)
            row = b.add1("cast", [row], {"dtype": DType.f32}, loc)
        total = b.add1("sum", [b.add1("mul", [w, row], {}, loc)],
                       {"axes": [-1], "keepdims": False}, loc)
        if dtype is not DType.f32:
            total = b.add1("cast", [total], {"dtype": dtype}, loc)
        renamed[node.outputs[0]] = b.add1("reshape", [total],
                                          {"shape": tuple(node.outputs[0].shape)}, loc)
    from tilefuse.passes.dce import dce

    return dce(b.build([renamed.get(v, v) for v in graph.outputs]))[0]


def _row_product(b: GraphBuilder, node: Node, a: Value, x: Value) -> Value:
    """``a [..., M, K] · x [..., N, K]ᵀ`` as ``sum(a[..., M, 1, K] · x[..., 1, N, K], -1)``, in
    f32 for half operands (cuBLAS's accumulation), rounded once."""
    *batch, m, k = (int(d) for d in a.shape)
    n = int(x.shape[-2])
    dtype, loc = node.outputs[0].dtype, node.loc
    left = b.add1("reshape", [a], {"shape": (*batch, m, 1, k)}, loc)
    right = b.add1("reshape", [x], {"shape": (*batch, 1, n, k)}, loc)
    if dtype is not DType.f32:
        left = b.add1("cast", [left], {"dtype": DType.f32}, loc)
        right = b.add1("cast", [right], {"dtype": DType.f32}, loc)
    total = b.add1("sum", [b.add1("mul", [left, right], {}, loc)],
                   {"axes": [-1], "keepdims": False}, loc)
    return total if dtype is DType.f32 else b.add1("cast", [total], {"dtype": dtype}, loc)


__all__ = ["ENV", "GEMV_DTYPES", "MAX_ROWS", "MIN_K", "gemv_rows"]
