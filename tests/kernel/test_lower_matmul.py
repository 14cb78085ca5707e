"""The matmul kernel: packing, the loop nest against NumPy (compiled) and the loop interpreter,
the generated code's shape (FMA on zmm), and lowering kernel groups with their epilogue."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
from contraction_runner import run_contraction

from tilefuse.codegen import compile_kernel, host_target
from tilefuse.codegen.jit import aligned_empty
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret as interpret_graph
from tilefuse.graph.ir import Graph
from tilefuse.kernel.fusion import KernelKind, form_kernels
from tilefuse.kernel.lower_matmul import (
    MatmulParams,
    MatmulShape,
    TileOutput,
    column_chunks,
    identity_value,
    lower_matmul,
    matmul_function,
)
from tilefuse.kernel.packing import pack_b, pack_b_kernel, packed_shape, unpack_b
from tilefuse.kernel.schedule import Schedule, default_schedule
from tilefuse.loop import BufferParam, interpret
from tilefuse.loop.printer import format_function
from tilefuse.testing import assert_close, random_array

F32, F64 = DType.f32, DType.f64
SHAPES = [(1, 1, 1), (7, 5, 3), (13, 17, 35), (64, 64, 64), (100, 257, 513), (512, 768, 33)]
SMALL = MatmulParams(mr=4, nr=8, lanes=4)  # tails everywhere on tiny shapes, for the interpreter


def plain_kernel(shape: MatmulShape, params: MatmulParams, dtype: DType = F32):
    out = TileOutput(BufferParam("C", dtype), identity_value)
    return matmul_function("mm", shape, dtype, params, [out])


def operands(rng: np.random.Generator, shape: MatmulShape, dtype: DType = F32):
    a_dims = shape.batch if shape.a_batched else ()
    b_dims = shape.batch if shape.b_batched else ()
    a = random_array(rng, (*a_dims, shape.m, shape.k), dtype)
    b = random_array(rng, (*b_dims, shape.k, shape.n), dtype)
    return a, b


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(a.dtype)


# ------------------------------------------------------------------------------------ packing


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (35, 17), (2, 64, 64), (3, 7, 33)])
@pytest.mark.parametrize("nr", [8, 32])
def test_pack_round_trip(shape, nr):
    rng = np.random.default_rng(1)
    b = random_array(rng, shape, F32)
    packed = pack_b(b, nr)
    assert packed.shape == packed_shape(shape, nr)
    assert packed.ctypes.data % 64 == 0
    np.testing.assert_array_equal(unpack_b(packed, shape[-1]), b)
    n = shape[-1]
    if n % nr:  # the partial last panel is zero-padded
        assert not packed[..., -1, :, n % nr:].any()


@pytest.mark.parametrize("batch,k,n", [(1, 1, 1), (1, 7, 5), (2, 13, 35), (1, 300, 257)])
def test_pack_kernel_matches_pack_b(batch, k, n):
    rng = np.random.default_rng(2)
    b = random_array(rng, (batch, k, n), F32)
    expected = pack_b(b, 32)
    fn = pack_b_kernel("pack", batch, k, n, 32, F32, 16)
    compiled = aligned_empty(expected.size, np.float32)
    compile_kernel(fn)(b, compiled)
    np.testing.assert_array_equal(compiled.reshape(expected.shape), expected)
    if k * n <= 500:
        interpreted = aligned_empty(expected.size, np.float32)
        interpret(fn, b, interpreted)
        np.testing.assert_array_equal(interpreted.reshape(expected.shape), expected)


def test_column_chunks_cover_the_width():
    assert column_chunks(32, 16) == [(0, 16), (16, 16)]
    assert column_chunks(31, 16) == [(0, 16), (16, 8), (24, 4), (28, 2), (30, 1)]
    assert column_chunks(1, 16) == [(0, 1)]


# ------------------------------------------------------------------------------------ kernel


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_compiled_matmul_matches_numpy(m, n, k):
    shape = MatmulShape((), m, n, k)
    params = MatmulParams()
    rng = np.random.default_rng(m * 7 + n)
    a, b = operands(rng, shape)
    c = np.full((m, n), np.nan, np.float32)
    compile_kernel(plain_kernel(shape, params))(a, pack_b(b, params.nr), c)
    assert_close(c, reference(a, b), reduction=True)


@pytest.mark.parametrize("params", [
    MatmulParams(kc=16, mc=24, nc=64, parallel="m"),
    MatmulParams(mr=5, nr=48, kc=100, nc=96, parallel="n"),
    MatmulParams(mr=3, nr=16, lanes=8, parallel=""),
])
def test_schedule_numbers_drive_the_nest(params):
    m, n, k = 100, 257, 513
    shape = MatmulShape((), m, n, k)
    rng = np.random.default_rng(3)
    a, b = operands(rng, shape)
    c = np.full((m, n), np.nan, np.float32)
    compile_kernel(plain_kernel(shape, params))(a, pack_b(b, params.nr), c)
    assert_close(c, reference(a, b), reduction=True)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (7, 5, 3), (13, 17, 35)])
@pytest.mark.parametrize("params", [SMALL, MatmulParams(mr=4, nr=8, lanes=4, kc=8, mc=8, nc=8)])
def test_interpreted_matmul_matches_numpy(m, n, k, params):
    shape = MatmulShape((), m, n, k)
    rng = np.random.default_rng(4)
    a, b = operands(rng, shape)
    c = np.full((m, n), np.nan, np.float32)
    interpret(plain_kernel(shape, params), a, pack_b(b, params.nr), c)
    assert_close(c, reference(a, b), reduction=True)


@pytest.mark.parametrize("a_batched,b_batched,parallel", [
    (True, True, "n"), (True, False, "b"), (False, True, "m")])
def test_batched_matmul(a_batched, b_batched, parallel):
    shape = MatmulShape((3, 2), 13, 35, 17, a_batched, b_batched)
    params = MatmulParams(parallel=parallel)
    rng = np.random.default_rng(5)
    a, b = operands(rng, shape)
    c = np.full((3, 2, 13, 35), np.nan, np.float32)
    compile_kernel(plain_kernel(shape, params))(a, pack_b(b, params.nr), c)
    assert_close(c, reference(a, b), reduction=True)


def test_f64_matmul():
    shape = MatmulShape((), 13, 17, 35)
    params = MatmulParams(nr=16, lanes=8)
    rng = np.random.default_rng(6)
    a, b = operands(rng, shape, F64)
    c = np.full((13, 17), np.nan)
    compile_kernel(plain_kernel(shape, params, F64))(a, pack_b(b, params.nr), c)
    assert_close(c, reference(a, b), reduction=True)


def test_other_dtypes_are_rejected():
    with pytest.raises(CompileError, match="f32 or f64"):
        plain_kernel(MatmulShape((), 4, 4, 4), MatmulParams(), DType.f16)


@pytest.mark.skipif(not host_target().has("avx512f"), reason="needs AVX-512")
def test_w1_kernel_is_fma_on_zmm():
    """gelu(x @ w + b) for 512x768 @ 768x3072 with the default schedule: 24 distinct zmm
    accumulators (a 6x64 tile) updated by vfmadd with A broadcast, no stack traffic in the fma
    loop."""
    graph = matmul_graph(512, 768, 3072, "bias_gelu")
    [group] = form_kernels(graph).groups
    schedule = default_schedule(group, host_target())
    assert schedule.micro_tile == (6, 64)
    main = lower_matmul(group, schedule).functions[-1]
    fma_loop = max(self_loops(compile_kernel(main).assembly()), key=lambda b: b.count("vfmadd"))
    accumulators = re.findall(r"vfmadd231ps\s+[^\n]*%zmm(\d+)\s*$", fma_loop, re.MULTILINE)
    assert len(set(accumulators)) >= 24
    assert re.search(r"vbroadcastss\s+[^\n]*%zmm", fma_loop)
    assert "rsp" not in fma_loop  # no spills in the fma loop


def self_loops(asm: str) -> list[str]:
    """The bodies of the basic blocks that jump back to their own label (innermost loops)."""
    parts = re.split(r"^(\.LBB\d+_\d+):", asm, flags=re.MULTILINE)
    loops = []
    for label, body in zip(parts[1::2], parts[2::2]):
        back = re.search(rf"^\s+j\w+\s+{re.escape(label)}\s*$", body, re.MULTILINE)
        if back:
            loops.append(body[:back.end()])
    return loops


# ------------------------------------------------------------------------------------ groups


def matmul_graph(m: int, k: int, n: int, epilogue: str = "", batch: tuple[int, ...] = (),
                 prologue: str = "") -> Graph:
    """x @ w, then ``epilogue`` ("bias", "bias_gelu"); ``prologue`` "a" (x*2 before the
    matmul), "b" (tanh of w) or "bt" (w given as [N, K] and transposed)."""
    builder = GraphBuilder("mm")
    x = builder.input(((*batch, m, k), F32), "x")
    w_shape = (n, k) if prologue == "bt" else (k, n)
    w = builder.input(((*batch, *w_shape), F32), "w")
    if prologue == "a":
        two = builder.add1("full", [], {"shape": (), "value": 2.0, "dtype": F32})
        x = builder.add1("mul", [x, two])
    if prologue == "b":
        w = builder.add1("tanh", [w])
    if prologue == "bt":
        perm = (*range(len(batch)), len(batch) + 1, len(batch))
        w = builder.add1("transpose", [w], {"perm": perm})
    y = builder.add1("matmul", [x, w])
    if epilogue:
        y = builder.add1("add", [y, builder.input(((n,), F32), "bias")])
    if epilogue == "bias_gelu":
        y = builder.add1("gelu", [y])
    return builder.build([y])


def check_group(graph: Graph, seed: int = 0, **kwargs: object) -> None:
    rng = np.random.default_rng(seed)
    arrays = [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]
    [expected] = interpret_graph(graph, *arrays)
    got, _ = run_contraction(graph, arrays, **kwargs)
    assert_close(got, expected, reduction=True)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("epilogue", ["", "bias", "bias_gelu"])
def test_group_matches_the_reference(m, n, k, epilogue):
    check_group(matmul_graph(m, k, n, epilogue), seed=m + n + k)


@pytest.mark.parametrize("epilogue", ["", "bias_gelu"])
def test_group_interpreted_on_a_tiny_shape(epilogue):
    check_group(matmul_graph(7, 5, 3, epilogue), interpreted=True)


@pytest.mark.parametrize("prologue", ["a", "b", "bt"])
def test_prologues_run_while_packing(prologue):
    check_group(matmul_graph(13, 35, 17, "bias", prologue=prologue))


def _heads_graph(transposed: bool) -> Graph:
    """[1, S, H·D] @ W from attention's [1, H, S, D] output: merged heads (a transpose and
    reshapes), or a reshape only (``transposed`` False: [1, S, H·D] viewed as [S, H·D])."""
    builder = GraphBuilder("heads")
    if transposed:
        x = builder.input(((1, 4, 7, 32), F32), "x")
        x = builder.add1("transpose", [x], {"perm": (0, 2, 1, 3)})
    else:
        x = builder.input(((1, 7, 128), F32), "x")
    x = builder.add1("reshape", [x], {"shape": (7, 128)})
    w = builder.input(((128, 96), F32), "w")
    return builder.build([builder.add1("matmul", [x, w])])


def test_a_reshaped_input_is_read_in_place_and_merged_heads_pack_in_vectors():
    """A reshape of an input moves nothing, so the matmul reads the input itself (no copy of
    A); merged attention heads are copied a vector at a time along each head's D (the
    transpose keeps only D contiguous, the reshape's exact [H, D] block is narrowed to it)."""
    lanes = host_target().vector_bits // 32
    for transposed in (False, True):
        graph = _heads_graph(transposed)
        [group] = form_kernels(graph).groups
        lowered = lower_matmul(group, default_schedule(group, host_target()))
        packs = [f for f in lowered.functions if "a_rows" in f.name]
        if transposed:
            [pack] = packs
            assert f"load<{lanes}>(x" in format_function(pack)
        else:
            assert packs == [] and lowered.functions[-1].buffer("x") is not None
        check_group(graph, seed=int(transposed))


