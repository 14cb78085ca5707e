"""The cuda target's weight-only quantized products on a GPU (``matmul_wq``,
:mod:`tilefuse.codegen.nvptx_qgemm`): every weight format, activation dtype, launch
configuration (register prefetching and cp.async rings too) and epilogue (bias; relu, GELU)
against the exact dequantized reference (the op's f32 reference on the host), on fresh random
inputs, the output poisoned first; and a quantized MLP built by the pass for the cuda target
run end to end with no host step."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tilefuse.codegen.nvptx_qgemm import qgemm, supports
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Literal
from tilefuse.kernel.lower_gpu_qmatmul import ALTERNATIVE_KNOBS, config_of
from tilefuse.passes.manager import run_pipeline
from tilefuse.passes.quantize import for_target, parse_quantize, pipeline_for
from tilefuse.runtime.cuda_driver import cuda_available

gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")
F32, BF16, F16 = DType.f32, DType.bf16, DType.f16


def linear(m: int, k: int, n: int, dtype: DType, act: str | None, seed: int) -> Graph:
    """act(x @ W + b) with a constant W [k, n] and bias b; act relu, gelu or none."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("linear")
    x = b.input(((m, k), dtype), "x")
    w = b.add1("constant", [], {"value": Literal(
        (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype.np))})
    bias = b.add1("constant", [], {"value": Literal(rng.standard_normal(n).astype(dtype.np))})
    y = b.add1("add", [b.add1("matmul", [x, w]), bias])
    if act == "gelu":
        return b.build([b.add1("gelu", [y], {"approximate": "none"})])
    return b.build([b.add1("relu", [y]) if act == "relu" else y])


def quantized(graph: Graph, mode: str) -> Graph:
    return run_pipeline(graph, for_target(pipeline_for(parse_quantize(mode)), "cuda"))[0]


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


PIPELINES = ({"tiles": 1, "warps": 4, "loads": 2, "stages": 8},
             {"tiles": 2, "warps": 2, "loads": 1, "stages": 2},
             {"tiles": 1, "warps": 8, "loads": 2, "prefetch": 3, "min_blocks": 3},
             {"tiles": 2, "warps": 4, "loads": 2, "prefetch": 1},
             {"tiles": 1, "warps": 8, "loads": 2, "nsplit": 2, "stream": True},
             {"tiles": 2, "warps": 4, "loads": 1, "nsplit": 4},
             {"tiles": 1, "warps": 16, "loads": 2, "nsplit": 4, "stages": 2})
"""Register prefetching, cp.async rings of every depth (K = 512: several warps' rings start
past the last K step and copy clamped steps they never read), streaming code loads and column
groups (one warp a group: no shared memory)."""

CASES = [("int4", BF16, 1), ("int4", BF16, 16), ("int4:32+zp", BF16, 5), ("int4:64", F16, 9),
         ("int4+zp", F32, 3), ("int4", F16, 37), ("int8", BF16, 1), ("int8", F16, 16),
         ("int8", F32, 4), ("fp8", BF16, 2), ("fp8", F16, 16), ("fp8", F32, 7)]


@gpu
@pytest.mark.parametrize("mode,dtype,m", CASES)
def test_every_configuration_matches_the_dequantized_reference(mode: str, dtype: DType,
                                                               m: int) -> None:
    from tilefuse.runtime.cuda_driver import CudaContext

    act = "relu" if m % 2 else "gelu" if m % 4 == 0 else None
    graph = quantized(linear(m, 512, 256, dtype, act, seed=m), mode)
    (node,) = [n for n in graph.nodes if n.op.name == "matmul_wq"]
    consts = {n.output: n.attrs["value"].array for n in graph.nodes if n.op.name == "constant"}
    context = CudaContext()
    rng = np.random.default_rng(100 + m)
    x = rng.standard_normal((m, 512)).astype(dtype.np)
    want = interpret(graph, x)[0]
    operands = [context.upload(np.ascontiguousarray(a))
                for a in (x, *(consts[v] for v in node.inputs[1:]))]
    base = config_of(node)
    extra = ({"tiles": 4, "warps": 2, "loads": 1}, {"tiles": 1, "warps": 1, "loads": 2}) \
        if m in (5, 16) else ()   # a few odd configurations (one warp: no shared memory)
    configs = [base] + [replace(base, **k) for k in (*ALTERNATIVE_KNOBS, *extra, *PIPELINES)]
    checked = 0
    for cfg in configs:
        if supports(cfg) is not None:
            continue
        kernel = qgemm(cfg)
        function = context.load_ptx(kernel.ptx).function(kernel.name)
        poison = np.full(want.shape, np.nan, np.float32).astype(dtype.np)
        out = context.upload(poison)
        context.launch(function, kernel.grid, kernel.block, [*(o.ptr for o in operands),
                                                             out.ptr])
        got = out.copy_to(np.empty(want.shape, dtype.np))
        assert np.isfinite(got.astype(np.float32)).all(), f"{cfg.name}: unwritten outputs"
        tol = 2e-5 if dtype is F32 else 4e-3
        assert _rel(got, want) < tol, f"{cfg.name}: {_rel(got, want):.2e}"
        checked += 1
    assert checked >= 2


@gpu
@pytest.mark.parametrize("mode", ["int4", "int8", "fp8"])
def test_quantized_mlp_runs_on_the_device_with_no_host_step(mode: str) -> None:
    from tilefuse.runtime.gpu import CudaExecutable, FusedStep, HostGroup, build_gpu_program

    rng = np.random.default_rng(7)
    b = GraphBuilder("mlp")
    x = b.input(((4, 256), BF16), "x")

    def const(a: np.ndarray):
        return b.add1("constant", [], {"value": Literal(a.astype(BF16.np))})

    h = b.add1("relu", [b.add1("add", [b.add1("matmul", [x, const(
        rng.standard_normal((256, 512)) / 16)]), const(rng.standard_normal(512))])])
    y = b.add1("matmul", [h, const(rng.standard_normal((512, 128)) / 24)])
    graph = quantized(b.build([y]), mode)
    program = build_gpu_program(graph)
    assert not [s for s in program.steps if isinstance(s, HostGroup)]
    assert len([s for s in program.steps if isinstance(s, FusedStep)]) == 2
    exe = CudaExecutable(program)
    xv = rng.standard_normal((4, 256)).astype(BF16.np)
    for _ in range(2):   # step by step, then replayed as a CUDA graph
        got = exe(xv)[0]
        assert _rel(got, interpret(graph, xv)[0]) < 1e-2
