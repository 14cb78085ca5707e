"""The packed layout of a matmul's right operand, and the two ways to produce it.

A ``[K, N]`` matrix B is cut into ``P = ceil(N / NR)`` panels of ``NR`` columns. Panel ``p`` is
stored as one contiguous ``K x NR`` block (row ``k`` of the panel holds ``B[k, p*NR : p*NR+NR]``);
the last panel is padded with zeros when ``NR`` does not divide ``N``. A batched ``[..., K, N]``
operand packs each matrix of the batch the same way, one after the other::

    packed[b, p, k, c] = B[b, k, p*NR + c]   (0 where p*NR + c >= N)

The micro-kernel then reads ``NR`` consecutive elements per ``k``: one or two cache lines, always
in order. Constant weights are packed once at compile time with :func:`pack_b`; a B computed at
run time is packed by the loop-IR kernel :func:`pack_b_kernel` into a scratch buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tilefuse.codegen.jit import aligned_empty
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.loop.ir import (
    BufferParam,
    Expr,
    If,
    LoopFunction,
    LoopKind,
    Stmt,
    XOp,
    binary,
    block,
    const,
    loop,
    var,
)
from tilefuse.loop.simplify import fold_constants

#: below this many elements a packing kernel runs on one thread (a parallel region costs µs)
PARALLEL_PACK_ELEMENTS = 1 << 16


def panel_count(n: int, nr: int) -> int:
    """How many ``nr``-column panels cover ``n`` columns."""
    if nr <= 0:
        raise CompileError(f"panel width must be positive, got {nr}")
    return -(-n // nr)


def packed_shape(shape: tuple[int, ...], nr: int) -> tuple[int, ...]:
    """The packed array's shape for a ``[..., K, N]`` operand: ``[..., P, K, NR]``."""
    if len(shape) < 2:
        raise CompileError(f"packing needs a matrix, got shape {list(shape)}")
    *batch, k, n = shape
    return (*batch, panel_count(n, nr), k, nr)


def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """``b`` (``[..., K, N]``) in the packed layout, zero-padded, in a new 64-byte aligned array."""
    b = np.asarray(b)
    if b.ndim < 2:
        raise CompileError(f"packing needs a matrix, got shape {list(b.shape)}")
    *batch, k, n = b.shape
    panels = panel_count(n, nr)
    padded = np.zeros((*batch, k, panels * nr), b.dtype)
    padded[..., :n] = b
    blocks = padded.reshape(*batch, k, panels, nr)
    out = aligned_empty(packed_shape(b.shape, nr), b.dtype)
    out[...] = np.moveaxis(blocks, -2, -3)  # [..., k, p, c] -> [..., p, k, c]
    return out


def unpack_b(packed: np.ndarray, n: int) -> np.ndarray:
    """The ``[..., K, N]`` matrix that :func:`pack_b` packed (the inverse, for tests and dumps)."""
    *batch, panels, k, nr = packed.shape
    blocks = np.moveaxis(packed, -3, -2).reshape(*batch, k, panels * nr)
    return np.ascontiguousarray(blocks[..., :n])


#: the elements a packing kernel copies: ``source(row, column, lanes)`` is the run of ``lanes``
#: elements of row ``row`` (of ``batch*K``) starting at ``column``
Source = Callable[[Expr, Expr, int], Expr]


def pack_b_kernel(name: str, batch: int, k: int, n: int, nr: int, dtype: DType,
                  lanes: int) -> LoopFunction:
    """A kernel ``name(B, Bp)`` that packs ``batch`` row-major ``[K, N]`` matrices of ``B`` into
    ``Bp`` (flat, :func:`packed_shape` layout)."""
    src = BufferParam("B", dtype, readonly=True)
    dst = BufferParam("Bp", dtype, align=64)
    return pack_kernel(name, batch * k, k, n, nr, dst,
                       lambda row, col, width: src.load(row * n + col, width), (src,), lanes)


def pack_kernel(name: str, rows: int, k: int, n: int, nr: int, dst: BufferParam,
                source: Source, inputs: Sequence[BufferParam], lanes: int,
                scalars: tuple[str, ...] = ()) -> LoopFunction:
    """A kernel ``name(*inputs, dst)`` writing ``rows = batch*K`` rows of ``n`` elements, given
    by ``source``, into ``dst`` in the packed layout (``nr = n`` is plain row-major order).
    Full panels are copied in vectors of ``lanes`` (``lanes`` 1: element by element) with a
    scalar remainder; the partial last panel element by element, then zero-filled. Parallel
    over the rows when there is enough to copy. ``rows`` and ``k`` may be runtime extents
    (Exprs over the kernel's ``scalars``): that test is then made at run time."""
    runtime = isinstance(rows, Expr) or isinstance(k, Expr)
    if isinstance(n, Expr) or (not runtime and (min(rows, k, n) <= 0 or rows % k)):
        raise CompileError(f"cannot pack {rows} rows of {n} into panels of {k} rows")
    panels, full = panel_count(n, nr), n // nr

    def row_loop(kind: LoopKind, tag: str = "") -> Stmt:
        """The loop over the rows (its names end in ``tag``)."""
        row = var("pk_row" + tag)
        panel_row = ((row // k) * (panels * k) + row % k) * nr  # element (b, p=0, row % k, 0)
        body: list[Stmt] = []
        if full:
            p, c, cs = var("pk_p" + tag), var("pk_c" + tag), var("pk_cs" + tag)
            width = (nr // lanes) * lanes if lanes > 1 else 0
            copy: list[Stmt] = []
            if width:
                copy.append(loop("pk_c" + tag, 0, width, [dst.store(
                    panel_row + p * (k * nr) + c, source(row, p * nr + c, lanes))],
                    step=lanes, kind=LoopKind.VECTORIZED))
            if width < nr:
                copy.append(loop("pk_cs" + tag, width, nr, [dst.store(
                    panel_row + p * (k * nr) + cs, source(row, p * nr + cs, 1))]))
            body.append(loop("pk_p" + tag, 0, full, copy))
        rem = n - full * nr
        if rem:
            t, z = var("pk_t" + tag), var("pk_z" + tag)
            tail = panel_row + full * k * nr
            body.append(loop("pk_t" + tag, 0, rem, [dst.store(tail + t, source(
                row, full * nr + t, 1))]))
            body.append(loop("pk_z" + tag, rem, nr, [dst.store(tail + z, const(0, dst.dtype))]))
        return loop("pk_row" + tag, 0, rows, block(*body), kind=kind)

    if runtime:  # threads only when this call's copy is large enough, as a static compile
        nest = If(binary(XOp.GE, rows * n, PARALLEL_PACK_ELEMENTS),
                  row_loop(LoopKind.PARALLEL), row_loop(LoopKind.SERIAL, "_1"))
    else:
        nest = row_loop(LoopKind.PARALLEL if rows * n >= PARALLEL_PACK_ELEMENTS
                        else LoopKind.SERIAL)
    fn = LoopFunction(name, (*inputs, dst), scalars, nest)
    return fold_constants(fn)[0]