def test_batched_group_with_epilogue():
    check_group(matmul_graph(13, 35, 17, "bias_gelu", batch=(3,)))


def test_k_blocks_keep_partial_sums_in_the_output():
    graph = matmul_graph(100, 513, 257, "bias_gelu")
    schedule = Schedule(KernelKind.CONTRACTION, tiles=(("m", 48), ("n", 64), ("k", 100)),
                        order=("n", "k", "m"), vector_axis="n", vector_width=16,
                        parallel_axes=("m",), unroll=(("k", 3),), pack=("B",),
                        micro_tile=(6, 32))
    check_group(graph, schedule=schedule)
    unpacked = Schedule(KernelKind.CONTRACTION, tiles=(("k", 64),), order=("k", "m", "n"),
                        vector_axis="n", vector_width=8, micro_tile=(4, 24))
    check_group(graph, schedule=unpacked)


def test_non_matmul_groups_are_refused():
    builder = GraphBuilder("ew")
    x = builder.input(((4, 4), F32), "x")
    graph = builder.build([builder.add1("exp", [x])])
    [group] = form_kernels(graph).groups
    with pytest.raises(CompileError, match="matmul"):
        lower_matmul(group, default_schedule(group))


@pytest.mark.parametrize("k, kc", [(513, 100), (40, 0)])
def test_prefetching_b_changes_no_value(k, kc):
    """B prefetched 8 and 16 k steps ahead (past its panel near the end of K, which a hint may
    do), K blocked and not, compiled and interpreted (where a prefetch does nothing)."""
    graph = matmul_graph(19, k, 150, "bias_gelu")
    for distance in (8, 16):
        schedule = Schedule(KernelKind.CONTRACTION,
                            tiles=(("m", 12), ("n", 64)) + ((("k", kc),) if kc else ()),
                            order=("n", "k", "m"), vector_axis="n", vector_width=16,
                            parallel_axes=("n",), unroll=(("k", 4),), pack=("B",),
                            micro_tile=(6, 64), prefetch=(("B", distance),))
        check_group(graph, seed=distance, schedule=schedule)
    check_group(matmul_graph(7, 40, 70), schedule=replace(schedule, tiles=(("m", 6),)),
                interpreted=True)


