"""Kinds the cuda target once ran on the host, now GPU kernels (built without a GPU, checked on
the host through the loop-IR simulator, :func:`tilefuse.runtime.gpu_simulate.simulate`, and
assembled by ptxas where installed): scatters (``scatter_elements`` and ``scatter_nd``, every
reduction, repeated and negative indices; bit-exact, since each output element is written by
one thread in update order), integer matmuls (no cuBLAS: a generated product), ``var``
reductions over non-trailing axes, and the fuzzer's random graphs with zero host steps."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.runtime.gpu import GpuKernel
from tilefuse.runtime.gpu_cross import assemble, cross_compile
from tilefuse.runtime.gpu_simulate import simulate
from tilefuse.testing import assert_close, random_array

F32, F16, BF16, F64 = DType.f32, DType.f16, DType.bf16, DType.f64
I64, I32, I8, U8, BOOL = DType.i64, DType.i32, DType.i8, DType.u8, DType.bool
REDUCTIONS = ("none", "add", "mul", "max", "min")


def scatter_elements(dtype: DType, reduction: str, axis: int = 1,
                     idx_shape: tuple[int, ...] = (3, 5, 2)) -> Graph:
    """data [4, 7, 3], indices smaller than data off the axis (only their block is hit)."""
    b = GraphBuilder("scatter_elements")
    data = b.input(((4, 7, 3), dtype), "data")
    idx = b.input((idx_shape, I64), "idx")
    upd = b.input((idx_shape, dtype), "upd")
    return b.build([b.add1("scatter_elements", [data, idx, upd],
                           {"axis": axis, "reduction": reduction})])


def scatter_nd(dtype: DType, reduction: str, depth: int = 1, rows: int = 6) -> Graph:
    """data [5, 4, 3]: index rows of ``depth`` coordinates, update rows of the rest."""
    b = GraphBuilder("scatter_nd")
    data = b.input(((5, 4, 3), dtype), "data")
    idx = b.input(((2, rows // 2, depth), I64), "idx")
    upd = b.input(((2, rows // 2, *(5, 4, 3)[depth:]), dtype), "upd")
    return b.build([b.add1("scatter_nd", [data, idx, upd], {"reduction": reduction})])


def _inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    """Random data; indices in range with negatives and repeats (a small range)."""
    rng = np.random.default_rng(seed)
    node = graph.nodes[-1]
    index = node.inputs[1] if node.op.name.startswith("scatter") else None
    arrays = []
    for v in graph.inputs:
        shape = tuple(v.shape)
        if v is index and node.op.name == "scatter_elements":
            size = graph.inputs[0].shape[node.attrs["axis"]]
            arrays.append(rng.integers(-size, size, shape).astype(v.dtype.np))
        elif v is index:
            sizes = np.array(graph.inputs[0].shape[:shape[-1]])
            if graph.inputs[0].shape[0] > 1000:   # the big one: repeats among a few targets
                sizes = sizes // 8
            arrays.append((rng.integers(0, 1 << 20, shape) % (2 * sizes) - sizes)
                          .astype(v.dtype.np))
        elif v.dtype is BOOL:
            arrays.append(rng.random(shape) < 0.5)
        elif v.dtype.is_int:
            arrays.append(rng.integers(-9, 10, shape).astype(v.dtype.np))
        else:
            arrays.append(random_array(rng, shape, v.dtype))
    return arrays


def _check(graph: Graph, exact: bool, seeds: tuple[int, ...] = (0, 1, 2)) -> None:
    built = cross_compile(graph)
    assert not built.host_steps, [s.reason for s in built.host_steps]
    for seed in seeds:
        arrays = _inputs(graph, seed)
        want = interpret(graph, *arrays)
        for got, w in zip(simulate(built.program, arrays), want, strict=True):
            if exact:
                np.testing.assert_array_equal(np.asarray(got), np.asarray(w))
            else:
                assert_close(np.asarray(got), np.asarray(w), reduction=True)
    if shutil.which("ptxas"):
        for ptx in built.ptx().values():
            assemble(ptx)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [F32, F16, I32, BOOL])
def test_scatter_elements_runs_on_the_device_bit_exact(reduction: str, dtype: DType) -> None:
    _check(scatter_elements(dtype, reduction), exact=True)


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_scatter_elements_other_axes(axis: int) -> None:
    _check(scatter_elements(F32, "add", axis, (4, 6, 3)), exact=True)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [F32, BF16, I64, BOOL])
def test_scatter_nd_runs_on_the_device_bit_exact(reduction: str, dtype: DType) -> None:
    _check(scatter_nd(dtype, reduction), exact=True)


@pytest.mark.parametrize("depth", [2, 3])
def test_scatter_nd_deeper_indices(depth: int) -> None:
    _check(scatter_nd(F32, "add", depth, rows=10), exact=True)
    _check(scatter_nd(F32, "none", depth, rows=10), exact=True)


def test_scatter_nd_is_a_copy_then_the_rows() -> None:
    steps = cross_compile(scatter_nd(F32, "none")).program.steps
    assert [type(s).__name__ for s in steps] == ["GpuKernel", "GpuKernel"]
    copy, rows = steps
    assert copy.outputs and not rows.outputs   # one producer of the output for the plan
    assert rows.bindings[-1] is copy.outputs[0]


def test_scatter_drops_out_of_range_updates() -> None:
    """The reference raises; the device drops the update (nothing out of bounds)."""
    graph = scatter_nd(F32, "add")
    built = cross_compile(graph)
    data, idx, upd = _inputs(graph, 0)
    idx[0, 0, 0] = 5      # out of range
    idx[1, 0, 0] = -6     # out of range after wrapping
    got = simulate(built.program, [data, idx, upd])[0]
    keep = np.ones(idx.shape[:-1], bool)
    keep[0, 0] = keep[1, 0] = False
    want = data.copy()
    np.add.at(want, idx[keep][:, 0], upd[keep])
    np.testing.assert_array_equal(got, want)
    graph = scatter_elements(F32, "none")
    built = cross_compile(graph)
    data, idx, upd = _inputs(graph, 0)
    idx[...] = 7
    np.testing.assert_array_equal(simulate(built.program, [data, idx, upd])[0], data)


def products(dtype: DType) -> Graph:
    """Integer matmuls: 2-D with a prologue (min) and an epilogue, vector @ matrix, a batched
    one broadcasting A's batch, matrix @ vector."""
    b = GraphBuilder("int_products")
    x = b.input(((5, 17), dtype), "x")
    w = b.input(((17, 6), dtype), "w")
    v = b.input(((17,), dtype), "v")
    t = b.input(((3, 1, 4, 5), dtype), "t")
    u = b.input(((2, 5, 7), dtype), "u")
    clipped = b.add1("minimum", [x, b.add1("neg", [x])])      # a prologue: -|x|
    y = b.add1("abs", [b.add1("matmul", [clipped, w])])         # an epilogue
    return b.build([y, b.add1("matmul", [v, w]), b.add1("matmul", [t, u]),
                    b.add1("matmul", [x, v])])


