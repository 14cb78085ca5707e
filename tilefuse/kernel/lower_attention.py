"""Attention kernels: ``softmax(q · kᵀ · scale + mask) · v`` with an online softmax, never
holding the ``Sq × Sk`` scores (FlashAttention's idea, on the CPU).

Two loop functions per ATTENTION group (one launch step; the scratch lives only in it):

1. ``<name>_prep`` (parallel over batch·heads) lays k out as ``kt[bh, d, j] = k[bh, j, d] ·
   scale`` with the key axis padded with zeros to a multiple of the vector width, so scores
   vectorise along keys; and, when ``Dv`` is not a multiple of the width, copies v into rows
   padded with zeros. Both are linear in the sequence.
2. ``<name>`` runs the work items (batch·heads × query blocks of ``BQ`` rows) in ``T`` static
   slices (``T`` = the target's cores), one per parallel iteration; each slice owns a scratch
   region of the ``work`` buffer: scores ``[BQ, BK]``, output accumulator ``[BQ, Dv_pad]``,
   running max and sum ``[BQ]``. Per query block, per key block of ``BK`` keys::

       S[i, :] = q[i] · kt[:, block]            MR×(BK/W) vector FMA register tile, q broadcast
       S[i, :] += mask;  m' = max(m, max S[i]);  a = exp(m - m');  S[i] = exp(S[i] - m')
       l = l·a + sum S[i];  O[i] *= a;  m = m'   (a fully masked block: m' = -inf is taken as 0)
       O[i, :] += S[i, :] · v[block]            MR×(chunk/W) register tile, S broadcast

   and finally ``out[i] = O[i] / l``. Every block size is static: the last query and key blocks
   and the last rows of a block are emitted as their own code with their exact sizes.

*Runtime extents* (batch dims, Sq, Sk symbolic: ``dim_<symbol>`` scalars; D and Dv static): kt
is padded to whole key blocks and the prep kernel writes ``mpad``, the mask (0 without one)
with -inf on the padded keys, so every key block is the static full-block code and P·V reads
only the real keys; the remaining ``Sq % BQ`` rows are one more block per batch·head, its last
``rows % MR`` rows one static register tile per possible remainder. Static shapes lower as
before.

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
    c_strides,
    dims,
    identifier,
    is_extent,
    symbol_scalars,
    unflatten,
)
from tilefuse.kernel.fusion import KernelGroup, KernelKind
from tilefuse.kernel.schedule import Schedule, as_cpu_target
from tilefuse.loop.ir import (
    BufferParam,
    Expr,
    If,
    Let,
    Local,
    LoopFunction,
    LoopKind,
    LType,
    Stmt,
    XOp,
    binary,
    block,
    broadcast,
    const,
    fma,
    loop,
    maximum,
    minimum,
    reduce,
    select,
    unary,
    var,
)
from tilefuse.loop.simplify import fold_constants

BLOCK_Q = 64
"""Query rows per work item: the scores scratch is BLOCK_Q × BLOCK_K per thread."""
BLOCK_K = 64
"""Keys per block (a multiple of the vector width): 4 zmm vectors of f32 per score row."""
MICRO_ROWS = 4
"""Query rows per register tile: 4 rows × 4 vectors = 16 accumulators of 32 zmm."""
PV_VECTORS = 4
"""Output vectors per register tile of the probabilities · v product."""
SUPPORTED = frozenset({DType.f32, DType.f64})


def default_attention_schedule(group: KernelGroup, target: Any = None) -> Schedule:
    """The attention kernel's schedule: query and key blocks (``tiles``), the register tile's
    rows (``unroll`` of ``q``), vectors along keys of the target's width."""
    cpu = as_cpu_target(target)
    node = attention_node(group)
    lanes = cpu.lanes(node.outputs[0].dtype)
    block_k = max(lanes, BLOCK_K // lanes * lanes)
    return Schedule(KernelKind.ATTENTION, tiles=(("q", BLOCK_Q), ("k", block_k)),
                    order=("b", "q", "k"), vector_axis="k", vector_width=lanes,
                    parallel_axes=("b", "q"), unroll=(("q", MICRO_ROWS),))


def attention_node(group: KernelGroup) -> Node:
    found = [n for n in group.nodes if n.op.name == "attention"]
    if len(found) != 1 or len(group.nodes) != 1:
        raise CompileError(f"kernel {group.name}: an attention kernel holds one attention node")
    return found[0]


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
    """The blocking: vector ``lanes``, blocks, register tile rows, ``threads`` scratch slices,
    and the padded key count / v row length."""

    lanes: int
    block_q: int
    block_k: int
    rows: int
    threads: int
    sk_pad: int
    dv_pad: int

    @property
    def per_thread(self) -> int:
        """Elements of one slice of ``work``: scores, output accumulator, max, sum."""
        return self.block_q * (self.block_k + self.dv_pad + 2)


def attention_sizes(shape: AttentionShape, schedule: Schedule, threads: int) -> AttentionSizes:
    w = schedule.vector_width
    block_q = schedule.tile("q") or BLOCK_Q
    if not is_extent(shape.sq):
        block_q = min(block_q, max(shape.sq, 1))
    block_k = schedule.tile("k") or BLOCK_K
    if block_k % w:
        raise CompileError(f"attention key block {block_k} is not a multiple of the vector "
                           f"width {w}")
    rows = dict(schedule.unroll).get("q", MICRO_ROWS)
    # runtime keys: kt padded to whole key blocks, so every block is a full one (the padded
    # keys get -inf from the padded mask, ``mpad``)
    unit = block_k if shape.runtime else w
    return AttentionSizes(w, block_q, block_k, rows, max(threads, 1),
                          (shape.sk + (unit - 1)) // unit * unit, -(-shape.dv // w) * w)


def attention_scratch_bytes(shape: AttentionShape, sizes: AttentionSizes, itemsize: int
                            ) -> dict[str, int | Expr]:
    """The scratch buffers of one attention kernel and their bytes (the arena formula; Exprs
    over the runtime extents when the shape has some)."""
    scratch = {"kt": shape.bh * shape.d * sizes.sk_pad,
               "work": sizes.threads * sizes.per_thread}
    if sizes.dv_pad != shape.dv:
        scratch["vp"] = shape.bh * shape.sk * sizes.dv_pad
    if shape.runtime:
        scratch["mpad"] = mask_rows(shape) * sizes.sk_pad
    return {name: count * itemsize for name, count in scratch.items()}


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
        if self.runtime:
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

    # ---- prep: kt = kᵀ · scale (keys padded), v rows padded -------------------------------
    def prep(self) -> Stmt:
        s, z = self.shape, self.sizes
        b, j, d = self.fresh("b"), self.fresh("j"), self.fresh("d")
        bv, jv, dv = var(b), var(j), var(d)
        scale = self.f(self.node.attrs["scale"])
        k_elem = self.inputs["k"].load((bv * s.sk + jv) * s.d + dv)
        body: list[Stmt] = [loop(j, 0, s.sk, [loop(d, 0, s.d, [
            self.kt.store((bv * s.d + dv) * z.sk_pad + jv, k_elem * scale)])])]
        if self.runtime or z.sk_pad > s.sk:
            j2, d2 = self.fresh("j"), self.fresh("d")
            body.append(loop(d2, 0, s.d, [loop(j2, s.sk, z.sk_pad, [
                self.kt.store((bv * s.d + var(d2)) * z.sk_pad + var(j2), self.f(0.0))])]))
        if self.vp is not None:
            j3, d3, d4 = self.fresh("j"), self.fresh("d"), self.fresh("d")
            row = (bv * s.sk + var(j3)) * z.dv_pad
            body.append(loop(j3, 0, s.sk, [
                loop(d3, 0, s.dv, [self.vp.store(row + var(d3), self.inputs["v"].load(
                    (bv * s.sk + var(j3)) * s.dv + var(d3)))]),
                loop(d4, s.dv, z.dv_pad, [self.vp.store(row + var(d4), self.f(0.0))])]))
        per_head = loop(b, 0, s.bh, body, kind=LoopKind.PARALLEL)
        return block(per_head, self.pad_mask()) if self.runtime else per_head

    def pad_mask(self) -> Stmt:
        """Runtime extents: ``mpad[row, j]`` = the mask (0 without one) for keys below Sk,
        -inf for the padding up to ``sk_pad``, so every key block runs whole."""
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
        if self.runtime:
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

    def query_block(self, bh: Expr, q0: Expr, rows: int, t: Expr) -> list[Stmt]:
        s, z = self.shape, self.sizes
        let_base, base = self.let("base", t * z.per_thread)
        blk = _Block(self, bh, q0, rows, base)
        stmts: list[Stmt] = [let_base, *blk.mask_base(), *blk.init()]
        if self.runtime:  # whole key blocks over the padded keys; P·V reads the real ones
            kb = self.fresh("kb")
            k0 = var(kb) * z.block_k
            stmts.append(loop(kb, 0, z.sk_pad // z.block_k, blk.key_block(
                k0, z.block_k, minimum(s.sk - k0, z.block_k))))
            stmts.extend(blk.finish())
            return stmts
        full, tail = divmod(s.sk, z.block_k)
        if full:
            kb = self.fresh("kb")
            stmts.append(loop(kb, 0, full, blk.key_block(var(kb) * z.block_k, z.block_k)))
        if tail:
            stmts.extend(blk.key_block(const(full * z.block_k), tail))
        stmts.extend(blk.finish())
        return stmts


class _Block:
    """The code of one query block of ``rows`` rows, scratch slice at ``base``."""

    def __init__(self, low: _Lowering, bh: Expr, q0: Expr, rows: int, base: Expr):
        self.low, self.bh, self.q0, self.rows, self.base = low, bh, q0, rows, base
        z = low.sizes
        self.w = z.lanes
        self.s_off = base
        self.o_off = base + z.block_q * z.block_k
        self.m_off = self.o_off + z.block_q * z.dv_pad
        self.l_off = self.m_off + z.block_q
        self.mask_offset: Expr | None = None

    def vec(self, value: Expr) -> Expr:
        return broadcast(value, self.w)

    def rows_loop(self, body_of: Any) -> Stmt:
        i = self.low.fresh("i")
        return loop(i, 0, self.rows, body_of(var(i)))

    # ---- setup and finish ---------------------------------------------------------------
    def mask_base(self) -> list[Stmt]:
        """``mbase``: the mask offset of this block's batch index (broadcast dims stride 0)."""
        mask = self.low.shape.mask
        if self.low.runtime:  # the padded mask: rows of sk_pad
            mask = (1, 1) if mask is None else (*mask[:-1], self.low.sizes.sk_pad)
        if mask is None:
            return []
        batch = self.low.shape.batch
        strides = c_strides(mask)
        index = unflatten(self.bh, batch)
        offset: Expr = const(0)
        for a, (size, stride) in enumerate(zip(mask[:-2], strides[:-2])):
            if size != 1:
                offset = offset + index[a] * stride
        stmt, self.mask_offset = self.low.let("mbase", offset)
        return [stmt]

    def init(self) -> list[Stmt]:
        low, z = self.low, self.low.sizes
        work = low.work

        def body(i: Expr) -> list[Stmt]:
            c = low.fresh("c")
            return [work.store(self.m_off + i, low.f(float("-inf"))),
                    work.store(self.l_off + i, low.f(0.0)),
                    loop(c, 0, z.dv_pad, [work.store(self.o_off + i * z.dv_pad + var(c),
                                                     low.f(0.0, self.w))],
                         step=self.w, kind=LoopKind.VECTORIZED)]
        return [self.rows_loop(body)]

    def finish(self) -> list[Stmt]:
        low, s, z = self.low, self.low.shape, self.low.sizes
        work, out = low.work, low.out

        def body(i: Expr) -> list[Stmt]:
            let_l, total = low.let("l", work.load(self.l_off + i))
            dst = (self.bh * s.sq + self.q0 + i) * s.dv
            src = self.o_off + i * z.dv_pad
            c, e = low.fresh("c"), low.fresh("e")
            vector_end = s.dv // self.w * self.w
            return [let_l,
                    loop(c, 0, vector_end, [out.store(dst + var(c), work.load(
                        src + var(c), self.w) / self.vec(total))],
                         step=self.w, kind=LoopKind.VECTORIZED),
                    loop(e, vector_end, s.dv, [out.store(dst + var(e), work.load(
                        src + var(e)) / total)])]
        return [self.rows_loop(body)]

    # ---- one key block ------------------------------------------------------------------
    def key_block(self, k0: Expr, nk: int, nk_pv: Expr | None = None) -> list[Stmt]:
        """Scores, softmax update and P·V of ``nk`` keys from ``k0`` (P·V over ``nk_pv`` of
        them when given: the real keys of a padded block)."""
        mr = self.low.sizes.rows
        if is_extent(self.rows):
            return self.runtime_key_block(k0, nk, nk_pv)
        full, tail = divmod(self.rows, mr)
        stmts: list[Stmt] = []
        for tile in (self.scores_tile, self.pv_tile):
            n = nk if tile == self.scores_tile or nk_pv is None else nk_pv
            if full:
                it = self.low.fresh("it")
                stmts.append(loop(it, 0, full, tile(var(it) * mr, mr, k0, n)))
            if tail:
                stmts.extend(tile(const(full * mr), tail, k0, n))
            if tile == self.scores_tile:
                stmts.append(self.rows_loop(lambda i: self.softmax_update(i, k0, nk)))
        return stmts

    def runtime_key_block(self, k0: Expr, nk: int, nk_pv: Expr | None) -> list[Stmt]:
        """:meth:`key_block` for a runtime row count: whole register tiles, then the last
        ``rows % MR`` rows by one static tile per possible remainder."""
        mr = self.low.sizes.rows
        full = self.rows // mr
        rest = self.rows - full * mr
        stmts: list[Stmt] = []
        for tile in (self.scores_tile, self.pv_tile):
            n = nk if tile == self.scores_tile or nk_pv is None else nk_pv
            it = self.low.fresh("it")
            stmts.append(loop(it, 0, full, tile(var(it) * mr, mr, k0, n)))
            for t in range(1, mr):
                stmts.append(If(binary(XOp.EQ, rest, t), block(*tile(full * mr, t, k0, n))))
            if tile == self.scores_tile:
                stmts.append(self.rows_loop(lambda i: self.softmax_update(i, k0, nk)))
        return stmts

    def scores_tile(self, i0: Expr, mr: int, k0: Expr, nk: int) -> list[Stmt]:
        """S[i0:i0+mr, :nk] = q[rows] · kt[:, k0:k0+nk] (whole vectors; the pad is zeros)."""
        low, s, z = self.low, self.low.shape, self.low.sizes
        nv = -(-nk // self.w)
        acc = Local(low.fresh("sacc"), LType(low.dtype, self.w), mr * nv)
        d = low.fresh("d")
        dv = var(d)
        body: list[Stmt] = []
        kvecs = []
        for c in range(nv):
            stmt, ref = low.let("kv", low.kt_read.load(
                (self.bh * s.d + dv) * z.sk_pad + k0 + c * self.w, self.w))
            body.append(stmt)
            kvecs.append(ref)
        for r in range(mr):
            stmt, qs = low.let("qs", self.vec(low.inputs["q"].load(
                (self.bh * s.sq + self.q0 + i0 + r) * s.d + dv)))
            body.append(stmt)
            body.extend(acc.store(r * nv + c, fma(qs, kvecs[c], acc.load(r * nv + c)))
                        for c in range(nv))
        stores = [low.work.store(self.s_off + (i0 + r) * z.block_k + c * self.w,
                                 acc.load(r * nv + c)) for r in range(mr) for c in range(nv)]
        zeros = [acc.store(x, low.f(0.0, self.w)) for x in range(mr * nv)]
        return [acc, *zeros, loop(d, 0, s.d, body), *stores]

    def mask_at(self, row: Expr, key: Expr, lanes: int) -> Expr | None:
        """The mask at (row, key .. key+lanes-1) of this block's batch index, or None."""
        low, s = self.low, self.low.shape
        mask = s.mask
        if low.runtime:  # the padded mask (-inf beyond Sk), whole vectors
            mq = 1 if mask is None else mask[-2]
            index = self.mask_offset if self.mask_offset is not None else const(0)
            if is_extent(mq) or mq != 1:
                index = index + row * low.sizes.sk_pad
            return low.mpad_read.load(index + key, lanes)
        if mask is None or self.mask_offset is None:
            return None
        mq, mk = mask[-2:]
        index = self.mask_offset
        if mq != 1:
            index = index + row * mk
        if mk == 1:
            value = low.inputs["mask"].load(index)
            return self.vec(value) if lanes > 1 else value
        return low.inputs["mask"].load(index + key, lanes)

    def softmax_update(self, i: Expr, k0: Expr, nk: int) -> list[Stmt]:
        """Row i: add the mask, fold the block into the running max and sum, turn S[i] into
        probabilities relative to the new max and rescale the output accumulator."""
        low, z = self.low, self.low.sizes
        work, w = low.work, self.w
        row = self.q0 + i
        start = self.s_off + i * z.block_k
        stmts: list[Stmt] = []
        nfull, ntail = divmod(nk, w)
        scores: list[tuple[Expr, int, int]] = []   # (value, offset in block, lanes)
        for c in range(nfull + ntail):
            lanes, offset = (w, c * w) if c < nfull else (1, nfull * w + c - nfull)
            value = work.load(start + offset, lanes)
            mask = self.mask_at(row, k0 + offset, lanes)
            if mask is not None:
                value = value + mask
            stmt, ref = low.let("s", value)
            stmts.append(stmt)
            scores.append((ref, offset, lanes))
        block_max: Expr = low.f(float("-inf"))
        for ref, _, lanes in scores:
            block_max = maximum(block_max, reduce(XOp.REDUCE_MAX, ref) if lanes > 1 else ref)
        let_old, m_old = low.let("m", work.load(self.m_off + i))
        let_new, m_new = low.let("mn", maximum(m_old, block_max))
        let_use, m_use = low.let("mu", select(binary(XOp.EQ, m_new, low.f(float("-inf"))),
                                              low.f(0.0), m_new))
        let_alpha, alpha = low.let("alpha", unary(XOp.EXP, m_old - m_use))
        stmts += [let_old, let_new, let_use, let_alpha]
        total: Expr = low.f(0.0)
        for ref, offset, lanes in scores:
            shift = self.vec(m_use) if lanes > 1 else m_use
            stmt, p = low.let("p", unary(XOp.EXP, ref - shift))
            stmts += [stmt, work.store(start + offset, p)]
            total = total + (reduce(XOp.REDUCE_ADD, p) if lanes > 1 else p)
        stmts += [work.store(self.m_off + i, m_new),
                  work.store(self.l_off + i, fma(work.load(self.l_off + i), alpha, total))]
        c = low.fresh("c")
        o = self.o_off + i * z.dv_pad + var(c)
        stmts.append(loop(c, 0, z.dv_pad, [work.store(o, work.load(o, w) * self.vec(alpha))],
                          step=w, kind=LoopKind.VECTORIZED))
        return stmts

    def pv_tile(self, i0: Expr, mr: int, k0: Expr, nk: int) -> list[Stmt]:
        """O[i0:i0+mr, :] += P[i0:i0+mr, :nk] · v[k0:k0+nk, :], in chunks of PV_VECTORS."""
        low, s, z = self.low, self.low.shape, self.low.sizes
        v_buf, v_row = low.v_source()
        work, w = low.work, self.w
        stmts: list[Stmt] = []
        vectors = z.dv_pad // w
        for c0 in range(0, vectors, PV_VECTORS):
            nc = min(PV_VECTORS, vectors - c0)
            acc = Local(low.fresh("oacc"), LType(low.dtype, w), mr * nc)

            def o_index(r: int, c: int, c0: int = c0) -> Expr:
                return self.o_off + (i0 + r) * z.dv_pad + (c0 + c) * w

            j = low.fresh("j")
            jv = var(j)
            body: list[Stmt] = []
            vvecs = []
            for c in range(nc):
                stmt, ref = low.let("vv", v_buf.load((self.bh * s.sk + k0 + jv) * v_row
                                                     + (c0 + c) * w, w))
                body.append(stmt)
                vvecs.append(ref)
            for r in range(mr):
                stmt, p = low.let("pb", self.vec(work.load(self.s_off + (i0 + r) * z.block_k
                                                           + jv)))
                body.append(stmt)
                body.extend(acc.store(r * nc + c, fma(p, vvecs[c], acc.load(r * nc + c)))
                            for c in range(nc))
            stmts += [acc, *(acc.store(r * nc + c, work.load(o_index(r, c), w))
                             for r in range(mr) for c in range(nc)),
                      loop(j, 0, nk, body),
                      *(work.store(o_index(r, c), acc.load(r * nc + c))
                        for r in range(mr) for c in range(nc))]
        return stmts

