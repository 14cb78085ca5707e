"""Grouped-query products on the cuda target (:mod:`tilefuse.runtime.gpu_grouped`): a decode
step's scores against a KV cache repeated over the heads sharing it are one product per KV
head with the heads' rows stacked (no broadcast copy of the keys), and match the reference;
identical kernels compile once."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.runtime.gpu import GemmStep, GpuKernel
from tilefuse.runtime.gpu_cross import assemble, cross_compile
from tilefuse.runtime.gpu_simulate import simulate
from tilefuse.testing import assert_close, random_array


def decode_attention(dtype: DType, kv: int = 2, g: int = 3, n: int = 37, d: int = 32,
                     rows: int = 1) -> Graph:
    """Llama's eager decode attention as core ATen writes it: the cache concatenated with the
    new row, repeated over ``g`` heads (expand + reshape), ``q · kᵀ`` scaled, an f32 softmax
    cast back, ``· v``."""
    b = GraphBuilder("decode_attention")
    h = kv * g
    q = b.input(((1, h, rows, d), dtype), "q")
    cache_k = b.input(((1, kv, n, d), dtype), "cache_k")
    cache_v = b.input(((1, kv, n, d), dtype), "cache_v")
    new_k = b.input(((1, kv, rows, d), dtype), "new_k")
    new_v = b.input(((1, kv, rows, d), dtype), "new_v")
    sk = n + rows

    def repeat(x):
        x = b.add1("reshape", [x], {"shape": (1, kv, 1, sk, d)})
        x = b.add1("broadcast_to", [x], {"shape": (1, kv, g, sk, d)})
        return b.add1("reshape", [x], {"shape": (1, h, sk, d)})

    keys = repeat(b.add1("concat", [cache_k, new_k], {"axis": 2}))
    values = repeat(b.add1("concat", [cache_v, new_v], {"axis": 2}))
    kt = b.add1("transpose", [keys], {"perm": (0, 1, 3, 2)})
    s = b.add1("matmul", [b.add1("reshape", [q], {"shape": (h, rows, d)}),
                          b.add1("reshape", [kt], {"shape": (h, d, sk)})])
    s = b.add1("reshape", [s], {"shape": (1, h, rows, sk)})
    from tilefuse.graph.ir import Literal
    scale = b.add1("constant", [], {"value": Literal(np.array(d ** -0.5, dtype.np))})
    s = b.add1("mul", [s, scale])
    p = b.add1("cast", [b.add1("softmax", [b.add1("cast", [s], {"dtype": DType.f32})],
                                {"axis": -1})], {"dtype": dtype})
    o = b.add1("matmul", [b.add1("reshape", [p], {"shape": (h, rows, sk)}),
                          b.add1("reshape", [values], {"shape": (h, sk, d)})])
    return b.build([b.add1("reshape", [o], {"shape": (1, h, rows, d)})])


@pytest.mark.parametrize(("dtype", "rows"), [(DType.bf16, 1), (DType.f32, 1), (DType.f16, 2)])
def test_grouped_products_fold_the_repeat(dtype: DType, rows: int) -> None:
    graph = decode_attention(dtype, rows=rows)
    built = cross_compile(graph)
    assert not built.host_steps
    products = [s for s in built.program.steps if isinstance(s, GemmStep)]
    # the scores: one product per KV head (its g heads' rows stacked); the weighted values
    # stay one product per head after the broadcast (faster in cuBLAS, measured)
    assert [(p.shape.batch, p.shape.m) for p in products] == [(2, 3 * rows), (6, rows)]
    kernels = [s for s in built.program.steps if isinstance(s, GpuKernel)]
    prologues = [{n.op.name for n in s.group.nodes} for s in kernels
                 if "prologue_b" in s.group.name]
    assert "broadcast_to" not in prologues[0] and "broadcast_to" in prologues[1]
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        arrays = [random_array(rng, tuple(v.shape), dtype) for v in graph.inputs]
        (got,), (want,) = simulate(built.program, arrays), interpret(graph, *arrays)
        assert_close(np.asarray(got), np.asarray(want), reduction=True)
    if shutil.which("ptxas"):
        for ptx in built.ptx().values():
            assemble(ptx)


def test_a_repeat_over_an_outer_batch_axis_is_left_alone() -> None:
    """The repeat axis must be the innermost batch axis for the heads' rows to stack."""
    from tilefuse.runtime.gpu_grouped import fold_grouped_products

    b = GraphBuilder("outer")
    a = b.input(((3, 2, 1, 8), DType.f32), "a")
    x = b.input(((1, 2, 8, 5), DType.f32), "x")
    rep = b.add1("broadcast_to", [b.add1("reshape", [x], {"shape": (1, 1, 2, 8, 5)})],
                  {"shape": (1, 3, 2, 8, 5)})
    y = b.add1("matmul", [a, b.add1("reshape", [rep], {"shape": (3, 2, 8, 5)})])
    graph = b.build([y])
    assert fold_grouped_products(graph) is graph