@pytest.mark.parametrize("dtype", [I32, I64, I8, U8])
def test_integer_products_run_on_the_device_exactly(dtype: DType) -> None:
    _check(products(dtype), exact=True)


def test_integer_products_wrap_like_numpy() -> None:
    b = GraphBuilder("wrap")
    x = b.input(((3, 4), I32), "x")
    graph = b.build([b.add1("matmul", [x, b.add1("transpose", [x], {"perm": [1, 0]})])])
    built = cross_compile(graph)
    big = np.full((3, 4), 2**30 + 7, np.int32)
    np.testing.assert_array_equal(simulate(built.program, [big])[0], big @ big.T)


def variances(dtype: DType, ddof: int) -> Graph:
    b = GraphBuilder("variances")
    x = b.input(((5, 7, 3), dtype), "x")
    return b.build([b.add1("var", [x], {"axes": [0], "keepdims": False, "ddof": ddof}),
                    b.add1("var", [x], {"axes": [0, 2], "keepdims": True, "ddof": ddof})])


@pytest.mark.parametrize("dtype", [F32, F16, I32])
@pytest.mark.parametrize("ddof", [0, 1])
def test_var_reductions_run_on_the_device(dtype: DType, ddof: int) -> None:
    _check(variances(dtype, ddof), exact=False)


