"""One native build for every size: kernels whose loop extents are runtime scalars
(elementwise, rows, matmul M, movement remaps), checked against the reference interpreter on
sizes 1, 7 and 513, with the LLVM builds counted (a disk-less kernel cache: every miss is one
LLVM compile) and the guards checked before any native code."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special

from tilefuse.backend.cpu_symbolic import SymbolicNativeExecutable
from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.errors import GuardError
from tilefuse.frontend import jit
from tilefuse.graph.interpreter import interpret
from tilefuse.runtime.kernel_cache import KernelCache
from tilefuse.testing import assert_close, random_array

SIZES = (1, 7, 513)


def arr(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return random_array(np.random.default_rng(seed), shape, DType.f32)


def build(fn, dynamic, *example: np.ndarray) -> SymbolicNativeExecutable:
    """The symbolic native build of ``fn``'s optimised graph, with a disk-less kernel cache."""
    graph = jit(fn, dynamic=dynamic).lower(*example).optimized
    return SymbolicNativeExecutable(graph, cache=KernelCache(None, host_target()))


def check_sizes(exe: SymbolicNativeExecutable, make, sizes=SIZES) -> None:
    """Every size against the reference interpreter; no LLVM build after the first build."""
    compiled = exe.cache_stats.misses
    for seed, n in enumerate(sizes):
        args = make(seed, n)
        for got, want in zip(exe(*args), interpret(exe.graph, *args)):
            assert_close(got, want, reduction=True, msg=f"size {n}")
    assert exe.cache_stats.misses == compiled, "a kernel was compiled again for a new size"
    assert exe.kernel_specializations == 0
    assert exe.sizes_built == len(set(sizes))


def gelu_bias(x, b):
    y = x + b
    return 0.5 * y * (1.0 + scipy.special.erf(y / math.sqrt(2.0)))


def test_elementwise_kernel_takes_the_row_count_at_run_time():
    b = arr(1, (37,))
    exe = build(lambda x: gelu_bias(x, b), {"x": {0: "n"}}, arr(0, (3, 37)))
    assert exe.per_size_groups == [] and exe.runtime_extent_kernels
    fn = exe._builder.pending[0].kernels[0].fn
    assert fn.scalars == ("dim_n",)
    check_sizes(exe, lambda seed, n: [arr(seed, (n, 37))])


def test_flat_elementwise_over_two_symbols():
    exe = build(lambda x, y: np.tanh(x) * y + 1.0, {"x": {0: "b", 1: "s"}, "y": {0: "b", 1: "s"}},
                arr(0, (2, 3, 5)), arr(1, (2, 3, 5)))
    assert exe.per_size_groups == []
    check_sizes(exe, lambda seed, n: [arr(seed, (n, 3, 5)), arr(seed + 50, (n, 3, 5))])
    for shape in [(1, 1, 5), (7, 33, 5)]:
        x, y = arr(2, shape), arr(3, shape)
        assert_close(exe(x, y)[0], np.tanh(x) * y + 1.0)


def layer_norm(x, g):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + 1e-5) * g


def test_row_kernel_takes_the_row_count_at_run_time():
    g = arr(2, (45,))
    exe = build(lambda x: layer_norm(x, g), {"x": {0: "b", 1: "s"}}, arr(0, (2, 3, 45)))
    assert exe.per_size_groups == [] and exe.runtime_extent_kernels
    check_sizes(exe, lambda seed, n: [arr(seed, (n, 3, 45))])


W = arr(3, (96, 70))
BIAS = arr(4, (70,))


def mlp(x):
    return np.maximum(x @ W + BIAS, 0.0)


@pytest.mark.parametrize("rows", [(1, 7, 13, 513), (12, 24, 5, 1)])
def test_matmul_m_is_a_runtime_extent_with_every_tail(rows):
    exe = build(mlp, {"x": {0: "m"}}, arr(0, (5, 96)))
    assert exe.per_size_groups == [] and len(exe.runtime_extent_kernels) == 1
    check_sizes(exe, lambda seed, n: [arr(seed, (n, 96))], rows)


