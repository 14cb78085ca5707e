"""The cuda target without a GPU: GPU lowerings checked numerically through the loop-IR
interpreter (parallel loops run serially, which the grid-stride mapping makes equivalent), the
execution-model rules, the partition dump, and PTX accepted by ``ptxas -arch=sm_90``
(FileCheck-style checks on the final PTX only). On a machine with a GPU, the same graphs run
through :class:`CudaExecutable` against the reference."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from tilefuse.codegen.llvm_nvptx import check_gpu_kernel, compile_ptx
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Value
from tilefuse.loop.ir import (
    For,
    LoopFunction,
    LoopKind,
    Store,
    block,
    const,
    load,
    loop,
    var,
    walk_stmts,
)
from tilefuse.runtime.cuda_driver import cuda_available
from tilefuse.runtime.gpu import GemmStep, GpuKernel, build_gpu_program
from tilefuse.runtime.gpu_simulate import simulate
from tilefuse.testing import assert_close, random_array

F32 = DType.f32


def _constant(b: GraphBuilder, array: np.ndarray) -> Value:
    return b.add1("constant", [], {"value": array})


def w7_graph(shape: tuple[int, ...]) -> Graph:
    """relu(2x + 1) * sigmoid(x)."""
    b = GraphBuilder("w7")
    x = b.input((shape, F32), "x")
    two, one = _constant(b, np.array(2, np.float32)), _constant(b, np.array(1, np.float32))
    y = b.add1("relu", [b.add1("add", [b.add1("mul", [x, two]), one])])
    return b.build([b.add1("mul", [y, b.add1("sigmoid", [x])])])


def broadcast_graph(m: int, n: int) -> Graph:
    """x[m,n] * row[n] + col[m,1], then tanh: operands broadcast both ways."""
    b = GraphBuilder("bcast")
    x = b.input(((m, n), F32), "x")
    row = b.input(((n,), F32), "row")
    col = b.input(((m, 1), F32), "col")
    return b.build([b.add1("tanh", [b.add1("add", [b.add1("mul", [x, row]), col])])])


def softmax_graph(rows: int, n: int, dtype: DType = F32) -> Graph:
    b = GraphBuilder("softmax")
    x = b.input(((rows, n), dtype), "x")
    return b.build([b.add1("softmax", [x], {"axis": -1})])


def layer_norm_graph(rows: int, n: int, dtype: DType = F32) -> Graph:
    rng = np.random.default_rng(1)
    b = GraphBuilder("layer_norm")
    x = b.input(((rows, n), dtype), "x")
    g = _constant(b, random_array(rng, (n,), dtype))
    beta = _constant(b, random_array(rng, (n,), dtype))
    return b.build([b.add1("layer_norm", [x, g, beta], {"eps": 1e-5})])


def gelu_graph(n: int, dtype: DType) -> Graph:
    """gelu(3x): erf over both of its ranges, rounded to ``dtype``."""
    b = GraphBuilder("gelu")
    x = b.input(((n,), dtype), "x")
    three = _constant(b, np.array(3, dtype.np))
    return b.build([b.add1("gelu", [b.add1("mul", [x, three])])])


def ffn_graph(m: int, k: int, n: int) -> Graph:
    """softmax(gelu(x @ w + b)): a cuBLAS product, the bias + GELU epilogue as a generated
    kernel, then the softmax kernel."""
    rng = np.random.default_rng(2)
    b = GraphBuilder("ffn")
    x = b.input(((m, k), F32), "x")
    w = _constant(b, random_array(rng, (k, n), F32, -0.5, 0.5))
    bias = _constant(b, random_array(rng, (n,), F32))
    y = b.add1("add", [b.add1("matmul", [x, w]), bias])
    return b.build([b.add1("softmax", [b.add1("gelu", [y])], {"axis": -1})])


def batched_graph(batch: int, m: int, k: int, n: int) -> Graph:
    """exp(a @ b) * 0.5 with both operands batched, then a column sum (a plain reduction: a
    thread per output on the GPU)."""
    b = GraphBuilder("bmm")
    a = b.input(((batch, m, k), F32), "a")
    w = b.input(((batch, k, n), F32), "w")
    half = _constant(b, np.array(0.5, np.float32))
    y = b.add1("mul", [b.add1("exp", [b.add1("matmul", [a, w])]), half])
    return b.build([b.add1("sum", [y], {"axes": [1]})])


GRAPHS = {
    "w7_1": (lambda: w7_graph((1,)), False),
    "w7_513": (lambda: w7_graph((513,)), False),
    "w7_3d": (lambda: w7_graph((3, 7, 13)), False),
    "w7_warp_tails": (lambda: w7_graph((4 * 128 * 3 + 128 + 64 + 5,)), False),
    "broadcast": (lambda: broadcast_graph(7, 13), False),
    "softmax": (lambda: softmax_graph(7, 33), True),
    "layer_norm": (lambda: layer_norm_graph(5, 67), True),
    "softmax_warp": (lambda: softmax_graph(9, 256), True),
    "layer_norm_warp": (lambda: layer_norm_graph(3, 96), True),
    "layer_norm_bf16": (lambda: layer_norm_graph(4, 512, DType.bf16), True),
    "softmax_bf16_registers": (lambda: softmax_graph(5, 1024, DType.bf16), True),
    "layer_norm_bf16_registers": (lambda: layer_norm_graph(3, 4096, DType.bf16), True),
    "gelu_wide": (lambda: gelu_graph(4099, F32), False),
    "gelu_bf16": (lambda: gelu_graph(4099, DType.bf16), False),
    "ffn": (lambda: ffn_graph(7, 16, 9), True),
    "ffn_513": (lambda: ffn_graph(513, 32, 33), True),
    "ffn_bias_vectors": (lambda: ffn_graph(7, 16, 12), True),
    "bmm": (lambda: batched_graph(3, 5, 16, 7), True),
}


def _inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [random_array(rng, tuple(v.shape), v.dtype) for v in graph.inputs]


@pytest.mark.parametrize("name", GRAPHS)
def test_gpu_lowering_matches_reference(name: str) -> None:
    make, reduction = GRAPHS[name]
    graph = make()
    program = build_gpu_program(graph)
    arrays = _inputs(graph, 3)
    for got, want in zip(simulate(program, arrays), interpret(graph, *arrays)):
        assert_close(got, want, reduction=reduction)


def test_contraction_is_a_cublas_product_then_its_epilogue(tmp_path) -> None:
    program = build_gpu_program(ffn_graph(7, 16, 9), dump_dir=tmp_path)
    kinds = [type(s).__name__ for s in program.steps]
    assert kinds == ["GemmStep", "GpuKernel", "GpuKernel"]
    gemm, epilogue = program.steps[0], program.steps[1]
    assert (gemm.shape.m, gemm.shape.n, gemm.shape.k, gemm.shape.batch) == (7, 9, 16, 1)
    assert gemm.out in epilogue.bindings  # the epilogue reads the product
    assert {n.op.name for n in epilogue.group.nodes} >= {"add"}
    text = (tmp_path / "partition.txt").read_text()
    assert "cublas " in text and "m=7 n=9 k=16" in text and "copies per call\nnone" in text
    assert list((tmp_path / "kernels").glob("*.ptx"))


def test_device_arena_reuses_dead_intermediates() -> None:
    from tilefuse.runtime.gpu import plan_values
    from tilefuse.runtime.memory import value_names, verify_plan

    b = GraphBuilder("chain")
    rng = np.random.default_rng(0)
    y = b.input(((64, 256), F32), "x")
    for _ in range(3):  # product, relu epilogue, product, ...: a chain of dying values
        w = _constant(b, random_array(rng, (256, 256), F32))
        y = b.add1("relu", [b.add1("matmul", [y, w])])
    program = build_gpu_program(b.build([y]))
    plan = program.memory_plan()
    values = list(plan_values(program))
    assert len(values) == 6
    assert list(plan.offsets) == list(value_names(values).values())
    verify_plan(plan, list(plan.buffers))
    assert plan.arena_bytes <= 2 * 64 * 256 * 4 < plan.sum_bytes
    assert "# device memory" in program.partition_text()


def test_bias_broadcast_along_rows_keeps_vector_loads() -> None:
    epilogue = build_gpu_program(ffn_graph(7, 16, 12)).steps[1]
    assert isinstance(epilogue, GpuKernel)
    assert "ld.global.v4" in epilogue.ptx and "st.global.v4" in epilogue.ptx
    odd = build_gpu_program(ffn_graph(7, 16, 9)).steps[1]
    assert "ld.global.v4" not in odd.ptx  # 9 % 4: a run would cross a row


def test_batched_product_strides_and_a_device_reduction() -> None:
    program = build_gpu_program(batched_graph(3, 5, 16, 7))
    gemm = program.steps[0]
    assert isinstance(gemm, GemmStep)
    assert (gemm.shape.batch, gemm.shape.stride_a, gemm.shape.stride_b) == (3, 5 * 16, 16 * 7)
    reduction = [s for s in program.steps if isinstance(s, GpuKernel)
                 and s.group.kind.value == "reduction"]
    assert reduction and not [s for s in program.steps if type(s).__name__ == "HostGroup"]
    assert "copies per call\nnone" in program.partition_text()


def test_shared_weight_folds_the_batch_into_m() -> None:
    b = GraphBuilder("fold")
    x = b.input(((4, 3, 8), F32), "x")
    w = _constant(b, random_array(np.random.default_rng(0), (8, 5), F32))
    gemm = build_gpu_program(b.build([b.add1("matmul", [x, w])])).steps[0]
    assert isinstance(gemm, GemmStep)
    assert (gemm.shape.batch, gemm.shape.m, gemm.shape.n, gemm.shape.k) == (1, 12, 5, 8)


def test_elementwise_is_one_flat_parallel_loop() -> None:
    (step,) = build_gpu_program(broadcast_graph(7, 13)).steps
    assert isinstance(step, GpuKernel)
    top = step.fn.body.stmts
    assert [type(s).__name__ for s in top] == ["For"]
    assert top[0].kind is LoopKind.PARALLEL and top[0].stop.arg == 7 * 13
    assert step.grid == 1 and step.block == 256


def _kernel(body) -> LoopFunction:
    from tilefuse.loop.ir import BufferParam

    return LoopFunction("k", (BufferParam("a", F32, readonly=True), BufferParam("b", F32)), (),
                        block(*body))


def test_rules_reject_nested_parallel_and_cross_statement_reads() -> None:
    store = Store("b", var("i"), load("a", var("i"), dtype=F32))
    inner = loop("i", 0, 4, [store], kind=LoopKind.PARALLEL)
    with pytest.raises(CompileError, match="inside another statement"):
        check_gpu_kernel(_kernel([loop("j", 0, 2, [inner])]))
    first = loop("i", 0, 4, [store], kind=LoopKind.PARALLEL)
    reread = Store("b", const(0), load("b", const(1), dtype=F32))
    with pytest.raises(CompileError, match="no grid barrier"):
        check_gpu_kernel(_kernel([first, reread]))


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("name", ["w7_513", "broadcast", "softmax", "layer_norm",
                                  "softmax_warp", "layer_norm_warp"])
def test_ptx_assembles_for_sm90(name: str, tmp_path) -> None:
    program = build_gpu_program(GRAPHS[name][0]())
    for step in program.steps:
        assert isinstance(step, GpuKernel), step
        ptx = step.ptx
        assert ".target sm_90" in ptx and f".visible .entry {step.fn.name}(" in ptx
        assert "%ctaid.x" in ptx and "ld.global" in ptx and "st.global" in ptx
        path = tmp_path / f"{step.fn.name}.ptx"
        path.write_text(ptx)
        done = subprocess.run(["ptxas", "-arch=sm_90", str(path), "-o",
                               str(tmp_path / "k.cubin")], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


def test_rows_spread_over_warps_when_the_row_length_allows() -> None:
    (warp,) = build_gpu_program(softmax_graph(9, 256)).steps
    (thread,) = build_gpu_program(softmax_graph(9, 31)).steps   # shorter than a warp
    (tail,) = build_gpu_program(softmax_graph(9, 33)).steps     # a warp and a scalar tail
    assert isinstance(warp, GpuKernel) and isinstance(thread, GpuKernel)
    assert isinstance(tail, GpuKernel)
    assert (warp.simt_width, thread.simt_width, tail.simt_width) == (32, 1, 32)
    assert "shfl.sync.bfly" in tail.ptx
    assert "shfl.sync.bfly" in warp.ptx and "shfl" not in thread.ptx
    assert "ld.global.v4" in warp.ptx  # 4 f32 per thread: 16-byte accesses
    assert "ex2.approx.f32" in warp.ptx and "div.full.f32" in warp.ptx  # the SFU, not polynomials
    assert warp.grid * warp.block >= 9 * 32


def test_register_rows_read_the_row_once() -> None:
    (step,) = build_gpu_program(softmax_graph(5, 1024, DType.bf16)).steps
    assert isinstance(step, GpuKernel) and step.simt_width == 32
    # 1024 bf16 over 32 threads: 4 16-byte loads a thread, one exp per element, 4 stores
    assert step.ptx.count("ld.global.v4") == 4 and step.ptx.count("st.global.v4") == 4
    assert step.ptx.count("ex2.approx.f32") == 32
    (long,) = build_gpu_program(softmax_graph(5, 8192, DType.bf16)).steps
    assert isinstance(long, GpuKernel)
    assert not any(s.kind is LoopKind.UNROLLED and s.stop.arg == 8192
                   for s in walk_stmts(long.fn.body) if isinstance(s, For))


def test_flat_elementwise_runs_in_warp_form_with_loads_in_flight() -> None:
    (step,) = build_gpu_program(w7_graph((4 * 128 * 3 + 128 + 64 + 5,))).steps
    assert isinstance(step, GpuKernel) and step.simt_width == 32
    loops = [s for s in step.fn.body.stmts if isinstance(s, For)]
    assert [(s.step, s.stop.arg) for s in loops] == [(512, 1536), (128, 1664), (32, 1728),
                                                     (1, 1733)]
    assert step.ptx.count("ld.global.v4") >= 5  # 4 unrolled runs + the single-run loop


def test_reciprocal_divisors_divide_once_a_row() -> None:
    from tilefuse.codegen.llvm_nvptx import GpuTarget

    graph = softmax_graph(5, 1024, DType.bf16)
    (plain,) = build_gpu_program(graph).steps
    (rcp,) = build_gpu_program(graph, GpuTarget(reciprocal_divisors=1)).steps
    assert isinstance(plain, GpuKernel) and isinstance(rcp, GpuKernel)
    assert plain.ptx.count("div.full.f32") == 32 and rcp.ptx.count("div.full.f32") == 1


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")
@pytest.mark.parametrize("make", [lambda: softmax_graph(9, 256),
                                  lambda: softmax_graph(7, 1024, DType.bf16)])
def test_reciprocal_divisors_match_reference_on_the_device(make) -> None:
    from tilefuse.codegen.llvm_nvptx import GpuTarget
    from tilefuse.runtime.gpu import CudaExecutable

    graph = make()
    executable = CudaExecutable(build_gpu_program(graph, GpuTarget(reciprocal_divisors=1)))
    for seed in (8, 9):
        arrays = _inputs(graph, seed)
        for got, want in zip(executable(*arrays), interpret(graph, *arrays)):
            assert_close(got, want, reduction=True)


def test_compile_ptx_rejects_thread_id() -> None:
    from tilefuse.loop.ir import thread_id

    tid = thread_id()
    fn = _kernel([Store("b", tid, load("a", const(0), dtype=F32))])
    with pytest.raises(CompileError, match="thread_id"):
        compile_ptx(fn)


@pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name", GRAPHS)
def test_cuda_executable_matches_reference(name: str) -> None:
    from tilefuse.runtime.executable import build_executable

    make, reduction = GRAPHS[name]
    graph = make()
    executable = build_executable(graph, "cuda")
    for seed in (4, 5):
        arrays = _inputs(graph, seed)
        for got, want in zip(executable(*arrays), interpret(graph, *arrays)):
            assert_close(got, want, reduction=reduction)

