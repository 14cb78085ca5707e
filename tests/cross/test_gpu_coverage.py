"""Each kernel kind the cuda target lowers, built without a GPU and checked on the host against
the reference interpreter (:func:`tilefuse.runtime.gpu_simulate.simulate`), with zero host steps:
contraction prologues (transpose, cast, scale, broadcast of either operand, batched, views read in
place), gathers (take with negative indices, take_along_axis), movement chains, reductions over
non-trailing axes and pooling windows, argmax/argmin (NaN first), convolution as implicit GEMM.
PTX of each is assembled by ptxas where it is installed."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.loop.printer import format_function
from tilefuse.runtime.gpu import GemmStep, GpuKernel, HostGroup
from tilefuse.runtime.gpu_cross import assemble, cross_compile
from tilefuse.runtime.gpu_simulate import simulate
from tilefuse.testing import assert_close, random_array

F32, F16, BF16, I64 = DType.f32, DType.f16, DType.bf16, DType.i64


def _const(b: GraphBuilder, array: np.ndarray):
    from tilefuse.graph.ir import Literal

    return b.add1("constant", [], {"value": Literal(array)})


def prologue_transpose_b(dtype: DType = F32) -> Graph:
    """q @ k^T * scale, batched, odd sizes (attention scores)."""
    b = GraphBuilder("scores")
    q = b.input(((2, 3, 5, 16), dtype), "q")
    k = b.input(((2, 3, 7, 16), dtype), "k")
    kt = b.add1("transpose", [k], {"perm": [0, 1, 3, 2]})
    s = b.add1("matmul", [b.add1("mul", [q, _const(b, np.array(0.25, dtype.np))]), kt])
    return b.build([s])


def prologue_cast_a() -> Graph:
    """cast(x f16 -> f32) @ w, then a bias: a cast prologue and an epilogue."""
    b = GraphBuilder("cast_a")
    x = b.input(((9, 16), F16), "x")
    w = b.input(((16, 11), F32), "w")
    y = b.add1("matmul", [b.add1("cast", [x], {"dtype": F32}), w])
    return b.build([b.add1("add", [y, _const(b, np.arange(11, dtype=np.float32))])])


def prologue_broadcast_b() -> Graph:
    """A [K, N] weight broadcast over the batch, reshaped views of A read in place."""
    b = GraphBuilder("bcast_b")
    x = b.input(((4, 6, 8), F32), "x")
    w = b.input(((8, 5), F32), "w")
    wb = b.add1("broadcast_to", [w], {"shape": (4, 8, 5)})
    a = b.add1("reshape", [b.add1("reshape", [x], {"shape": (24, 8)})], {"shape": (4, 6, 8)})
    return b.build([b.add1("matmul", [a, wb])])


def take_negative() -> Graph:
    b = GraphBuilder("take")
    table = b.input(((10, 6), F32), "table")
    idx = b.input(((3, 4), I64), "idx")
    return b.build([b.add1("mul", [b.add1("take", [table, idx], {"axis": 0}),
                                   _const(b, np.array(2.0, np.float32))])])


def take_along() -> Graph:
    b = GraphBuilder("take_along")
    x = b.input(((4, 7), F32), "x")
    idx = b.input(((4, 3), I64), "idx")
    return b.build([b.add1("take_along_axis", [x, idx], {"axis": 1})])


def movement_chain() -> Graph:
    b = GraphBuilder("chain")
    x = b.input(((2, 6, 4), F32), "x")
    y = b.add1("transpose", [b.add1("reshape", [x], {"shape": (2, 3, 2, 4)})],
               {"perm": [0, 2, 1, 3]})
    return b.build([b.add1("transpose", [b.add1("reshape", [y], {"shape": (4, 12)})],
                           {"perm": [1, 0]})])


def split_concat() -> Graph:
    """GPT-2's fused QKV split, then a concat along another axis (flat kernels, every thread
    busy)."""
    b = GraphBuilder("split_concat")
    x = b.input(((3, 5, 12), F32), "x")
    q, k, v = b.add("split", [x], {"axis": -1, "sizes": [4, 4, 4]})
    y = b.add1("concat", [b.add1("mul", [q, k]), v, q], {"axis": 1})
    return b.build([y, b.add1("reshape", [v], {"shape": (15, 4)})])


def reductions(dtype: DType = F32) -> Graph:
    b = GraphBuilder("reductions")
    x = b.input(((5, 7, 3), dtype), "x")
    return b.build([b.add1("sum", [x], {"axes": [0], "keepdims": False}),
                    b.add1("max", [x], {"axes": [0, 2], "keepdims": True}),
                    b.add1("mean", [b.add1("exp", [x])], {"axes": [1], "keepdims": False}),
                    b.add1("argmax", [x], {"axis": 1, "keepdims": False}),
                    b.add1("argmin", [x], {"axis": 0, "keepdims": True})])


def conv_pool(dtype: DType = F32) -> Graph:
    """conv2d (im2col + GEMM, in its own dtype on the GPU: half precision on tensor cores) then a
    3x3 stride-2 max pool, NCHW."""
    b = GraphBuilder("conv_pool")
    x = b.input(((2, 3, 9, 9), dtype), "x")
    w = _const(b, random_array(np.random.default_rng(1), (4, 3, 3, 3), dtype))
    conv = b.add1("conv2d", [x, w], {"stride": [1, 1], "padding": [1, 1, 1, 1]})
    y = b.add1("relu", [conv])
    return b.build([b.add1("max_pool2d", [y], {"kernel": [3, 3], "stride": [2, 2],
                                                "padding": [1, 1, 1, 1]})])


def vector_products(dtype: DType = F32) -> Graph:
    """matmuls with a 1-D operand (vector @ matrix, batched matrix @ vector, a dot): 2-D
    products between reshapes on the GPU, not host steps."""
    b = GraphBuilder("vector_products")
    v = b.input(((7,), dtype), "v")
    m = b.input(((7, 5), dtype), "m")
    t = b.input(((3, 4, 7), dtype), "t")
    return b.build([b.add1("matmul", [v, m]), b.add1("matmul", [t, v]),
                    b.add1("matmul", [v, v])])


def odd_pads(dtype: DType = F16) -> Graph:
    """Reflect and edge pads whose copies start at odd offsets (the movement lowering once
    stored host-width vectors there: misaligned on the GPU)."""
    b = GraphBuilder("odd_pads")
    x = b.input(((3, 21), dtype), "x")
    reflect = b.add1("pad", [x], {"mode": "reflect", "pads": (0, 0, 3, 2), "value": 0.0})
    edge = b.add1("pad", [x], {"mode": "edge", "pads": (1, 2, 1, 0), "value": 0.0})
    return b.build([reflect, edge])


def im2col_f16() -> Graph:
    """A 1x1 conv, then a 3x3 padded conv of its NHWC activations (16 channels, f16): the
    second's im2col prologue copies 16-byte channel runs (lane-aligned: the simulator checks)."""
    b = GraphBuilder("im2col_f16")
    rng = np.random.default_rng(2)
    x = b.input(((2, 16, 5, 6), F16), "x")
    w1 = _const(b, random_array(rng, (16, 16, 1, 1), F16))
    w3 = _const(b, random_array(rng, (8, 16, 3, 3), F16))
    y = b.add1("relu", [b.add1("conv2d", [x, w1], {"stride": [1, 1], "padding": [0, 0, 0, 0]})])
    conv = b.add1("conv2d", [y, w3], {"stride": [1, 1], "padding": [1, 1, 1, 1]})
    return b.build([b.add1("relu", [conv])])


