"""The matmul loop nest: cache blocks, register tiles and the FMA micro-kernel, in loop IR.

``C[..., M, N] = epilogue(A[..., M, K] @ B[..., K, N])``. B is read packed (see
:mod:`tilefuse.kernel.packing`: panels of ``NR`` columns, each ``K x NR`` contiguous) unless the
schedule says not to pack it. :class:`MatmulParams` (filled from a schedule) drive the nest: the
cache-block loops over ``b`` (batch), ``n`` (NC columns), ``k`` (KC) and ``m`` (MC rows) in the
schedule's order, one of them parallel, then inside each block::

    for jr in jc..min(jc+NC, N_full) step NR:         full panels
      for ir in ic..min(ic+MC, M_full) step MR:       full register tiles
        micro-kernel MR x NR
      micro-kernel (M % MR) x NR                      (last MC block only)
    micro-kernels over the partial last panel         (last NC block only)

The micro-kernel keeps an ``MR x NR`` tile of C in registers (``MR * NR/V`` accumulators of V
lanes: 24 zmm for the default 6x64 f32 tile on AVX-512) and for each ``k`` loads ``NR/V``
vectors of B and broadcasts one element of A per row into an ``fma``. The partial last panel
uses narrower vectors (V, then halves down to scalars), so nothing is stored past column N.

The epilogue (bias, gelu, any elementwise chain after the matmul in the kernel group) is applied
to the accumulators right before the store. With K blocking the first blocks' partial sums are
kept in the output itself; that needs a single output of the accumulator's dtype, so other groups
run K in one block.

:mod:`tilefuse.kernel.lower_matmul` turns a kernel group into the operands, epilogue and
extra kernels this nest needs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.kernel.access import is_extent, unflatten
from tilefuse.kernel.conv_window import WindowA
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.schedule import MIN_ACCUMULATORS, SYMBOLIC_DIM_HINT, Schedule
from tilefuse.loop.ir import (
    BufferParam,
    Expr,
    If,
    Let,
    Local,
    LoopFunction,
    LoopKind,
    LType,
    Prefetch,
    Stmt,
    XOp,
    binary,
    block,
    broadcast,
    const,
    expr_children,
    fma,
    loop,
    maximum,
    minimum,
    var,
    walk_expr,
    walk_stmts,
)
from tilefuse.loop.simplify import fold_constants

#: the dtypes the matmul kernel computes in
MATMUL_DTYPES = frozenset({DType.f32, DType.f64})
BLOCK_AXES = ("b", "n", "k", "m")


@dataclass(frozen=True)
class MatmulParams:
    """The numbers that shape the loop nest. ``kc``/``mc``/``nc`` of 0 mean the whole axis
    (``nc`` 0: one panel); ``order`` is the block loops' order (outermost first); ``parallel``
    names the block axis split over threads ("n", "m", "b", or "" for none); ``unroll_k``
    unrolls the micro-kernel's k loop; ``pack_b`` reads B packed into panels (else in place);
    ``prefetch_b`` (k steps, 0: none) prefetches B's panel that far ahead in full tiles;
    ``prefetch_next`` (panels, 0: none) spreads L2 hints for the panel that far on over the
    full tiles of each M block."""

    mr: int = 12
    nr: int = 32
    lanes: int = 16
    kc: int = 0
    mc: int = 0
    nc: int = 0
    parallel: str = "n"
    order: tuple[str, ...] = ("b", "n", "k", "m")
    unroll_k: int = 1
    pack_b: bool = True
    prefetch_b: int = 0
    prefetch_next: int = 0

    def __post_init__(self) -> None:
        for name in ("mr", "nr", "lanes", "unroll_k"):
            if getattr(self, name) <= 0:
                raise CompileError(f"matmul {name} must be positive, got {getattr(self, name)}")
        for name in ("kc", "mc", "nc"):
            if getattr(self, name) < 0:
                raise CompileError(f"matmul {name} must be >= 0, got {getattr(self, name)}")
        if self.lanes & (self.lanes - 1):
            raise CompileError(f"vector width must be a power of two, got {self.lanes}")
        if self.parallel not in ("n", "m", "b", ""):
            raise CompileError(f"matmul parallel axis must be n, m, b or none, got "
                               f"{self.parallel!r}")
        if sorted(a for a in self.order if a != "b") != ["k", "m", "n"] or \
                not set(self.order) <= set(BLOCK_AXES) or len(set(self.order)) != len(self.order):
            raise CompileError(f"matmul block order must be a permutation of n, k, m (and b), "
                               f"got {list(self.order)}")


@dataclass(frozen=True)
class MatmulShape:
    """``[*batch, M, K] x [*batch, K, N]``; an operand that is not batched is shared by every
    matrix of the batch (NumPy broadcasting of a 2-D operand)."""

    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    a_batched: bool = True
    b_batched: bool = True

    @property
    def batch_size(self) -> int:
        if any(is_extent(d) for d in self.batch):
            return math.prod(self.batch)  # a runtime extent (an Expr)
        return int(np.prod(self.batch, dtype=np.int64))

    @property
    def symbolic(self) -> bool:
        """True when M or a batch dim is a runtime extent (N and K are always static)."""
        return is_extent(self.m) or any(is_extent(d) for d in self.batch)


#: an epilogue: (accumulator, output index (batch dims..., row, column), lanes) -> stored value
TileValue = Callable[[Expr, tuple[Expr, ...], int], Expr]


@dataclass(frozen=True)
class TileOutput:
    """One output of the kernel: its buffer (``[*batch, M, N]`` row-major) and the value stored
    there, computed from the accumulator."""

    buffer: BufferParam
    value: TileValue


def identity_value(acc: Expr, index: tuple[Expr, ...], lanes: int) -> Expr:
    """The plain matmul: store the accumulator."""
    return acc


def column_chunks(width: int, lanes: int) -> list[tuple[int, int]]:
    """``(offset, lanes)`` pieces covering ``width`` columns: full vectors of ``lanes``, then
    halves down to single elements (31 = 16 + 8 + 4 + 2 + 1)."""
    chunks: list[tuple[int, int]] = []
    offset, step = 0, lanes
    while offset < width:
        while step > width - offset:
            step //= 2
        chunks.append((offset, step))
        offset += step
    return chunks


def fma_tile_step(tag: str, rows: int, accs: Sequence[Local], b_values: Sequence[Expr],
                  a_value: Callable[[Expr], Expr]) -> list[Stmt]:
    """One k step of a ``rows x len(b_values)`` register tile: the B vectors ``b_values``
    loaded once, ``a_value(r)`` loaded and broadcast per row ``r`` (an unrolled loop), one fma
    per accumulator ``accs[c][r]``. Shared by the matmul and attention micro-kernels."""
    r = var(f"r{tag}")
    b_vecs = [Let(f"b{tag}_{c}", value) for c, value in enumerate(b_values)]
    a = Let(f"a{tag}", a_value(r))
    updates: list[Stmt] = [a]
    for acc, b_vec in zip(accs, b_vecs):
        lanes = b_vec.value.lanes
        a_vec = a.ref if lanes == 1 else broadcast(a.ref, lanes)
        updates.append(acc.store(r, fma(a_vec, b_vec.ref, acc.load(r))))
    return [*b_vecs, loop(f"r{tag}", 0, rows, updates, kind=LoopKind.UNROLLED)]


def matmul_function(name: str, shape: MatmulShape, dtype: DType, params: MatmulParams,
                    outputs: Sequence[TileOutput], extra_buffers: Sequence[BufferParam] = (),
                    *, a: BufferParam | None = None, b: BufferParam | None = None
                    ) -> LoopFunction:
    """The kernel ``name(a, b, *outputs, *extra_buffers)``: A row-major (buffer ``A`` unless
    given), B packed with panel width ``params.nr`` (``Bp``) or row-major when
    ``params.pack_b`` is off (``B``). ``extra_buffers``: what the outputs' values load."""
    a = a or BufferParam("A", dtype, readonly=True)
    b = b or BufferParam("Bp" if params.pack_b else "B", dtype, readonly=True,
                         align=64 if params.pack_b else 0)
    body = matmul_body(shape, dtype, params, outputs, a, b)
    return assemble(name, body, a, b, outputs, extra_buffers)