def test_identical_kernels_compile_once_under_their_own_names(monkeypatch) -> None:
    """A kernel repeated under another name (a transformer's layers) is compiled once; each
    copy's PTX names its own entry and parameters and nothing else."""
    import re

    from tilefuse.codegen import llvm_nvptx

    calls = []
    emit = llvm_nvptx.emit_ptx
    monkeypatch.setattr(llvm_nvptx, "_PTX_CACHE", {})
    monkeypatch.setattr(llvm_nvptx, "emit_ptx", lambda *a: calls.append(1) or emit(*a))
    b = GraphBuilder("layers")
    x = b.input(((4, 67), DType.f32), "x")
    y = x
    for _ in range(3):   # three identical softmax-then-tanh layers, each its own kernel
        y = b.add1("tanh", [b.add1("softmax", [b.add1("mul", [y, y])], {"axis": -1})])
        y = b.add1("transpose", [b.add1("reshape", [y], {"shape": (67, 4)})], {"perm": (1, 0)})
    graph = b.build([y])
    built = cross_compile(graph)
    ptx = built.ptx()
    assert len(calls) < len(ptx)
    for name, text in ptx.items():
        assert re.search(rf"\.entry {name}\(", text) and f"{name}_param_0" in text
        assert llvm_nvptx.CANONICAL_NAME not in text
        if shutil.which("ptxas"):
            assemble(text)
    arrays = [random_array(np.random.default_rng(0), (4, 67), DType.f32)]
    (got,), (want,) = simulate(built.program, arrays), interpret(graph, *arrays)
    assert_close(np.asarray(got), np.asarray(want), reduction=True)


def test_entry_pattern_names_only_the_kernel() -> None:
    from tilefuse.codegen.llvm_nvptx import entry_pattern

    text = ".visible .entry k5(\n.param .u64 k5_param_0\n%rd5 k51 k5_x k5"
    assert entry_pattern("k5").sub("Z", text) == \
        ".visible .entry Z(\n.param .u64 Z_param_0\n%rd5 k51 k5_x Z"


def test_the_benchmark_decode_step_cross_compiles_and_matches_eager() -> None:
    """``benchmarks/gpu_zoo.py``'s decode step at a small width (2 heads sharing each of 2 KV
    heads, a cache of 40): no host step, no broadcast of the keys, RoPE without slices, the
    scores softmax a warp per row, and the GPU program matches eager torch."""
    import sys
    from pathlib import Path

    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from gpu_zoo import _decode_module

    from tilefuse.frontend.torch.convert import tensor_to_numpy
    from tilefuse.runtime.gpu_cross import cross_compile_torch

    torch.manual_seed(0)
    module = _decode_module()(layers=1, hidden=256, heads=4, kv=2, inter=512).eval()
    module = module.to(torch.bfloat16)
    caches = [torch.randn(1, 2, 40, 64, dtype=torch.bfloat16) for _ in range(2)]
    inputs = [np.array([[7]], np.int64)] + [tensor_to_numpy(c) for c in caches]
    built = cross_compile_torch(module, inputs, name="decode")
    assert not built.host_steps
    kernels = [s for s in built.program.steps if isinstance(s, GpuKernel)]
    ops = [{n.op.name for n in s.group.nodes} for s in kernels]
    assert not any("slice" in o or ("broadcast_to" in o and "transpose" in o) for o in ops)
    softmax = [s for s in kernels if {"exp", "max"} <= {n.op.name for n in s.group.nodes}]
    assert softmax and all(s.simt_width == 32 for s in softmax)
    with torch.no_grad():
        want = module(torch.from_numpy(inputs[0]), *caches).float().numpy()
    (got,) = simulate(built.program, inputs)
    assert_close(np.asarray(got, np.float32), want, reduction=True)
    if shutil.which("ptxas"):
        for ptx in built.ptx().values():
            assemble(ptx)