def head_split(dtype: DType = F16) -> Graph:
    """[B, S, H·D] -> [B, H, S, D] (reshape, transpose keeping the last axis): a movement
    kernel of 16-byte runs along D."""
    b = GraphBuilder("head_split")
    x = b.input(((2, 5, 4 * 16), dtype), "x")
    heads = b.add1("reshape", [x], {"shape": (2, 5, 4, 16)})
    return b.build([b.add1("transpose", [heads], {"perm": (0, 2, 1, 3)})])


def scans(dtype: DType = F32) -> Graph:
    """cumsum along the last and a middle axis, cumprod along the first (a thread per line on
    the GPU, running value in the working type)."""
    b = GraphBuilder("scans")
    x = b.input(((3, 5, 7), dtype), "x")
    small = b.add1("mul", [x, _const(b, np.array(0.5, dtype.np))])
    return b.build([b.add1("cumsum", [x], {"axis": -1}), b.add1("cumsum", [x], {"axis": 1}),
                    b.add1("cumprod", [small], {"axis": 0})])


def int_scans() -> Graph:
    """cumsum of an i64 mask (position ids: ``cumsum(mask) - 1``) and of a bool."""
    b = GraphBuilder("int_scans")
    m = b.input(((2, 9), I64), "m")
    pos = b.add1("sub", [b.add1("cumsum", [m], {"axis": 1}), _const(b, np.array(1, np.int64))])
    flags = b.add1("gt", [m, _const(b, np.array(0, np.int64))])
    return b.build([pos, b.add1("cumsum", [flags], {"axis": 0})])