def matmul_body(shape: MatmulShape, dtype: DType, params: MatmulParams,
                outputs: Sequence[TileOutput], a: BufferParam, b: BufferParam,
                small_panel: int | None = None, window: WindowA | None = None) -> Stmt:
    """The loop nest of :func:`matmul_function` (building it calls the outputs' values);
    ``small_panel``: the width of B's panels when a runtime M has a nest of its own (B then
    packed so at run time, :func:`b_panel_width`), else B's panels are ``params.nr`` wide.
    ``window``: A is read in place from a convolution's source (``a`` holds it), not row-major."""
    if dtype not in MATMUL_DTYPES:
        raise CompileError(f"the matmul kernel computes in f32 or f64, not {dtype}")
    if not outputs:
        raise CompileError("a matmul kernel needs at least one output")
    if is_extent(shape.n) or is_extent(shape.k):
        raise CompileError("a matmul takes runtime extents only in M and the batch dims, "
                           f"got N={shape.n}, K={shape.k}")
    static = [d for d in (shape.m, shape.n, shape.k, *shape.batch) if not is_extent(d)]
    if min(static) <= 0:
        raise CompileError(f"empty matmul {shape}: nothing to lower")
    if window is not None and (shape.symbolic or shape.batch or window.k != shape.k):
        raise CompileError(f"a windowed A operand needs a static 2-D matmul of K={window.k}, "
                           f"got {shape}")
    general = _NestBuilder(shape, dtype, params, tuple(outputs), a, b, window=window)
    if not is_extent(shape.m) or general.mr < 2:
        return general.build()
    return small_m_buckets(general, small_panel or params.nr)


