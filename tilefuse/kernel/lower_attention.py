"""Attention kernels: ``softmax(q · kᵀ · scale + mask) · v`` with an online softmax, never
holding the ``Sq × Sk`` scores (FlashAttention's idea, on the CPU).

Two loop functions per ATTENTION group (one launch step; the scratch lives only in it):

1. ``<name>_prep`` (parallel over batch·heads) packs k per key block of ``BK`` keys: ``kt[bh,
   kb, d, j] = k[bh, kb·BK + j, d] · scale``, each block one contiguous ``D × BK`` panel, the
   keys padded with zeros to whole blocks (so the score tile's loads are unit-stride, as the
   matmul's packed B); when ``Dv`` is not a multiple of the vector width it copies v into rows
   padded with zeros; and when the keys are a runtime extent or not a multiple of the width, it
   writes ``mpad``, the mask (0 without one) with -inf on the padded keys, so every score
   vector is whole. All linear in the sequence.
2. ``<name>`` runs the work items (batch·heads × query blocks of ``BQ`` rows) in ``T`` static
   slices (``T`` = the target's cores), one per parallel iteration; each slice owns a scratch
   region of the ``work`` buffer: probabilities ``[BQ, BK]``, output accumulator ``[BQ,
   Dv_pad]``, running max, sum and rescale factor ``[BQ]``. Per key block the register tiles
   of :mod:`tilefuse.kernel.attention_tiles` compute the scores and their softmax step in
   registers, then ``O = O · alpha + P · v``; finally ``out[i] = O[i] / l``. The last query
   block, the last key block and the last rows of a block are emitted with their static
   sizes.

The blocking is the kernel's :class:`~tilefuse.kernel.schedule.Schedule` (tiles ``q`` = BQ,
``k`` = BK; unroll ``q`` = the register tile's rows MR, ``v`` = its P·V vectors), validated
here, so it can be searched.

*Runtime extents* (batch dims, Sq, Sk symbolic: ``dim_<symbol>`` scalars; D and Dv static):
every key block is the static full-block code over ``mpad`` (P·V reads only the real keys);
the remaining ``Sq % BQ`` rows are one more block per batch·head, its last ``rows % MR`` rows
one static register tile per possible remainder.

The scratch is ``O(T·BQ·(BK + Dv))`` plus the linear prep buffers: the arena never holds
``Sq × Sk``. Rounding differs from the plain graph only by reassociation (the scale applied to
k, the division by the row sum applied to the output instead of the probabilities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.ir import Node, Value
from tilefuse.kernel.access import (
    Namer,
    as_extent,
    dims,
    identifier,
    is_extent,
    symbol_scalars,
)
from tilefuse.kernel.attention_tiles import QueryBlock
from tilefuse.kernel.fusion import KernelGroup
from tilefuse.kernel.schedule import (
    BLOCK_Q,
    KEY_VECTORS,
    MICRO_ROWS,
    PV_VECTORS,
    Schedule,
    attention_node,
)
from tilefuse.loop.ir import (
    BufferParam,
    Expr,
    If,
    Let,
    LoopFunction,
    LoopKind,
    Stmt,
    XOp,
    binary,
    block,
    const,
    loop,
    minimum,
    var,
)
from tilefuse.loop.simplify import fold_constants

MAX_ACCUMULATORS = 24
"""At most this many accumulator vectors per register tile (of 32 zmm: the rest hold the
loaded panel vectors, the broadcast and the softmax's temporaries)."""
SUPPORTED = frozenset({DType.f32, DType.f64})


@dataclass(frozen=True)
class AttentionShape:
    """Static sizes: ``batch`` (the output's batch dims), query/key counts, head dims, the
    mask's shape right-aligned to the scores' rank (None without a mask)."""

    batch: tuple[int, ...]
    sq: int
    sk: int
    d: int
    dv: int
    mask: tuple[int, ...] | None

    @property
    def bh(self) -> int:
        return math.prod(self.batch)

    @property
    def runtime(self) -> bool:
        """True when the batch dims, Sq or Sk are runtime extents (D and Dv never are)."""
        return any(is_extent(d) for d in (*self.batch, self.sq, self.sk))

    @staticmethod
    def of(node: Node) -> AttentionShape:
        q, k, v = (dims(x.shape, f"attention {name}") for x, name in
                   zip(node.inputs[:3], ("q", "k", "v")))
        out = dims(node.outputs[0].shape, "attention output")
        batch = out[:-2]
        if any(x[:-2] != batch for x in (q, k, v)):
            raise CompileError(f"attention with broadcast batch dims (q {list(q)}, k {list(k)}, "
                               f"v {list(v)}) is not lowered natively")
        mask = None
        if len(node.inputs) == 4:
            m = dims(node.inputs[3].shape, "attention mask")
            mask = (1,) * (len(out) - len(m)) + m
        if is_extent(q[-1]) or is_extent(v[-1]):
            raise CompileError("attention head dims must be static, got "
                               f"D={q[-1]}, Dv={v[-1]}")
        scores = (*batch, q[-2], k[-2])
        if mask is not None and any(is_extent(m) and m != d for m, d in zip(mask, scores)):
            raise CompileError(f"attention mask {list(mask)} broadcasts a symbol against the "
                               f"scores {list(scores)} (1 or not is known only per size)")
        return AttentionShape(batch, q[-2], k[-2], q[-1], v[-1], mask)


@dataclass(frozen=True)
class AttentionSizes:
    """The blocking: vector ``lanes``, blocks, register tile rows and P·V vectors,
    ``threads`` scratch slices, the padded key count (whole key blocks) and v row length."""

    lanes: int
    block_q: int
    block_k: int
    rows: int
    pv_vectors: int
    threads: int
    sk_pad: int | Expr
    dv_pad: int

    @property
    def key_blocks(self) -> int | Expr:
        return self.sk_pad // self.block_k

    @property
    def per_thread(self) -> int:
        """Elements of one slice of ``work``: probabilities, output accumulator, max, sum,
        rescale factor."""
        return self.block_q * (self.block_k + self.dv_pad + 3)


def attention_sizes(shape: AttentionShape, schedule: Schedule, threads: int) -> AttentionSizes:
    """The blocking a schedule asks for, clamped to static extents (a block no larger than
    the queries, or the keys rounded up to whole vectors); CompileError for one that does not
    fit (a key block not of whole vectors, a register tile over MAX_ACCUMULATORS)."""
    w = schedule.vector_width
    block_q = schedule.tile("q") or BLOCK_Q
    if not is_extent(shape.sq):
        block_q = min(block_q, max(shape.sq, 1))
    block_k = schedule.tile("k") or KEY_VECTORS * w
    if block_k % w:
        raise CompileError(f"attention key block {block_k} is not a multiple of the vector "
                           f"width {w}")
    if not is_extent(shape.sk):
        block_k = min(block_k, -(-max(shape.sk, 1) // w) * w)
    unroll = dict(schedule.unroll)
    rows, pv = unroll.get("q", MICRO_ROWS), unroll.get("v", PV_VECTORS)
    dv_pad = -(-shape.dv // w) * w
    widest = max(block_k // w, min(pv, dv_pad // w))
    if rows * widest > MAX_ACCUMULATORS:
        raise CompileError(f"attention register tile {rows} rows × {widest} vectors exceeds "
                           f"{MAX_ACCUMULATORS} accumulators")
    sk_pad = (shape.sk + (block_k - 1)) // block_k * block_k
    return AttentionSizes(w, block_q, block_k, rows, pv, max(threads, 1), sk_pad, dv_pad)


def attention_scratch_bytes(shape: AttentionShape, sizes: AttentionSizes, itemsize: int
                            ) -> dict[str, int | Expr]:
    """The scratch buffers of one attention kernel and their bytes (the arena formula; Exprs
    over the runtime extents when the shape has some)."""
    scratch = {"kt": shape.bh * shape.d * sizes.sk_pad,
               "work": sizes.threads * sizes.per_thread}
    if sizes.dv_pad != shape.dv:
        scratch["vp"] = shape.bh * shape.sk * sizes.dv_pad
    if padded_mask(shape, sizes):
        scratch["mpad"] = mask_rows(shape) * sizes.sk_pad
    return {name: count * itemsize for name, count in scratch.items()}


def padded_mask(shape: AttentionShape, sizes: AttentionSizes) -> bool:
    """Whether the main kernel reads the padded mask ``mpad``: runtime keys (every block
    whole) or keys that are not whole vectors (the last score vector is partial)."""
    return shape.runtime or shape.sk % sizes.lanes != 0


def mask_rows(shape: AttentionShape) -> int | Expr:
    """Rows of the padded mask ``mpad`` (runtime extents): the mask's rows, 1 without one."""
    return 1 if shape.mask is None else math.prod(shape.mask[:-1])


@dataclass(frozen=True)
class LoweredAttention:
    """The kernels (prep, main), buffer name → group value, scratch buffer name → bytes."""

    functions: tuple[LoopFunction, ...]
    bindings: dict[str, Value]
    scratch: dict[str, int | Expr]


def lower_attention(group: KernelGroup, schedule: Schedule, threads: int) -> LoweredAttention:
    """The loop IR of an ATTENTION group (see the module docstring). CompileError for what is
    not lowered natively (dtypes other than f32/f64, broadcast batch dims, a mask of another
    dtype, symbolic dims)."""
    node = attention_node(group)
    dtype = node.outputs[0].dtype
    if dtype not in SUPPORTED or any(v.dtype is not dtype for v in node.inputs):
        raise CompileError(f"attention in {', '.join(str(v.dtype) for v in node.inputs)} is "
                           "not lowered natively (f32 or f64 throughout)")
    shape = AttentionShape.of(node)
    sizes = attention_sizes(shape, schedule, threads)
    return _Lowering(group, node, shape, sizes, dtype).lower()


class _Lowering:
    """Emits both functions of one attention kernel."""

    def __init__(self, group: KernelGroup, node: Node, shape: AttentionShape,
                 sizes: AttentionSizes, dtype: DType):
        self.name = identifier(group.name)
        self.node, self.shape, self.sizes, self.dtype = node, shape, sizes, dtype
        self.namer = Namer()
        names = ("q", "k", "v", "mask")
        self.inputs = {name: BufferParam(name, dtype, readonly=True)
                       for name, _ in zip(names, node.inputs)}
        self.out = BufferParam("out", dtype)
        self.kt = BufferParam("kt", dtype)
        self.kt_read = BufferParam("kt", dtype, readonly=True)
        self.work = BufferParam("work", dtype)
        self.padded_v = sizes.dv_pad != shape.dv
        self.vp = BufferParam("vp", dtype) if self.padded_v else None
        self.runtime = shape.runtime
        self.padded_mask = padded_mask(shape, sizes)
        self.mpad = BufferParam("mpad", dtype)
        self.mpad_read = BufferParam("mpad", dtype, readonly=True)
        self.scalars = symbol_scalars([*node.inputs, *node.outputs])
        self.namer.taken |= {*self.inputs, "out", "kt", "work", "vp", "mpad", *self.scalars}

    # ---- small helpers ------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        return self.namer.fresh(prefix)

    def let(self, prefix: str, value: Expr) -> tuple[Let, Expr]:
        stmt = Let(self.fresh(prefix), value)
        return stmt, stmt.ref

    def f(self, value: float, lanes: int = 1) -> Expr:
        return const(value, self.dtype, lanes)

    def lower(self) -> LoweredAttention:
        bindings = {name: v for name, v in zip(self.inputs, self.node.inputs)}
        bindings["out"] = self.node.outputs[0]
        prep_buffers = (self.inputs["k"], self.inputs["v"], self.kt) + \
            ((self.vp,) if self.vp is not None else ())
        mask = self.inputs.get("mask")
        if self.padded_mask:
            prep_buffers += ((mask,) if mask is not None else ()) + (self.mpad,)
            mask = self.mpad_read
        prep = LoopFunction(f"{self.name}_prep", prep_buffers, self.scalars, self.prep())
        main_buffers = tuple(b for b in (self.inputs["q"], self.kt_read, self.v_source()[0],
                                         mask, self.work, self.out)
                             if b is not None)
        main = LoopFunction(self.name, main_buffers, self.scalars, self.main())
        scratch = attention_scratch_bytes(self.shape, self.sizes, self.dtype.itemsize)
        functions = tuple(fold_constants(fn)[0] for fn in (prep, main))
        return LoweredAttention(functions, bindings, scratch)

    def v_source(self) -> tuple[BufferParam, int]:
        """The buffer the main kernel reads v from, and its row length."""
        if self.vp is not None:
            return BufferParam("vp", self.dtype, readonly=True), self.sizes.dv_pad
        return self.inputs["v"], self.shape.dv

    def kt_panel(self, bh: Expr, kb: Expr) -> Expr:
        """Offset in ``kt`` of key block ``kb``'s ``D × BK`` panel of batch·head ``bh``."""
        z = self.sizes
        return (bh * z.key_blocks + kb) * (self.shape.d * z.block_k)

    # ---- prep: kt = kᵀ · scale packed per key block, v rows padded, the padded mask ------
    def prep(self) -> Stmt:
        s, z = self.shape, self.sizes
        b, kb, j, d = self.fresh("b"), self.fresh("kb"), self.fresh("j"), self.fresh("d")
        bv, kbv, jv, dv = var(b), var(kb), var(j), var(d)
        scale = self.f(self.node.attrs["scale"])
        k_elem = self.inputs["k"].load((bv * s.sk + kbv * z.block_k + jv) * s.d + dv)
        panel = self.kt_panel(bv, kbv)
        keys = minimum(s.sk - kbv * z.block_k, z.block_k)
        body: list[Stmt] = [loop(kb, 0, z.key_blocks, [loop(j, 0, keys, [loop(d, 0, s.d, [
            self.kt.store(panel + dv * z.block_k + jv, k_elem * scale)])])])]
        if is_extent(s.sk) or z.sk_pad != s.sk:   # zeros on the last block's padded keys
            j2, d2 = self.fresh("j"), self.fresh("d")
            last = self.kt_panel(bv, z.key_blocks - 1)
            first = s.sk - (z.key_blocks - 1) * z.block_k
            body.append(loop(d2, 0, s.d, [loop(j2, first, z.block_k, [
                self.kt.store(last + var(d2) * z.block_k + var(j2), self.f(0.0))])]))
        if self.vp is not None:
            j3, d3, d4 = self.fresh("j"), self.fresh("d"), self.fresh("d")
            row = (bv * s.sk + var(j3)) * z.dv_pad
            body.append(loop(j3, 0, s.sk, [
                loop(d3, 0, s.dv, [self.vp.store(row + var(d3), self.inputs["v"].load(
                    (bv * s.sk + var(j3)) * s.dv + var(d3)))]),
                loop(d4, s.dv, z.dv_pad, [self.vp.store(row + var(d4), self.f(0.0))])]))
        per_head = loop(b, 0, s.bh, body, kind=LoopKind.PARALLEL)
        return block(per_head, self.pad_mask()) if self.padded_mask else per_head

    def pad_mask(self) -> Stmt:
        """``mpad[row, j]`` = the mask (0 without one) for keys below Sk, -inf for the
        padding up to ``sk_pad``, so every score vector is whole."""
        s, z = self.shape, self.sizes
        r, j, e = self.fresh("mr"), self.fresh("j"), self.fresh("j")
        rv = var(r)
        row = rv * z.sk_pad
        if s.mask is None:
            value = self.f(0.0)
        else:
            mk = s.mask[-1]
            mask = self.inputs["mask"]
            value = mask.load(rv) if not is_extent(mk) and mk == 1 else mask.load(rv * mk + var(j))
        return loop(r, 0, mask_rows(s), [
            loop(j, 0, s.sk, [self.mpad.store(row + var(j), value)]),
            loop(e, s.sk, z.sk_pad, [self.mpad.store(row + var(e), self.f(float("-inf")))])])

    # ---- main: work items in T slices ----------------------------------------------------
    def main(self) -> Stmt:
        s, z = self.shape, self.sizes
        if self.runtime and is_extent(s.sq):   # a static Sq with runtime batch·heads: below
            return self.runtime_main()
        full_blocks, tail_rows = divmod(s.sq, z.block_q)
        stmts: list[Stmt] = []
        if full_blocks:
            stmts.append(self.slices(s.bh * full_blocks, lambda w: (
                w // full_blocks, (w % full_blocks) * z.block_q), z.block_q))
        if tail_rows:
            start = full_blocks * z.block_q
            stmts.append(self.slices(s.bh, lambda w: (w, const(start)), tail_rows))
        return block(*stmts)

    def runtime_main(self) -> Stmt:
        """:meth:`main` for runtime extents: the full query blocks, then (when Sq is not a
        multiple of the block) one block of the remaining rows per batch·head."""
        s, z = self.shape, self.sizes
        full_blocks = s.sq // z.block_q
        tail_rows = s.sq - full_blocks * z.block_q
        full = self.slices(s.bh * full_blocks, lambda w: (
            w // full_blocks, (w % full_blocks) * z.block_q), z.block_q)
        tail = self.slices(s.bh, lambda w: (w, full_blocks * z.block_q), tail_rows)
        return block(full, If(binary(XOp.NE, tail_rows, 0), tail))

    def slices(self, items: int, locate: Any, rows: int) -> Stmt:
        """``parallel for t < T: for w in slice t: query_block(locate(w), rows)``."""
        if is_extent(items):  # T slices of a runtime count (some may be empty)
            threads, chunk = self.sizes.threads, (items + (self.sizes.threads - 1)) // \
                self.sizes.threads
        else:
            threads = min(self.sizes.threads, items)
            chunk = -(-items // threads)
        t, w = self.fresh("t"), self.fresh("w")
        tv, wv = var(t), var(w)
        bh, q0 = locate(wv)
        let_bh, bh_ref = self.let("bh", bh)
        let_q0, q0_ref = self.let("q0", q0)
        body = [let_bh, let_q0, *self.query_block(bh_ref, q0_ref, rows, tv)]
        inner = loop(w, tv * chunk, minimum(tv * chunk + chunk, as_extent(items)), body)
        return loop(t, 0, threads, [inner], kind=LoopKind.PARALLEL)

    def query_block(self, bh: Expr, q0: Expr, rows: int | Expr, t: Expr) -> list[Stmt]:
        s, z = self.shape, self.sizes
        let_base, base = self.let("base", t * z.per_thread)
        blk = QueryBlock(self, bh, q0, rows, base)
        stmts: list[Stmt] = [let_base, *blk.mask_base(), *blk.init()]
        kb = self.fresh("kb")
        kbv = var(kb)
        if self.runtime:  # whole key blocks over the padded keys; P·V reads the real ones
            stmts.append(loop(kb, 0, z.key_blocks, blk.key_block(
                kbv, z.block_k, minimum(s.sk - kbv * z.block_k, z.block_k))))
            stmts.extend(blk.finish())
            return stmts
        full, tail = divmod(s.sk, z.block_k)
        if full:
            stmts.append(loop(kb, 0, full, blk.key_block(kbv, z.block_k, z.block_k)))
        if tail:
            stmts.extend(blk.key_block(const(full), tail, tail))
        stmts.extend(blk.finish())
        return stmts