def test_small_runtime_m_runs_a_static_tile_per_size_with_a_runtime_b():
    """M below the register tile's rows picks, at run time, the nest a static compile of that
    M emits (a 1-row tile 8 vectors wide here, not the 6x64 tile's 4); B, a runtime input
    packed per call, is read from panels as wide as that tile. Every M up to past MR,
    N = 140 (a partial panel)."""
    def f(x, w):
        return np.tanh(x @ w)

    exe = build(f, {"x": {0: "m"}}, arr(0, (5, 96)), arr(1, (96, 140)))
    assert exe.per_size_groups == []
    main = next(k.fn for p in exe._builder.pending for k in p.kernels if "panels" not in
                k.fn.name)
    text = str(main)
    assert "if dim_m < " in text and "if dim_m == 1:" in text, text[:400]
    assert "acc0_7" in text   # the M = 1 tile has 8 accumulators (128 columns)
    rows = (*range(1, 14), 25, 513)
    check_sizes(exe, lambda seed, n: [arr(seed, (n, 96)), arr(seed + 50, (96, 140))], rows)


def test_batched_matmul_over_batch_and_sequence_symbols():
    w = arr(5, (64, 40))

    def f(x):
        return x @ w

    exe = build(f, {"x": {0: "b", 1: "s"}}, arr(0, (2, 3, 64)))
    assert exe.per_size_groups == []
    check_sizes(exe, lambda seed, n: [arr(seed, (n % 4 + 1, n, 64))])


def heads(x):
    b, s, _ = x.shape
    return x.reshape(b, s, 4, 8).transpose(0, 2, 1, 3)


def test_movement_remaps_take_runtime_dims():
    exe = build(heads, {"x": {0: "b", 1: "s"}}, arr(0, (2, 3, 32)))
    assert exe.per_size_groups == [] and exe.runtime_extent_kernels
    check_sizes(exe, lambda seed, n: [arr(seed, (n % 3 + 1, n, 32))])


def test_conflicting_sizes_are_a_guard_error_before_native_code():
    exe = build(lambda x, y: x + y, {"x": {0: "b"}, "y": {0: "b"}}, arr(0, (3, 4)),
                arr(1, (3, 4)))
    with pytest.raises(GuardError, match="symbol b must be one size"):
        exe(arr(0, (3, 4)), arr(1, (5, 4)))
    with pytest.raises(GuardError, match="must be a f32"):
        exe(arr(0, (3, 5)), arr(1, (3, 4)))       # a static dim
    assert exe.sizes_built == 0                    # nothing was prepared, nothing ran
    assert_close(exe(arr(2, (3, 4)), arr(3, (3, 4)))[0], arr(2, (3, 4)) + arr(3, (3, 4)))


def test_a_symbol_broadcast_against_a_size_is_built_per_size_and_guarded():
    y = arr(4, (5,))
    exe = build(lambda x: x + y, {"x": {0: "b"}}, arr(0, (5,)))
    assert [reason for _, reason in exe.per_size_groups] == [
        "add broadcasts symbol b of f32[b] against 5 (1 or 5 is known only per size)"]
    for n in (1, 5):
        x = arr(n, (n,))
        assert_close(exe(x)[0], x + y)
    assert exe.kernel_specializations == 2
    with pytest.raises(GuardError, match="b=3 break a constraint"):
        exe(arr(3, (3,)))


def w1(x, w, b):
    y = x @ w + b
    return 0.5 * y * (1.0 + scipy.special.erf(y / math.sqrt(2.0)))


def test_w1_at_two_sizes_builds_its_kernel_once():
    w, b = arr(6, (768, 3072)), arr(7, (3072,))
    exe = build(lambda x: w1(x, w, b), {"x": {0: "m"}}, arr(0, (5, 768)))
    assert exe.cache_stats.misses == 1 and exe.per_size_groups == []
    check_sizes(exe, lambda seed, n: [arr(seed, (n, 768))], (7, 64))
    assert exe.cache_stats.misses == 1