def topk(largest: bool, dtype: DType = F32) -> Graph:
    b = GraphBuilder("topk")
    x = b.input(((3, 9, 4), dtype), "x")
    values, indices = b.add("topk", [x], {"k": 4, "axis": 1, "largest": largest})
    return b.build([b.add1("add", [values, _const(b, np.array(1, dtype.np))]), indices])


GRAPHS = {
    "prologue_transpose_b": prologue_transpose_b,
    "prologue_transpose_b_bf16": lambda: prologue_transpose_b(BF16),
    "prologue_cast_a": prologue_cast_a,
    "prologue_broadcast_b": prologue_broadcast_b,
    "take_negative": take_negative,
    "take_along": take_along,
    "movement_chain": movement_chain,
    "split_concat": split_concat,
    "reductions": reductions,
    "reductions_f16": lambda: reductions(F16),
    "conv_pool": conv_pool,
    "conv_pool_f16": lambda: conv_pool(F16),
    "vector_products": vector_products,
    "vector_products_bf16": lambda: vector_products(BF16),
    "odd_pads": odd_pads,
    "im2col_f16": im2col_f16,
    "head_split": head_split,
    "head_split_f32": lambda: head_split(F32),
    "scans": scans,
    "scans_bf16": lambda: scans(BF16),
    "int_scans": int_scans,
    "topk_largest": lambda: topk(True),
    "topk_smallest_bf16": lambda: topk(False, BF16),
}


def _inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = []
    for v in graph.inputs:
        if v.dtype is I64:
            # in range, negatives included (they wrap)
            size = 10 if graph.name == "take" else 7
            arrays.append(rng.integers(-size, size, tuple(v.shape)).astype(np.int64))
        else:
            arrays.append(random_array(rng, tuple(v.shape), v.dtype))
    return arrays


@pytest.mark.parametrize("name", GRAPHS)
def test_kind_runs_on_the_device_and_matches_the_reference(name: str) -> None:
    graph = GRAPHS[name]()
    built = cross_compile(graph)
    assert not built.host_steps, [s.reason for s in built.host_steps]
    for seed in (0, 1):
        arrays = _inputs(graph, seed)
        want = interpret(graph, *arrays)
        for got, w in zip(simulate(built.program, arrays), want, strict=True):
            assert_close(np.asarray(got), np.asarray(w), reduction=True, msg=name)