@pytest.mark.parametrize("k, kc", [(513, 100), (300, 0)])
def test_prefetching_the_next_panel_changes_no_value(k, kc):
    """B's next panel hinted into L2 (one and two panels on, past B's end for the last ones),
    K blocked and not, M blocks of several tiles and a partial last one, compiled and
    interpreted."""
    graph = matmul_graph(53, k, 150, "bias_gelu")
    for panels in (1, 2):
        schedule = Schedule(KernelKind.CONTRACTION,
                            tiles=(("m", 24), ("n", 64)) + ((("k", kc),) if kc else ()),
                            order=("n", "k", "m"), vector_axis="n", vector_width=16,
                            parallel_axes=("n",), unroll=(("k", 4),), pack=("B",),
                            micro_tile=(6, 32), prefetch=(("B", 8), ("B_next", panels)))
        check_group(graph, seed=panels, schedule=schedule)
    check_group(matmul_graph(13, 40, 70), schedule=replace(schedule, tiles=(("m", 12),)),
                interpreted=True)


def test_the_next_panel_hint_sweeps_that_panel_over_the_block_tiles():
    """Tile t of an M block of T tiles asks for elements t·KC·(NR/T) + k·(NR/T) of the next
    panel: over the block, every element of it once the shares are laid end to end."""
    [group] = form_kernels(matmul_graph(48, 256, 128)).groups
    schedule = Schedule(KernelKind.CONTRACTION, tiles=(("m", 48), ("n", 128)),
                        order=("n", "k", "m"), vector_axis="n", vector_width=16,
                        pack=("B",), micro_tile=(6, 32), prefetch=(("B_next", 1),))
    text = "\n".join(format_function(f) for f in lower_matmul(group, schedule).functions)
    hints = [line.strip() for line in text.splitlines() if "prefetch.l2" in line]
    # 8 tiles of 6 rows share the next 256x32 panel: 4 elements a k step, 1024 a tile
    assert hints == ["prefetch.l2 b_panels[jr*256 + (ir_f%48//6*256 + k0)*4 + 8192]"]