def small_m_buckets(general: _NestBuilder, panel: int) -> Stmt:
    """A runtime M below the register tile's MR whose static tile is wider than NR
    (:func:`small_m_rows`) runs the nest a static compile of that exact M emits (``M x NR'``
    tiles, NR' widened as the default rule widens it, so an M = 1 GEMV keeps 8 FMA chains, not
    2), chosen at run time; any other M runs the general nest (its remainder kernels are the
    static tiles of 4..MR-1 rows). These nests read B from panels ``panel`` wide (a B packed
    per call is packed so for those M, :func:`b_panel_width`: what a static M = 1 packs; a
    constant B keeps NR-wide panels); every tile width divides it or is a multiple of it."""
    s, p, tags = general.s, general.p, general.tags
    sizes = small_m_rows(replace(p, mr=general.mr), s.n)
    if not sizes:
        return general.build()
    buckets: list[Stmt] = []
    for rows in sizes:
        nr = small_m_tile(rows, p, s.n)
        params = replace(p, mr=rows, nr=nr, nc=_block(p.nc or nr, s.n, nr),
                         parallel="n" if p.parallel == "m" else p.parallel)
        nest = _NestBuilder(replace(s, m=rows), general.dtype, params, general.outputs,
                            general.a, general.b, panel=panel, tags=tags,
                            suffix=f"_m{rows}")
        buckets.append(If(binary(XOp.EQ, s.m, rows), nest.build()))
        tags = nest.tags
    general.tags = tags
    return If(binary(XOp.LT, s.m, sizes[-1] + 1), block(*buckets), general.build())


