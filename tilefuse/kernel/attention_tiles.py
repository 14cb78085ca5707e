"""The code of one attention query block (:mod:`tilefuse.kernel.lower_attention`): register
tiles of ``MR`` query rows for both inner products, the online softmax on the score tile.

Per key block of ``BK`` keys (kt packed so that the block is one contiguous ``D × BK`` panel)::

    for each tile of MR rows:                        scores + softmax, in registers
        acc[r][c] = Σ_d q[r, d] · kt[block, d, c·W:+W]     MR × BK/W fma tile (the matmul's)
        s = acc + mask;  m' = max(m, max s);  a = exp(m - m')  (m' = -inf taken as 0)
        P[r] = exp(s - m');  l = l·a + Σ P[r];  alpha[r] = a;  m = m'
    for each tile of MR rows, each chunk of Dv vectors:
        acc[r][c] = O[r, c] · alpha[r]                 the rescale, folded into the load
        acc[r][c] += Σ_j P[r, j] · v[block + j, c·W:+W]    MR × chunk fma tile
        O[r, c] = acc[r][c]

so the scores never leave the registers before their exp, the accumulator is read and written
once per key block, and both products are the matmul micro-kernel's step
(:func:`~tilefuse.kernel.lower_matmul.fma_tile_step`) over unit-stride panels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tilefuse.dtypes import DType
from tilefuse.kernel.access import c_strides, is_extent, unflatten
from tilefuse.kernel.lower_matmul import fma_tile_step
from tilefuse.loop.ir import (
    Expr,
    If,
    Local,
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
    reduce,
    select,
    unary,
    var,
)

#: the smallest exponent whose exp is a normal number (exp(-87) = 1.6e-38 > 2**-126)
EXP_FLOOR = {DType.f32: -87.0, DType.f64: -708.0}

if TYPE_CHECKING:
    from tilefuse.kernel.lower_attention import _Lowering

#: a register tile's code: (first row, rows, first key, keys) -> statements
Tile = Callable[[Expr, int, Expr, "int | Expr"], list[Stmt]]


class QueryBlock:
    """The code of one query block of ``rows`` rows (an int, or an Expr for the runtime tail
    block) of batch·head ``bh`` from query ``q0``, its scratch slice at ``base``."""

    def __init__(self, low: _Lowering, bh: Expr, q0: Expr, rows: int | Expr, base: Expr):
        self.low, self.bh, self.q0, self.rows, self.base = low, bh, q0, rows, base
        z = low.sizes
        self.w = z.lanes
        self.s_off = base
        self.o_off = base + z.block_q * z.block_k
        self.m_off = self.o_off + z.block_q * z.dv_pad
        self.l_off = self.m_off + z.block_q
        self.a_off = self.l_off + z.block_q
        self.mask_offset: Expr | None = None

    def vec(self, value: Expr) -> Expr:
        return broadcast(value, self.w)

    def rows_loop(self, body_of: Callable[[Expr], list[Stmt]]) -> Stmt:
        i = self.low.fresh("i")
        return loop(i, 0, self.rows, body_of(var(i)))

    def tag(self) -> str:
        """A fresh name stem for one register tile (its rows, accumulators, lets)."""
        tag = self.low.fresh("T")
        self.low.namer.taken |= {f"r{tag}", f"a{tag}", f"z{tag}", f"w{tag}"}
        return tag

    # ---- setup and finish ---------------------------------------------------------------
    def mask_base(self) -> list[Stmt]:
        """``mbase``: the mask offset of this block's batch index (broadcast dims stride 0)."""
        low = self.low
        mask = low.shape.mask
        if low.padded_mask:  # the padded mask: rows of sk_pad
            mask = (1, 1) if mask is None else (*mask[:-1], low.sizes.sk_pad)
        if mask is None:
            return []
        strides = c_strides(mask)
        index = unflatten(self.bh, low.shape.batch)
        offset: Expr = const(0)
        for a, (size, stride) in enumerate(zip(mask[:-2], strides[:-2])):
            if size != 1:
                offset = offset + index[a] * stride
        stmt, self.mask_offset = low.let("mbase", offset)
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
    def key_block(self, kb: Expr, nk: int, nk_pv: int | Expr) -> list[Stmt]:
        """Key block ``kb`` (``nk`` keys in its scores, ``nk_pv`` real ones for P·V): every
        row tile's scores and softmax, then every row tile's P·V."""
        k0 = kb * self.low.sizes.block_k
        return [*self.row_tiles(lambda i0, mr, _k0, _n: self.scores_tile(i0, mr, kb, k0, nk),
                                k0, nk),
                *self.row_tiles(self.pv_tile, k0, nk_pv)]

    def row_tiles(self, tile: Tile, k0: Expr, nk: int | Expr) -> list[Stmt]:
        """``tile`` over the block's rows: whole MR-row tiles, then the last ``rows % MR``
        rows by one static tile (one per possible remainder when the row count is a runtime
        extent)."""
        mr = self.low.sizes.rows
        full = self.rows // mr
        stmts: list[Stmt] = []
        it = self.low.fresh("it")
        if is_extent(self.rows):
            rest = self.rows - full * mr
            stmts.append(loop(it, 0, full, tile(var(it) * mr, mr, k0, nk)))
            stmts.extend(If(binary(XOp.EQ, rest, t), block(*tile(full * mr, t, k0, nk)))
                         for t in range(1, mr))
            return stmts
        if full:
            stmts.append(loop(it, 0, full, tile(var(it) * mr, mr, k0, nk)))
        if self.rows % mr:
            stmts.extend(tile(const(full * mr), self.rows % mr, k0, nk))
        return stmts

    def accumulators(self, tag: str, mr: int, count: int) -> list[Local]:
        return [Local(f"acc{tag}_{c}", LType(self.low.dtype, self.w), mr) for c in range(count)]

    def scores_tile(self, i0: Expr, mr: int, kb: Expr, k0: Expr, nk: int) -> list[Stmt]:
        """Scores of rows i0.. i0+mr against the ``nk`` keys of block ``kb`` (whole vectors:
        the padded keys are zeros in kt, -inf in the padded mask), then their softmax step."""
        low, s, z = self.low, self.low.shape, self.low.sizes
        nv = -(-nk // self.w)
        tag = self.tag()
        accs = self.accumulators(tag, mr, nv)
        d = low.fresh("d")
        dv = var(d)
        panel = low.kt_panel(self.bh, kb)
        k_vectors = [low.kt_read.load(panel + dv * z.block_k + c * self.w, self.w)
                     for c in range(nv)]
        q_row = (self.bh * s.sq + self.q0 + i0) * s.d + dv
        step = fma_tile_step(tag, mr, accs, k_vectors,
                             lambda r: low.inputs["q"].load(q_row + r * s.d))
        zero = loop(f"z{tag}", 0, mr, [acc.store(var(f"z{tag}"), low.f(0.0, self.w))
                                       for acc in accs], kind=LoopKind.UNROLLED)
        w = var(f"w{tag}")
        softmax = loop(f"w{tag}", 0, mr, self.softmax_row(i0 + w, k0, [a.load(w) for a in accs]),
                       kind=LoopKind.UNROLLED)
        return [*accs, zero, loop(d, 0, s.d, step), softmax]

    def mask_at(self, row: Expr, key: Expr) -> Expr | None:
        """The mask at (row, key .. key+W-1) of this block's batch index, or None."""
        low, s, w = self.low, self.low.shape, self.w
        mask = s.mask
        if low.padded_mask:  # the padded mask (-inf beyond Sk), whole vectors
            mq = 1 if mask is None else mask[-2]
            index = self.mask_offset if self.mask_offset is not None else const(0)
            if is_extent(mq) or mq != 1:
                index = index + row * low.sizes.sk_pad
            return low.mpad_read.load(index + key, w)
        if mask is None or self.mask_offset is None:
            return None
        mq, mk = mask[-2:]
        index = self.mask_offset
        if mq != 1:
            index = index + row * mk
        if mk == 1:
            return self.vec(low.inputs["mask"].load(index))
        return low.inputs["mask"].load(index + key, w)

    def softmax_row(self, i: Expr, k0: Expr, accs: list[Expr]) -> list[Stmt]:
        """Row i of a score tile (its vectors ``accs``): add the mask, fold the block into the
        running max and sum, store the probabilities relative to the new max and the row's
        rescale factor ``alpha``."""
        low, z, w = self.low, self.low.sizes, self.w
        work = low.work
        stmts: list[Stmt] = []
        scores: list[Expr] = []
        for c, acc in enumerate(accs):
            mask = self.mask_at(self.q0 + i, k0 + c * w)
            stmt, ref = low.let("s", acc if mask is None else acc + mask)
            stmts.append(stmt)
            scores.append(ref)
        wide = scores[0]
        for ref in scores[1:]:   # lane-wise max first: one horizontal reduction per row
            wide = select(binary(XOp.GT, wide, ref), wide, ref)
        let_old, m_old = low.let("m", work.load(self.m_off + i))
        let_new, m_new = low.let("mn", maximum(m_old, reduce(XOp.REDUCE_MAX, wide)))
        let_use, m_use = low.let("mu", select(binary(XOp.EQ, m_new, low.f(float("-inf"))),
                                              low.f(0.0), m_new))
        let_alpha, alpha = low.let("alpha", self.exp_flushed(m_old - m_use))
        stmts += [let_old, let_new, let_use, let_alpha]
        start = self.s_off + i * z.block_k
        total: Expr | None = None
        for c, ref in enumerate(scores):
            stmt, p = low.let("p", self.exp_flushed(ref - self.vec(m_use)))
            stmts += [stmt, work.store(start + c * w, p)]
            total = p if total is None else total + p
        assert total is not None
        stmts += [work.store(self.m_off + i, m_new),
                  work.store(self.a_off + i, alpha),
                  work.store(self.l_off + i, fma(work.load(self.l_off + i), alpha,
                                                 reduce(XOp.REDUCE_ADD, total)))]
        return stmts

    def exp_flushed(self, x: Expr) -> Expr:
        """``exp(x)``, 0 where it would be subnormal (x below EXP_FLOOR, -inf included): the
        exponential of a masked score is computed on the floor, never on -inf, so no multiply
        underflows (an underflowing multiply takes a microcode assist on Intel cores; one per
        masked vector made the softmax take twice as long as both products, measured). The
        flushed values are below 1.7e-38 against a row sum of at least 1. NaN stays NaN."""
        floor = self.low.f(EXP_FLOOR[self.low.dtype], x.lanes)
        below = binary(XOp.LT, x, floor)   # false for NaN
        return select(below, self.low.f(0.0, x.lanes), unary(XOp.EXP, select(below, floor, x)))

    def pv_tile(self, i0: Expr, mr: int, k0: Expr, nk: int | Expr) -> list[Stmt]:
        """O[i0:i0+mr, :] = O · alpha + P[i0:i0+mr, :nk] · v[k0:k0+nk, :], in chunks of the
        schedule's P·V vectors."""
        low, s, z = self.low, self.low.shape, self.low.sizes
        v_buf, v_row = low.v_source()
        work, w = low.work, self.w
        stmts: list[Stmt] = []
        vectors = z.dv_pad // w
        for c0 in range(0, vectors, z.pv_vectors):
            nc = min(z.pv_vectors, vectors - c0)
            tag = self.tag()
            accs = self.accumulators(tag, mr, nc)
            y, x = var(f"z{tag}"), var(f"w{tag}")

            def o_index(r: Expr, c: int, c0: int = c0) -> Expr:
                return self.o_off + (i0 + r) * z.dv_pad + (c0 + c) * w

            alpha = self.vec(work.load(self.a_off + i0 + y))
            init = loop(f"z{tag}", 0, mr, [acc.store(y, work.load(o_index(y, c), w) * alpha)
                                           for c, acc in enumerate(accs)],
                        kind=LoopKind.UNROLLED)
            j = low.fresh("j")
            jv = var(j)
            v_vectors = [v_buf.load((self.bh * s.sk + k0 + jv) * v_row + (c0 + c) * w, w)
                         for c in range(nc)]
            p_row = self.s_off + i0 * z.block_k + jv
            step = fma_tile_step(tag, mr, accs, v_vectors,
                                 lambda r, p_row=p_row: work.load(p_row + r * z.block_k))
            store = loop(f"w{tag}", 0, mr, [work.store(o_index(x, c), acc.load(x))
                                            for c, acc in enumerate(accs)],
                         kind=LoopKind.UNROLLED)
            stmts += [*accs, init, loop(j, 0, nk, step), store]
        return stmts