def test_argmax_keeps_the_first_nan_and_the_first_maximum() -> None:
    graph = reductions()
    built = cross_compile(graph)
    x = np.zeros((5, 7, 3), np.float32)
    x[:, 2, :] = 1.0
    x[:, 5, :] = 1.0       # a tie: the first index wins
    x[3, 4, 1] = np.nan    # a NaN: its index wins
    got = simulate(built.program, [x])
    want = interpret(graph, x)
    np.testing.assert_array_equal(got[3], want[3])
    assert got[3][3, 1] == 4 and got[3][0, 0] == 2


def test_topk_orders_ties_by_index_and_nan_first() -> None:
    graph = topk(True)
    built = cross_compile(graph)
    x = np.zeros((3, 9, 4), np.float32)
    x[0, 3, 0] = np.nan
    x[1, 5, 1] = 2.0
    got, want = simulate(built.program, [x]), interpret(graph, x)
    np.testing.assert_array_equal(got[1], want[1])
    assert got[1][0, 0, 0] == 3 and list(got[1][2, :, 2]) == [0, 1, 2, 3]


def test_im2col_copies_channel_runs_as_vectors() -> None:
    steps = cross_compile(im2col_f16()).program.steps
    im2col = [s for s in steps if isinstance(s, GpuKernel) and "window_patches" in
              [n.op.name for n in s.group.nodes] and "transpose" not in
              [n.op.name for n in s.group.nodes]]
    assert len(im2col) == 1 and "load<8>" in format_function(im2col[0].fn)


def test_head_split_copies_runs_as_vectors() -> None:
    (step,) = [s for s in cross_compile(head_split()).program.steps if isinstance(s, GpuKernel)]
    assert "load<8>" in format_function(step.fn)