@pytest.mark.skipif(not host_target().has("avx512f"), reason="needs AVX-512")
def test_a_streamed_b_is_prefetched_in_the_fma_loop():
    """BERT's FFN (M = 128: two M blocks, B read about once) prefetches B's panel ahead, one
    prefetcht0 per 64-byte line of a k step, and its next panel into L2, one prefetcht1 a k
    step; W1 (M = 512: B reused from cache) prefetches only the next panel."""
    [group] = form_kernels(matmul_graph(128, 768, 3072, "bias_gelu")).groups
    schedule = default_schedule(group, host_target())
    assert schedule.prefetch == (("B", 16), ("B_next", 1))
    main = lower_matmul(group, schedule).functions[-1]
    fma_loop = max(self_loops(compile_kernel(main).assembly()), key=lambda b: b.count("vfmadd"))
    assert fma_loop.count("prefetcht0") == fma_loop.count("vfmadd231ps") // 6
    assert fma_loop.count("prefetcht1") == fma_loop.count("vfmadd231ps") // 24
    [w1] = form_kernels(matmul_graph(512, 768, 3072, "bias_gelu")).groups
    assert default_schedule(w1, host_target()).prefetch == (("B_next", 1),)


@pytest.mark.parametrize("m, k, n", [(1, 768, 3072), (7, 513, 129), (512, 64, 256),
                                     (3136, 147, 64)])
def test_the_next_panel_is_not_prefetched_where_it_does_not_pay(m, k, n):
    """A GEMV or a few rows (no tiles to spread the panel over), a short K (the hints would be
    many of the loads), a single panel."""
    [group] = form_kernels(matmul_graph(m, k, n)).groups
    assert "B_next" not in dict(default_schedule(group, host_target()).prefetch)