def test_fuzz_graphs_have_no_host_step_under_cuda() -> None:
    """The GPU fuzzer's graphs (seed 1: integer products and a var among them) cross-compile
    for cuda with zero host steps (100 graphs, ~20 s here; 900 graphs of seeds 0-2 checked
    by hand)."""
    from tilefuse.driver import optimize
    from tilefuse.fuzz.generator import GeneratorConfig, generate_graph
    from tilefuse.runtime.gpu import HostGroup, build_gpu_program

    hosted = []
    logging.getLogger("tilefuse.fallback").disabled = True
    try:
        for index in range(100):
            graph = generate_graph(np.random.default_rng([1, index]), GeneratorConfig(),
                                   name=f"fuzz{index}")
            program = build_gpu_program(optimize(graph)[0])
            hosted += [f"graph {index} {s.group.name}: {s.reason}" for s in program.steps
                       if isinstance(s, HostGroup)]
    finally:
        logging.getLogger("tilefuse.fallback").disabled = False
    assert not hosted, hosted


def pools(dtype: DType, ceil_mode: bool) -> Graph:
    """Pools of a graph input (no convolution's activation matrix: the ops themselves), with
    padding, stride, dilation and the ceil-mode overhang."""
    b = GraphBuilder("pools")
    x = b.input(((2, 3, 9, 8), dtype), "x")
    outs = [b.add1("max_pool2d", [x], {"kernel": [3, 2], "stride": [2, 2],
                                      "padding": [1, 0, 1, 1], "dilation": [1, 2],
                                      "ceil_mode": ceil_mode})]
    if dtype.is_float:
        for include in (False, True):
            outs.append(b.add1("avg_pool2d", [x], {"kernel": [3, 3], "stride": [2, 1],
                                                  "padding": [1, 1, 1, 1],
                                                  "count_include_pad": include,
                                                  "ceil_mode": ceil_mode}))
    return b.build(outs)


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("dtype", [F32, F16, I32])
def test_pools_of_inputs_run_on_the_device(dtype: DType, ceil_mode: bool) -> None:
    graph = pools(dtype, ceil_mode)
    assert [s for s in cross_compile(graph).program.steps if isinstance(s, GpuKernel)]
    _check(graph, exact=not dtype.is_float)