def test_movement_kernels_use_every_thread() -> None:
    steps = cross_compile(split_concat()).program.steps
    moves = [s for s in steps if isinstance(s, GpuKernel) and s.group.kind.value == "movement"]
    assert len(moves) >= 2   # the split and the concat
    for step in moves:
        assert step.grid == -(-max(math.prod(v.shape) for v in step.group.outputs) // 256)


def test_prologues_become_kernels_and_views_are_read_in_place(tmp_path) -> None:
    built = cross_compile(prologue_broadcast_b(), tmp_path)
    steps = built.program.steps
    gemm = next(s for s in steps if isinstance(s, GemmStep))
    assert gemm.a is built.program.graph.inputs[0]  # the reshapes of x: no copy
    assert any(isinstance(s, GpuKernel) and "prologue_b" in s.group.name for s in steps)
    scores = cross_compile(prologue_transpose_b()).program.steps
    assert [type(s).__name__ for s in scores] == ["GpuKernel", "GpuKernel", "GemmStep"]
    assert "0 on the host" in (tmp_path / "partition.txt").read_text()


def test_a_host_step_is_a_warning_and_listed(caplog) -> None:
    # scatters run on the device now (tests/cross/test_gpu_coverage_more.py); the CPU int8
    # path's product (what the CPU's quantize pass makes; the cuda target's quantize makes
    # matmul_wq instead) has no GPU lowering
    b = GraphBuilder("qmatmul")
    x = b.input(((4, 8), F32), "x")
    weights = [_const(b, np.ones((8, 5), np.int8)), _const(b, np.ones(5, np.float32)),
               _const(b, np.zeros(5, np.float32))]
    graph = b.build([b.add1("qmatmul_i8", [x, *weights], {"act": "none"})])
    with caplog.at_level("WARNING", logger="tilefuse.fallback"):
        built = cross_compile(graph)
    assert built.host_steps and isinstance(built.host_steps[0], HostGroup)
    assert any("runs on the host under the cuda target" in r.getMessage()
               and "qmatmul_i8" in r.getMessage() for r in caplog.records)
    assert "\nhost " in built.program.partition_text()
    assert "1 on the host" in built.program.partition_text()


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("name", GRAPHS)
def test_kind_ptx_assembles(name: str) -> None:
    for ptx in cross_compile(GRAPHS[name]()).ptx().values():
        assemble(ptx)


def masked_softmax(dtype: DType) -> Graph:
    """SDPA's decomposition: a softmax whose fully masked rows give 0 (a bool ``any`` per row,
    a warp max of u8)."""
    b = GraphBuilder("masked_softmax")
    x = b.input(((6, 64), dtype), "x")
    neg = _const(b, np.array(-np.inf, np.float32))
    xf = b.add1("cast", [x], {"dtype": F32})
    alive = b.add1("logical_not", [b.add1("eq", [xf, neg])])
    any_alive = b.add1("max", [b.add1("cast", [alive], {"dtype": DType.u8})],
                       {"axes": [-1], "keepdims": True})
    soft = b.add1("softmax", [xf], {"axis": -1})
    zero = _const(b, np.array(0.0, np.float32))
    keep = b.add1("cast", [any_alive], {"dtype": DType.bool})
    return b.build([b.add1("where", [keep, soft, zero])])


@pytest.mark.parametrize("dtype", [F32, F16])
def test_warp_reductions_of_narrow_types(dtype: DType) -> None:
    graph = masked_softmax(dtype)
    built = cross_compile(graph)
    assert not built.host_steps, [s.reason for s in built.host_steps]
    assert any(isinstance(s, GpuKernel) and s.simt_width == 32 for s in built.program.steps)
    x = random_array(np.random.default_rng(0), (6, 64), dtype)
    x[2] = -np.inf   # a fully masked row
    for got, want in zip(simulate(built.program, [x]), interpret(graph, x), strict=True):
        assert_close(np.asarray(got), np.asarray(want), reduction=True)
    if shutil.which("ptxas"):
        for ptx in built.ptx().values():
            assemble(ptx)


def odd_rows(dtype: DType, rows: int, n: int) -> Graph:
    """A decode step's scores softmax (scale, f32 softmax, cast back) and an RMS norm over rows
    whose length is not a multiple of 32."""
    b = GraphBuilder("odd_rows")
    x = b.input(((rows, n), dtype), "x")
    scaled = b.add1("mul", [x, _const(b, np.array(0.125, dtype.np))])
    soft = b.add1("softmax", [b.add1("cast", [scaled], {"dtype": F32})], {"axis": -1})
    xf = b.add1("cast", [x], {"dtype": F32})
    ms = b.add1("mean", [b.add1("mul", [xf, xf])], {"axes": [-1], "keepdims": True})
    eps = _const(b, np.array(1e-6, np.float32))
    norm = b.add1("mul", [xf, b.add1("rsqrt", [b.add1("add", [ms, eps])])])
    return b.build([b.add1("cast", [soft], {"dtype": dtype}),
                    b.add1("cast", [norm], {"dtype": dtype})])


@pytest.mark.parametrize(("dtype", "rows", "n"), [(BF16, 16, 2049), (F32, 5, 77), (F16, 3, 33)])
def test_rows_of_odd_length_take_a_warp_each(dtype: DType, rows: int, n: int) -> None:
    """Rows not a multiple of 32 long run a warp per row with a uniform scalar tail (a thread
    per row took 0.26 ms for the decode step's 16 x 2049 softmax on an H200)."""
    graph = odd_rows(dtype, rows, n)
    built = cross_compile(graph)
    kernels = [s for s in built.program.steps if isinstance(s, GpuKernel)]
    assert kernels and all(s.simt_width == 32 for s in kernels)
    for seed in (0, 1):
        x = random_array(np.random.default_rng(seed), (rows, n), dtype)
        for got, want in zip(simulate(built.program, [x]), interpret(graph, x), strict=True):
            assert_close(np.asarray(got), np.asarray(want), reduction=True)
    if shutil.which("ptxas"):
        for ptx in built.ptx().values():
            assemble(ptx)