def small_m_rows(params: MatmulParams, n: int) -> list[int]:
    """The runtime sizes of M that get a nest of their own: those below MR whose static tile
    is wider than NR (only 1 for W1's 6x64 tile, 1-3 for a 12x32 one; from there the hint
    tile's remainder kernel is what a static compile emits, and a nest for each would
    multiply the LLVM build time)."""
    return [rows for rows in range(1, params.mr) if small_m_tile(rows, params, n) > params.nr]


def small_m_tile(rows: int, params: MatmulParams, n: int) -> int:
    """NR for an M of ``rows`` below MR: wide enough for MIN_ACCUMULATORS FMA chains (the
    default schedule's rule), within the accumulators the MR x NR tile has, ``params.nr``
    times a power of two (so that each such width divides the widest) and at most N."""
    lanes, nr = params.lanes, params.nr
    budget = max(1, params.mr * (nr // lanes) // rows)   # accumulators per row
    vectors = min(-(-MIN_ACCUMULATORS // rows), max(1, n // lanes), budget)
    width = nr
    while width < vectors * lanes and width * 2 <= max(nr, n):
        width *= 2
    return width


def b_panel_width(shape: MatmulShape, params: MatmulParams) -> int:
    """The width of a runtime B's packed panels when a runtime M has a nest of its own (its
    tile wider than NR, :func:`small_m_buckets`): the widest of those tiles; else NR.
    Measured on W1 (B packed per call, 2 threads): M=1 1.19x -> 1.00x of static, where 128-
    wide panels for every M made M=512 1.16x (its 12x32 tiles reading a quarter panel)."""
    mr = min(params.mr, SYMBOLIC_DIM_HINT)
    if not is_extent(shape.m) or not params.pack_b or mr < 2 or is_extent(shape.n) or \
            not small_m_rows(replace(params, mr=mr), shape.n):
        return params.nr
    return small_m_tile(1, replace(params, mr=mr), shape.n)


class _NestBuilder:
    """Builds the loop nest of one matmul kernel (see the module docstring). ``panel``: the
    width of B's packed panels when it is not the tile's NR (a multiple of it); ``tags``:
    the first micro-kernel number and ``suffix`` of the loop variables (nests of one kernel
    name theirs apart); ``window``: A's rows are windows of a convolution's source."""

    def __init__(self, shape: MatmulShape, dtype: DType, params: MatmulParams,
                 outputs: tuple[TileOutput, ...], a: BufferParam, b: BufferParam, *,
                 panel: int | None = None, tags: int = 0, suffix: str = "",
                 window: WindowA | None = None):
        self.s, self.dtype, self.p, self.outputs = shape, dtype, params, outputs
        self.a, self.b, self.window = a, b, window
        self.nr = params.nr
        self.panel = panel or params.nr
        self.sfx = suffix   # appended to the loop variables' names (unique per kernel)
        # a runtime M: the register tile and M block are the schedule's (the block for the
        # hint size when it asks for all of M); tails cover every runtime remainder
        m = SYMBOLIC_DIM_HINT if is_extent(shape.m) else shape.m
        self.mr = min(params.mr, m)
        self.nc = _block(params.nc or params.nr, shape.n, self.nr)
        self.mc = _block(params.mc, m, self.mr)
        single = len(outputs) == 1 and outputs[0].buffer.dtype is dtype
        self.kc = params.kc if single and 0 < params.kc < shape.k else shape.k
        self.m_full = shape.m // self.mr * self.mr
        self.n_full = shape.n // self.nr * self.nr
        count = shape.batch_size
        batched = (is_extent(count) or count > 1) or params.parallel == "b"
        self.bt: Expr = var("bt" + self.sfx) if batched else const(0)
        self.kc_var: Expr = var("kc" + self.sfx) if self.kc < shape.k else const(0)
        self.tags = tags  # numbers the micro-kernels, so that their names are unique

    # ---------------------------------------------------------------- the nest
    def build(self) -> Stmt:
        s = self.s
        jc, ic = var("jc" + self.sfx), var("ic" + self.sfx)
        nest: list[Stmt] = self.panels(jc, ic)
        for axis in reversed(self.p.order):
            kind = LoopKind.PARALLEL if axis == self.p.parallel else LoopKind.SERIAL
            if axis == "n":
                nest = [loop("jc" + self.sfx, 0, s.n, nest, step=self.nc, kind=kind)]
            elif axis == "m":
                nest = [loop("ic" + self.sfx, 0, s.m, nest, step=self.mc, kind=kind)]
            elif axis == "k" and self.kc < s.k:
                nest = [loop("kc" + self.sfx, 0, s.k, nest, step=self.kc)]
            elif axis == "b" and self.bt.op is XOp.VAR:
                nest = [loop("bt" + self.sfx, 0, s.batch_size, nest, kind=kind)]
        if "b" not in self.p.order and self.bt.op is XOp.VAR:
            kind = LoopKind.PARALLEL if self.p.parallel == "b" else LoopKind.SERIAL
            nest = [loop("bt" + self.sfx, 0, s.batch_size, nest, kind=kind)]
        return block(*nest)

    def panels(self, jc: Expr, ic: Expr) -> list[Stmt]:
        """Full panels of this (jc, ic) block, then the partial last panel."""
        s = self.s
        stmts: list[Stmt] = []
        if self.n_full:
            jr = var("jr" + self.sfx)
            stmts.append(loop("jr" + self.sfx, jc, minimum(jc + self.nc, self.n_full),
                              self.rows(ic, jr, column_chunks(self.nr, self.p.lanes), "f"),
                              step=self.nr))
        if s.n > self.n_full:
            tail = self.rows(ic, const(self.n_full),
                             column_chunks(s.n - self.n_full, self.p.lanes), "t")
            stmts.append(If(_ge(jc + self.nc, s.n), block(*tail)))
        return stmts

    def rows(self, ic: Expr, j0: Expr, chunks: list[tuple[int, int]], tag: str) -> list[Stmt]:
        """The register tiles of one panel within this row block."""
        stmts: list[Stmt] = []
        if self.m_full:
            ir = var(f"ir_{tag}{self.sfx}")
            stmts.append(loop(f"ir_{tag}{self.sfx}", ic, minimum(ic + self.mc, self.m_full),
                              self.micro(self.mr, ir, j0, chunks), step=self.mr))
        if is_extent(self.s.m):
            stmts.extend(self.runtime_m_tail(ic, j0, chunks))
        elif self.s.m > self.m_full:
            tail = self.micro(self.s.m - self.m_full, const(self.m_full), j0, chunks)
            stmts.append(If(_ge(ic + self.mc, self.s.m), block(*tail)))
        return stmts

    def runtime_m_tail(self, ic: Expr, j0: Expr, chunks: list[tuple[int, int]]) -> list[Stmt]:
        """The last rows of a runtime M (``M % MR`` of them, in the last M block): one static
        micro-kernel per possible remainder, the one for this size chosen at run time (what a
        static compile of the size emits, so small M runs as fast)."""
        rem = self.s.m - self.m_full
        pieces = [If(binary(XOp.EQ, rem, rows), block(*self.micro(rows, self.m_full, j0, chunks)))
                  for rows in range(1, self.mr)]
        return [If(_ge(ic + self.mc, self.s.m), block(*pieces))] if pieces else []

    # ---------------------------------------------------------------- micro-kernel
    def micro(self, rows: int, i0: Expr, j0: Expr, chunks: list[tuple[int, int]]) -> list[Stmt]:
        """One ``rows x width`` tile at (i0, j0): init, the k loop of fmas, epilogue stores."""
        tag = self.tags
        self.tags += 1
        accs = [Local(f"acc{tag}_{c}", LType(self.dtype, lanes), rows)
                for c, (_, lanes) in enumerate(chunks)]
        return [*accs, self.init(tag, rows, i0, j0, chunks, accs),
                *self.k_loops(tag, rows, i0, j0, chunks, accs),
                self.finish(tag, rows, i0, j0, chunks, accs)]

    def init(self, tag: int, rows: int, i0: Expr, j0: Expr, chunks: list[tuple[int, int]],
             accs: list[Local]) -> Stmt:
        """Accumulators start at 0, or (later K blocks) at the partial sums kept in C."""
        r = var(f"z{tag}")
        zeros = [acc.store(r, const(0.0, self.dtype, lanes))
                 for acc, (_, lanes) in zip(accs, chunks)]
        zero_loop = loop(f"z{tag}", 0, rows, zeros, kind=LoopKind.UNROLLED)
        if self.kc >= self.s.k:
            return zero_loop
        y = var(f"y{tag}")
        out = self.outputs[0].buffer
        partial = [acc.store(y, out.load(self.c_index(i0 + y, j0 + off), lanes))
                   for acc, (off, lanes) in zip(accs, chunks)]
        reload = loop(f"y{tag}", 0, rows, partial, kind=LoopKind.UNROLLED)
        return If(binary(XOp.EQ, self.kc_var, 0), zero_loop, reload)

    def k_loops(self, tag: int, rows: int, i0: Expr, j0: Expr, chunks: list[tuple[int, int]],
                accs: list[Local]) -> list[Stmt]:
        """The k loop of this K block (unrolled by ``unroll_k``, with a remainder loop); for a
        windowed A, one such loop over each kernel row's run inside a loop over the rows."""
        s = self.s
        k0 = self.kc_var
        k1: Expr = minimum(k0 + self.kc, s.k) if self.kc < s.k else const(s.k)
        if self.window is None:
            a_base = self.bt * (s.m * s.k) if s.a_batched else const(0)
            return self.unrolled_k(str(tag), k0, k1, lambda t, k: self.fmas(
                t, rows, j0, k, chunks, accs, lambda r: a_base + (i0 + r) * s.k + k, i0))
        w = self.window
        kh = var(f"kh{tag}")
        first = Let(f"kf{tag}", kh * w.run)   # the k of the kernel row's first column
        step = Let(f"ka{tag}", kh * w.kernel_row_stride)
        # a full tile whose rows are adjacent pixels of one output row: one base and constant
        # offsets (a pointer per row otherwise, which LLVM spills for 12-row tiles)
        in_row = w.tiles_stay_in_row(self.mr) and rows == self.mr
        base = w.row_offset(i0) if in_row else const(0)

        def row_offset(r: Expr) -> Expr:
            return base + r * w.pixel_stride if in_row else w.row_offset(i0 + r)
        if self.kc >= s.k:      # one K block: every run whole
            lo, hi = const(0), const(w.run)
        else:
            lo, hi = maximum(k0 - first.ref, 0), minimum(k1 - first.ref, w.run)
        run = self.unrolled_k(f"{tag}w", lo, hi, lambda t, c: self.fmas(
            t, rows, j0, first.ref + c, chunks, accs,
            lambda r: row_offset(r) + step.ref + c, i0))
        kh0 = k0 // w.run if self.kc < s.k else const(0)
        kh1 = (k1 + (w.run - 1)) // w.run if self.kc < s.k else const(w.kernel_rows)
        return [loop(f"kh{tag}", kh0, kh1, [first, step, *run])]

    def unrolled_k(self, tag: str, k0: Expr, k1: Expr,
                   step: Callable[[str, Expr], list[Stmt]]) -> list[Stmt]:
        """``step(tag, k)`` for k in [k0, k1): unrolled ``unroll_k`` times, then a remainder."""
        u = self.p.unroll_k
        k = var(f"k{tag}")
        if u == 1:
            return [loop(f"k{tag}", k0, k1, step(tag, k))]
        ku, kk = var(f"ku{tag}"), var(f"kk{tag}")
        main_end = Let(f"kend{tag}", k0 + (k1 - k0) // u * u)
        unrolled = loop(f"kk{tag}", 0, u, step(f"{tag}u", ku + kk), kind=LoopKind.UNROLLED)
        return [main_end, loop(f"ku{tag}", k0, main_end.ref, [unrolled], step=u),
                loop(f"k{tag}", main_end.ref, k1, step(f"{tag}r", k))]

    def fmas(self, tag: str, rows: int, j0: Expr, k: Expr, chunks: list[tuple[int, int]],
             accs: list[Local], a_index: Callable[[Expr], Expr], i0: Expr) -> list[Stmt]:
        """One step of k of the tile at row ``i0``: B vectors loaded once, A (element
        ``a_index(row)``) broadcast per row, one fma per accumulator."""
        b_values = [self.b.load(self.b_index(j0, k, off), lanes) for off, lanes in chunks]
        step = fma_tile_step(tag, rows, accs, b_values, lambda r: self.a.load(a_index(r)))
        if self.p.prefetch_next and self.p.pack_b and self.panel == self.nr \
                and rows == self.mr:
            step = [self.next_panel_prefetch(i0, j0, k), *step]
        if self.p.prefetch_b and self.p.pack_b and rows == self.mr:
            line = max(1, 64 // self.dtype.itemsize)   # one hint per cache line of the row
            ahead = k + self.p.prefetch_b
            step = [*(Prefetch(self.b.name, self.b_index(j0, ahead, off))
                      for off in range(0, self.nr, line)), *step]
        return step

    def next_panel_prefetch(self, i0: Expr, j0: Expr, k: Expr) -> Prefetch:
        """A hint, into L2, for part of the rows of this K block in the panel ``prefetch_next``
        panels on (the one the tiles read after this one, when 1): tile t of the M block
        takes the t-th share of it, a few elements a k step, so the panel arrives over the
        block's tiles instead of stalling its first tile. Panels of one K block are
        contiguous (``panel == nr``), so the shares sweep it linearly."""
        s = self.s
        rows = min(self.mc, self.m_full) if isinstance(self.m_full, int) else self.mc
        tiles = max(1, rows // self.mr)
        kc = min(self.kc, s.k)
        stride = max(1, self.nr // tiles)
        tile = (i0 % self.mc) // self.mr   # i0 < M <= MC when one block holds all of M
        k0 = self.kc_var
        start = self.b_index(j0 + self.p.prefetch_next * self.nr, k0, 0)
        return Prefetch(self.b.name, start + (tile * kc + (k - k0)) * stride, locality=2)

    def finish(self, tag: int, rows: int, i0: Expr, j0: Expr, chunks: list[tuple[int, int]],
               accs: list[Local]) -> Stmt:
        """Epilogue stores after the last K block; raw partial sums after the others."""
        w = var(f"w{tag}")
        stores: list[Stmt] = []
        for acc, (off, lanes) in zip(accs, chunks):
            i, j = i0 + w, j0 + off
            index = (*self.batch_index(), i, j)
            for out in self.outputs:
                value = out.value(acc.load(w), index, lanes)
                stores.append(out.buffer.store(self.c_index(i, j), value))
        done = loop(f"w{tag}", 0, rows, stores, kind=LoopKind.UNROLLED)
        if self.kc >= self.s.k:
            return done
        v = var(f"v{tag}")
        out = self.outputs[0].buffer
        raw = [out.store(self.c_index(i0 + v, j0 + off), acc.load(v))
               for acc, (off, _) in zip(accs, chunks)]
        keep = loop(f"v{tag}", 0, rows, raw, kind=LoopKind.UNROLLED)
        return If(_ge(self.kc_var + self.kc, self.s.k), done, keep)

    # ---------------------------------------------------------------- indices
    def b_index(self, j0: Expr, k: Expr, off: int) -> Expr:
        """Element (k, j0 + off) of B: in its panel, or row-major. j0 is a multiple of the
        tile's NR; a panel wider than NR holds several tiles (NR divides it), a narrower one
        is part of a tile (off reaches into the next panels)."""
        s, panel = self.s, self.panel
        if not self.p.pack_b:
            base = self.bt * (s.k * s.n) if s.b_batched else const(0)
            return base + k * s.n + j0 + off
        panels = -(-s.n // panel)
        base = self.bt * (panels * s.k * panel) if s.b_batched else const(0)
        if panel == self.nr:
            return base + j0 * s.k + k * panel + off
        if panel < self.nr:
            return base + j0 * s.k + (off // panel * panel) * s.k + k * panel + off % panel
        return base + j0 // panel * (panel * s.k) + j0 % panel + off + k * panel

    def c_index(self, i: Expr, j: Expr) -> Expr:
        return (self.bt * self.s.m + i) * self.s.n + j

    def batch_index(self) -> tuple[Expr, ...]:
        """The batch dims of the output index, unflattened from ``bt``."""
        return unflatten(self.bt, self.s.batch) if self.s.batch else ()


def _block(requested: int, extent: int, unit: int) -> int:
    """A cache-block size: ``requested`` (0: the whole extent) rounded up to a multiple of
    ``unit``, and at most the extent rounded up to it."""
    whole = -(-extent // unit) * unit
    if requested <= 0:
        return whole
    return min(-(-requested // unit) * unit, whole)


def _ge(a: Expr, b: int) -> Expr:
    return binary(XOp.GE, a, b)


# ==================================================================== schedules


def params_from_schedule(schedule: Schedule) -> MatmulParams:
    """The nest a contraction schedule describes: ``micro_tile`` = (MR, NR), ``vector_width``,
    the cache blocks ``tiles`` m/n/k = MC/NC/KC and their ``order``, the first of
    ``parallel_axes`` (n, m or b), ``unroll`` of k, and whether ``pack`` holds "B" (A is
    always read in place)."""
    if schedule.kind is not KernelKind.CONTRACTION or schedule.micro_tile is None:
        raise CompileError(f"a matmul needs a contraction schedule, got {schedule}")
    mr, nr = schedule.micro_tile
    parallel = schedule.parallel_axes[0] if schedule.parallel_axes else ""
    if parallel not in ("n", "m", "b", ""):
        raise CompileError(f"a matmul cannot run axis {parallel!r} in parallel")
    unroll = dict(schedule.unroll).get("k", 1)
    return MatmulParams(mr=mr, nr=nr, lanes=schedule.vector_width,
                        kc=schedule.tile("k") or 0, mc=schedule.tile("m") or 0,
                        nc=schedule.tile("n") or 0, parallel=parallel,
                        order=tuple(a for a in schedule.order if a in BLOCK_AXES),
                        unroll_k=unroll, pack_b="B" in schedule.pack,
                        prefetch_b=dict(schedule.prefetch).get("B", 0),
                        prefetch_next=dict(schedule.prefetch).get("B_next", 0))


def assemble(name: str, body: Stmt, a: BufferParam, b: BufferParam,
             outputs: Sequence[TileOutput], extra: Sequence[BufferParam],
             scalars: tuple[str, ...] = ()) -> LoopFunction:
    """The kernel; ``scalars``: its runtime extents (``dim_<symbol>``), none when static."""
    buffers = tuple(dict.fromkeys((a, b, *(o.buffer for o in outputs), *extra)))
    return fold_constants(LoopFunction(name, buffers, scalars, body))[0]


def loaded_buffers(body: Stmt) -> set[str]:
    """The buffers ``body`` loads from."""
    return {e.arg for s in walk_stmts(body) for root in expr_children(s)  # type: ignore[misc]
            for e in walk_expr(root) if e.op is XOp.LOAD}