def test_bert_layer_at_two_sizes_builds_each_kernel_once():
    pytest.importorskip("torch")   # zoo builds the layer's weights with torch
    from tilefuse import zoo

    layer = zoo.bert_layer_numpy(zoo.bert_layer())
    exe = build(layer, {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 3: "seq"}},
                *zoo.bert_inputs(1, 3))
    assert exe.per_size_groups == []
    once = exe.cache_stats.misses
    # the three projections (and their row copies) run one compiled kernel each
    assert len(exe.runtime_extent_kernels) == once + exe.cache_stats.shared >= 12
    assert exe.cache_stats.shared >= 2
    for size in [(1, 7), (2, 33)]:
        x, mask = zoo.bert_inputs(*size)
        assert_close(exe(x, mask)[0], interpret(exe.graph, x, mask)[0], reduction=True)
    assert exe.kernel_specializations == 0
    assert exe.cache_stats.misses == once      # no kernel was compiled for a size


def attention(q, k, v, mask=None):
    s = q @ k.transpose(0, 1, 3, 2) * 0.25
    if mask is not None:
        s = s + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


ATTENTION_SIZES = [(1, 1, 1), (2, 7, 65), (1, 130, 33), (3, 64, 128)]


@pytest.mark.parametrize("mask_rows", [None, "one", "per_query"])
def test_fused_attention_takes_batch_and_both_sequences_at_run_time(mask_rows):
    """q [b,2,sq,16], k [b,2,sk,16], v [b,2,sk,20] (Dv padded), mask [b,1,1|sq,sk] or none."""
    dynamic = {"q": {0: "b", 2: "sq"}, "k": {0: "b", 2: "sk"}, "v": {0: "b", 2: "sk"},
               "mask": {0: "b", 3: "sk"}}
    if mask_rows == "per_query":
        dynamic["mask"][2] = "sq"

    def make(seed, size):
        b, sq, sk = size
        args = [arr(seed, (b, 2, sq, 16)), arr(seed + 1, (b, 2, sk, 16)),
                arr(seed + 2, (b, 2, sk, 20))]
        if mask_rows is not None:
            mask = np.where(arr(seed + 3, (b, 1, sq if mask_rows == "per_query" else 1, sk))
                            > 1.0, -np.inf, 0.0).astype(np.float32)
            mask[..., 0] = 0.0   # every query sees at least one key
            args.append(mask)
        return args

    fn = attention if mask_rows is not None else (lambda q, k, v: attention(q, k, v))
    names = ["q", "k", "v", "mask"][:len(make(0, (1, 2, 3)))]
    exe = build(fn, {n: dynamic[n] for n in names}, *make(0, (2, 3, 5)))
    assert "attention(" in str(exe.graph)
    assert exe.per_size_groups == [] and len(exe.runtime_extent_kernels) == 2  # prep, main
    check_sizes(exe, make, ATTENTION_SIZES)


def test_dynamic_executable_builds_once_or_falls_back_per_size_on_compile_error(caplog):
    import logging

    from tilefuse.errors import CompileError
    from tilefuse.runtime.dynamic import DynamicExecutable
    from tilefuse.runtime.executable import build_executable

    graph = jit(mlp, dynamic={"x": {0: "m"}}).lower(arr(0, (3, 96))).optimized
    built: list[str] = []

    def cpu(g, where):
        built.append("symbolic" if g is graph else "static")
        return build_executable(g, "cpu", where)

    def static_only(g, where):
        if g is graph:
            raise CompileError("this target needs static shapes")
        return cpu(g, where)

    once = DynamicExecutable(graph, cpu)
    caplog.set_level(logging.INFO, logger="tilefuse.recompiles")
    per_size = DynamicExecutable(graph, static_only)
    assert any("no symbolic build (this target needs static shapes)" in r.getMessage()
               for r in caplog.records)
    for seed, n in enumerate((1, 7, 513, 7)):
        x = arr(seed, (n, 96))
        assert_close(once(x)[0], mlp(x), reduction=True)
        assert_close(per_size(x)[0], mlp(x), reduction=True)
    assert built == ["symbolic", "static", "static", "static"]
    assert (once.specializations, per_size.specializations) == (0, 3)
    assert [b["m"] for b in once.sizes] == [1, 7, 513]
