"""Scaled dot-product attention as one op: ``softmax(q · kᵀ · scale + mask) · v``.

Inputs ``q [..., Sq, D]``, ``k [..., Sk, D]``, ``v [..., Sk, Dv]`` and an optional additive
``mask`` broadcastable to ``[..., Sq, Sk]`` (``-inf`` entries mask a key out); attribute
``scale``. Batch dims broadcast like matmul's. The result is ``[..., Sq, Dv]``.

The op is made by :mod:`tilefuse.passes.attention` from the plain ops it replaces, so the
native backend can run it as one tiled kernel that never holds the ``Sq × Sk`` scores
(:mod:`tilefuse.kernel.lower_attention`). It is deliberately *not* marked COMPOSITE: the
``decompose`` pass would undo the recognition. Its ``decompose`` still rebuilds the plain ops
(matmul, transpose, mul, add, softmax, matmul) for whoever wants them (tests, backends without
an attention kernel). The reference computes the plain way, in f32 for f16/bf16, rounding once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefuse.dtypes import FLOAT_TYPES, promote_all
from tilefuse.errors import ShapeError, SourceLoc
from tilefuse.graph.ir import Attrs, Value
from tilefuse.graph.types import Shape, broadcast_shapes, format_shape
from tilefuse.ops.registry import AttrType, OpDef, OpKind, attr
from tilefuse.ops.rules import as_dtype, dtype_of, promoted, quiet, work_dtype


def _attention_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    if len(shapes) not in (3, 4):
        raise ShapeError(f"attention takes q, k, v and an optional mask, got {len(shapes)} "
                         "inputs")
    q, k, v = shapes[:3]
    if min(len(q), len(k), len(v)) < 2:
        raise ShapeError(f"q {format_shape(q)}, k {format_shape(k)} and v {format_shape(v)} "
                         "need rank >= 2")
    if q[-1] != k[-1]:
        raise ShapeError(f"q {format_shape(q)} and k {format_shape(k)} differ in their last "
                         "(head) dim")
    if k[-2] != v[-2]:
        raise ShapeError(f"k {format_shape(k)} and v {format_shape(v)} differ in their key "
                         "count (second-to-last dim)")
    try:
        batch = broadcast_shapes(q[:-2], k[:-2], v[:-2])
    except ShapeError:
        raise ShapeError(f"batch dims of q {format_shape(q)}, k {format_shape(k)} and v "
                         f"{format_shape(v)} do not broadcast") from None
    if len(shapes) == 4:
        scores = (*batch, q[-2], k[-2])
        try:
            widened = broadcast_shapes(shapes[3], scores)
        except ShapeError:
            widened = None
        if widened != scores:
            raise ShapeError(f"mask {format_shape(shapes[3])} does not broadcast to the scores "
                             f"{format_shape(scores)}")
    return ((*batch, q[-2], v[-1]),)


def _attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                   *, scale: float) -> np.ndarray:
    arrays = (q, k, v) if mask is None else (q, k, v, mask)
    out = promote_all(tuple(dtype_of(a) for a in arrays))
    work = work_dtype(out)
    qw, kw, vw = (a.astype(work, copy=False) for a in (q, k, v))
    s = np.matmul(qw, np.swapaxes(kw, -1, -2)) * work.type(scale)
    if mask is not None:
        s = s + mask.astype(work, copy=False)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return as_dtype(np.matmul(e / e.sum(axis=-1, keepdims=True), vw), out)


def _reference(*arrays: np.ndarray, scale: float) -> np.ndarray:
    return _attention_ref(*arrays, scale=scale)


def _attention_decompose(builder: Any, inputs: Sequence[Value], attrs: Attrs,
                         loc: SourceLoc | None = None) -> tuple[Value, ...]:
    """matmul(softmax(matmul(q, swapaxes(k)) * scale + mask), v), in the inputs' promoted
    dtype (f16/bf16 inputs get the same plain ops; the reference widens them)."""
    q, k, v = inputs[:3]

    def op(name: str, *args: Value, **kw: Any) -> Value:
        return builder.add1(name, list(args), kw, loc)

    rank = k.type.rank
    perm = (*range(rank - 2), rank - 1, rank - 2)
    s = op("matmul", q, op("transpose", k, perm=perm))
    s = op("mul", s, op("full", shape=(), value=attrs["scale"], dtype=s.dtype))
    if len(inputs) == 4:
        s = op("add", s, inputs[3])
    return (op("matmul", op("softmax", s, axis=-1), v),)


SOFTMAX_OPS_PER_SCORE = 8
"""Scalar ops per score besides the two products: mask add, max, subtract, exp (4), sum."""


def attention_flops(shapes: Sequence[Shape]) -> float:
    """FLOPs of one attention on static ``shapes`` (q, k, v[, mask]): per batch·head
    ``2·Sq·Sk·(D + Dv)`` for the two products plus the softmax's ops on every score."""
    q, k, v = (tuple(int(d) for d in s) for s in shapes[:3])
    batch = 1
    for d in broadcast_shapes(q[:-2], k[:-2], v[:-2]):
        batch *= int(d)
    sq, sk, d, dv = q[-2], k[-2], q[-1], v[-1]
    return float(batch * sq * sk * (2 * (d + dv) + SOFTMAX_OPS_PER_SCORE))


ATTENTION = OpDef("attention", OpKind.CONTRACTION, None, _attention_rule, promoted,
                  quiet(_reference), attrs=(attr("scale", AttrType.FLOAT),),
                  accepts=FLOAT_TYPES, decompose=_attention_decompose,
                  doc="softmax(q · kᵀ · scale + mask) · v over the last axis (mask optional)")

DEFINITIONS: tuple[OpDef, ...] = (ATTENTION,)