def grouped_conv(dtype: DType, groups: int) -> Graph:
    """A grouped (or depthwise) conv2d whose weight is an input: no GEMM lowering takes it
    whole; im2col and one batched product over the groups."""
    b = GraphBuilder("grouped_conv")
    x = b.input(((2, 6, 7, 7), dtype), "x")
    w = b.input(((6, 6 // groups, 3, 3), dtype), "w")
    return b.build([b.add1("conv2d", [x, w], {"stride": [2, 1], "padding": [1, 1, 0, 1],
                                              "groups": groups})])


@pytest.mark.parametrize("groups", [2, 6])
@pytest.mark.parametrize("dtype", [F32, F16])
def test_grouped_convs_with_a_runtime_weight_run_on_the_device(dtype: DType,
                                                                groups: int) -> None:
    _check(grouped_conv(dtype, groups), exact=False, seeds=(0,))


def big_scatter_nd() -> Graph:
    """index_put with accumulate at a realistic size: 700 rows of 96 into [2048, 96], repeated
    targets (the leaders' quadratic scan over 700 rows)."""
    b = GraphBuilder("scatter_nd")
    data = b.input(((2048, 96), F32), "data")
    idx = b.input(((700, 1), I64), "idx")
    upd = b.input(((700, 96), F32), "upd")
    return b.build([b.add1("scatter_nd", [data, idx, upd], {"reduction": "add"})])


def big_scatter_elements() -> Graph:
    """torch.scatter_add along the last axis: [32, 4000] updates into [32, 1000] bins."""
    b = GraphBuilder("scatter_elements")
    data = b.input(((32, 1000), F32), "data")
    idx = b.input(((32, 4000), I64), "idx")
    upd = b.input(((32, 4000), F32), "upd")
    return b.build([b.add1("scatter_elements", [data, idx, upd],
                           {"axis": 1, "reduction": "add"})])


def big_product() -> Graph:
    b = GraphBuilder("int_product")
    x = b.input(((300, 500), I32), "x")
    w = b.input(((500, 200), I32), "w")
    return b.build([b.add1("matmul", [x, w])])


GRAPHS = {
    **{f"scatter_elements_{r}_{d.value}": (lambda r=r, d=d: scatter_elements(d, r), True)
       for r in REDUCTIONS for d in (F32, F16, I32, BOOL)},
    **{f"scatter_nd_{r}_{d.value}": (lambda r=r, d=d: scatter_nd(d, r), True)
       for r in REDUCTIONS for d in (F32, BF16, I64, BOOL)},
    "scatter_nd_depth2": (lambda: scatter_nd(F32, "add", 2, rows=10), True),
    "big_scatter_nd": (big_scatter_nd, True),
    "big_scatter_elements": (big_scatter_elements, True),
    **{f"products_{d.value}": (lambda d=d: products(d), True) for d in (I32, I64, I8, U8)},
    "big_product": (big_product, True),
    **{f"var_{d.value}": (lambda d=d: variances(d, 1), False) for d in (F32, F16, I32)},
    **{f"pools_{d.value}_{c}": (lambda d=d, c=c: pools(d, c), not d.is_float)
       for d in (F32, F16, I32) for c in (False, True)},
    **{f"grouped_conv_{d.value}_{g}": (lambda d=d, g=g: grouped_conv(d, g), False)
       for d in (F32, F16) for g in (2, 6)},
}
"""Every graph above, for the device run (tests/gpu/test_coverage_device.py): (make, exact)."""


@pytest.mark.parametrize("name", ["big_scatter_nd", "big_scatter_elements", "big_product"])
def test_big_graphs_cross_compile(name: str) -> None:
    built = cross_compile(GRAPHS[name][0]())
    assert not built.host_steps
    if shutil.which("ptxas"):
        for ptx in built.ptx().values():
            assemble(ptx)


def test_int4_product_without_the_quantize_pass_runs_on_the_device() -> None:
    """An ONNX MatMulNBits' ``matmul_w4`` the cuda quantize pass did not re-pack (no
    ``quantize`` option): its dequantized weight through cuBLAS, not a host step."""
    from tilefuse.graph.ir import Literal

    rng = np.random.default_rng(4)
    b = GraphBuilder("w4")
    x = b.input(((5, 64), F32), "x")

    def const(a: np.ndarray):
        return b.add1("constant", [], {"value": Literal(a)})

    weights = [const(rng.integers(0, 256, (32, 24)).astype(np.uint8)),
               const(rng.uniform(0.01, 0.1, (2, 24)).astype(np.float32)),
               const(rng.integers(0, 16, (2, 24)).astype(np.uint8)),
               const(rng.standard_normal(24).astype(np.float32))]
    graph = b.build([b.add1("matmul_w4", [x, *weights], {"group": 32, "act": "gelu"})])
    _check(graph, exact=False, seeds=(0,))


def test_u8s8_epilogue_matches_the_reference_on_the_device() -> None:
    """``matmul_u8s8`` with a fused epilogue (rescale, GELU, shift) written as ops for cuda:
    the exact i32 product, then the steps in f32 as the reference takes them."""
    from tilefuse.graph.ir import Literal

    rng = np.random.default_rng(5)
    b = GraphBuilder("u8s8")
    a = b.input(((6, 40), U8), "a")
    scale = b.input(((24,), F32), "scale")
    zero = b.add1("constant", [], {"value": Literal(np.array(7, np.uint8))})
    w = b.add1("constant", [], {"value": Literal(rng.integers(-127, 128, (40, 24))
                                                 .astype(np.int8))})
    steps = (("mul", "t", 0, False), ("gelu",), ("add", "s", 0.5, False))
    graph = b.build([b.add1("matmul_u8s8", [a, zero, w, scale], {"epilogue": steps})])
    built = cross_compile(graph)
    assert not built.host_steps
    x = rng.integers(0, 256, (6, 40)).astype(np.uint8)
    s = rng.uniform(1e-3, 1e-2, 24).astype(np.float32)
    (got,) = simulate(built.program, [x, s])
    assert_close(np.asarray(got), interpret(graph, x, s)[0])
