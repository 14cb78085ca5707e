"""Weight quantization for the cuda target, without a GPU: the ``quantize`` pass made for cuda
turns products against constant weights into ``matmul_wq`` (int4 / int8 / fp8, weight-only,
packed in the tile layout of :mod:`tilefuse.codegen.nvptx_qgemm`), a quantized MLP and a
Llama-style block build with zero host steps, the host simulation of the program matches the
reference interpreter, ``ptxas -arch=sm_90`` accepts every kernel, and the tile layout is the
PTX fragment layout (:func:`~tilefuse.ops.quant_gpu.fragment_coords`, written out
independently of the packer)."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph, Literal
from tilefuse.ops.quant import dequantize_w4
from tilefuse.ops.quant_gpu import (
    _fragments,
    chunk_lanes,
    dequantize,
    e4m3_values,
    fragment_coords,
    pack_tiles,
    unpack_tiles,
)
from tilefuse.passes.manager import run_pipeline
from tilefuse.passes.quantize import (
    QuantizeError,
    for_target,
    parse_quantize,
    pipeline_for,
    quantization_summary,
    quantize_int4,
)
from tilefuse.passes.quantize_gpu import quantize_fp8
from tilefuse.runtime.gpu import FusedStep, HostGroup, build_gpu_program
from tilefuse.runtime.gpu_cross import assemble
from tilefuse.runtime.gpu_simulate import simulate

F32, BF16, F16 = DType.f32, DType.bf16, DType.f16
ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")


def cuda_pipeline(mode: str):
    return for_target(pipeline_for(parse_quantize(mode)), "cuda")


def _const(b: GraphBuilder, array: np.ndarray, dtype: DType):
    return b.add1("constant", [], {"value": Literal(np.asarray(array).astype(dtype.np))})


def mlp(dtype: DType, m: int = 5, seed: int = 0) -> Graph:
    """relu(x @ W1 + b1) @ W2 (K 256 -> 512 -> 128)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("mlp")
    x = b.input(((m, 256), dtype), "x")
    h = b.add1("relu", [b.add1("add", [
        b.add1("matmul", [x, _const(b, rng.standard_normal((256, 512)) / 16, dtype)]),
        _const(b, rng.standard_normal(512), dtype)])])
    return b.build([b.add1("matmul", [h, _const(b, rng.standard_normal((512, 128)) / 22,
                                                 dtype)])])


def llama_block(dtype: DType, hidden: int = 256, heads: int = 4, inter: int = 384,
                tokens: int = 3, cache: int = 8, seed: int = 1) -> Graph:
    """RMSNorm, q/k/v, attention over a cache, o-projection, residual, RMSNorm, SiLU-gated
    MLP, residual: every product against a constant weight."""
    rng = np.random.default_rng(seed)
    d = hidden // heads
    b = GraphBuilder("llama_block")
    x = b.input(((tokens, hidden), dtype), "x")
    kc = b.input(((heads, cache, d), dtype), "k_cache")
    vc = b.input(((heads, cache, d), dtype), "v_cache")

    def w(rows: int, cols: int):
        return _const(b, rng.standard_normal((rows, cols)) / np.sqrt(rows), dtype)

    def norm(v):
        return b.add1("rms_norm", [v, _const(b, 1 + rng.random(hidden) / 4, dtype)],
                      {"eps": 1e-6})

    h = norm(x)
    q = b.add1("matmul", [h, w(hidden, hidden)])
    k, v = (b.add1("matmul", [h, w(hidden, hidden)]) for _ in range(2))
    q3 = b.add1("transpose", [b.add1("reshape", [q], {"shape": (tokens, heads, d)})],
                {"perm": [1, 0, 2]})
    att = b.add1("attention", [q3, kc, vc], {"scale": float(1 / np.sqrt(d))})
    flat = b.add1("reshape", [b.add1("transpose", [att], {"perm": [1, 0, 2]})],
                  {"shape": (tokens, hidden)})
    x2 = b.add1("add", [x, b.add1("matmul", [flat, w(hidden, hidden)])])
    h2 = norm(x2)
    gated = b.add1("mul", [b.add1("silu", [b.add1("matmul", [h2, w(hidden, inter)])]),
                           b.add1("matmul", [h2, w(hidden, inter)])])
    return b.build([b.add1("add", [x2, b.add1("matmul", [gated, w(inter, hidden)])]), k, v])


def _inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.shape).astype(v.dtype.np) for v in graph.inputs]


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


# ---- the tile layout ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt,lanes,k,n", [("int4", 16, 256, 48), ("int4", 8, 128, 32),
                                           ("int8", 16, 192, 32), ("fp8", 16, 64, 16)])
def test_packing_is_the_fragment_layout_and_round_trips(fmt: str, lanes: int, k: int,
                                                        n: int) -> None:
    rng = np.random.default_rng(k + n)
    codes = rng.integers(0, 16 if fmt == "int4" else 256, (k, n)).astype(np.uint8)
    kk, nn = fragment_coords(k, n, lanes)
    assert (_fragments(codes, lanes) == codes[kk, nn]).all()
    # every (k, n) appears exactly once
    assert np.bincount((kk * n + nn).ravel(), minlength=k * n).tolist() == [1] * (k * n)
    packed = pack_tiles(codes, fmt, lanes)
    assert packed.shape == (n // 16, (8 if fmt == "int4" else 16) * k)
    assert (unpack_tiles(packed, fmt, k, n, lanes) == codes).all()


def test_first_int4_word_holds_the_documented_nibbles() -> None:
    """Lane (g=1, q=2) of tile 0, first mma: a0 = W[n=1, k=2L+{0,1}], a1 = W[n=9, ...],
    a2 = W[n=1, k=2L+{2,3}], a3 = W[n=9, ...]; element (r, h) at nibble r + 4h."""
    k, n, lanes = 128, 16, 16
    codes = np.random.default_rng(3).integers(0, 16, (k, n)).astype(np.uint8)
    word = int(pack_tiles(codes, "int4", lanes).view("<u4")[0, (1 * 4 + 2) * 4])
    base = 2 * lanes
    for r, (dk, col) in enumerate([(0, 1), (0, 9), (2, 1), (2, 9)]):
        for h in range(2):
            assert (word >> (4 * (r + 4 * h))) & 0xF == codes[base + dk + h, col]


def test_int4_dequantization_is_the_cpu_schemes() -> None:
    """The cuda op's weights are the CPU's int4 codes and scales, re-packed: the dense
    weights agree exactly."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((256, 64)).astype(np.float32)
    for group, zp in ((128, False), (32, True)):
        packed, scales, zeros = quantize_int4(w, group, zp)
        from tilefuse.ops.quant import unpack_w4

        tiles = pack_tiles(unpack_w4(packed), "int4", chunk_lanes("int4", group))
        assert np.array_equal(dequantize(tiles, scales, zeros, fmt="int4", group=group, k=256),
                              dequantize_w4(packed, scales, zeros, group))


def test_fp8_weights_are_e4m3_per_channel() -> None:
    w = np.random.default_rng(6).standard_normal((128, 32)).astype(np.float32)
    codes, scale = quantize_fp8(w)
    back = e4m3_values(codes) * scale
    assert np.abs(e4m3_values(codes)).max() == 448
    assert _rel(back, w) < 0.05 and not np.isnan(back).any()


# ---- the pass and the program ------------------------------------------------------------


MODES = ["int4", "int4:64+zp", "int4:32", "int8", "fp8"]


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("mode", MODES)
def test_quantized_mlp_cross_compiles_with_no_host_step(mode: str, dtype: DType) -> None:
    graph = mlp(dtype)
    quantized = run_pipeline(graph, cuda_pipeline(mode))[0]
    ops = [n.op.name for n in quantized.nodes]
    assert ops.count("matmul_wq") == 2 and "matmul" not in ops
    assert "add" not in ops and "relu" not in ops   # bias and relu absorbed
    program = build_gpu_program(quantized)
    assert not [s for s in program.steps if isinstance(s, HostGroup)]
    assert len([s for s in program.steps if isinstance(s, FusedStep)]) == 2
    xs = _inputs(graph, 11)
    got = simulate(program, xs)[0]
    assert got.dtype == dtype.np
    # the kernel's model against the exact dequantized reference: f32 x goes through bf16
    # high and low parts (~2^-16), half outputs may round the other way (one ulp)
    assert _rel(got, interpret(quantized, *xs)[0]) < (3e-5 if dtype is F32 else 4e-3)
    # the quantized model is the f32 one to within the scheme's error
    assert _rel(got, interpret(graph, *xs)[0]) < {"int8": 0.02, "fp8": 0.06}.get(mode, 0.15)


@pytest.mark.parametrize("mode,dtype", [("int4", BF16), ("int8", F32), ("fp8", F16)])
def test_llama_block_has_no_host_step_and_every_product_quantized(mode: str,
                                                                  dtype: DType) -> None:
    graph = llama_block(dtype)
    quantized = run_pipeline(graph, cuda_pipeline(mode))[0]
    assert [n.op.name for n in quantized.nodes].count("matmul_wq") == 7
    summary = quantization_summary(quantized)
    assert summary.kernels == 7 and summary.f32_bytes > 3.5 * summary.quantized_bytes
    program = build_gpu_program(quantized)
    assert not [s for s in program.steps if isinstance(s, HostGroup)]
    xs = _inputs(graph, 12)
    for got, want in zip(simulate(program, xs), interpret(quantized, *xs)):
        assert _rel(got, want) < 2e-2


@ptxas
@pytest.mark.parametrize("mode,dtype", [("int4", BF16), ("int4:32+zp", F16), ("int4:64", F32),
                                        ("int8", BF16), ("int8", F16), ("fp8", BF16),
                                        ("fp8", F16)])
def test_ptxas_accepts_every_quantized_kernel(mode: str, dtype: DType) -> None:
    program = build_gpu_program(run_pipeline(mlp(dtype, m=17), cuda_pipeline(mode))[0])
    kernels = [k for s in program.steps if isinstance(s, FusedStep)
               for k in (s.kernel, *s.alternatives)]
    assert kernels
    for kernel in kernels:
        assert "mma.sync.aligned.m16n8k16.row.col.f32" in kernel.ptx
        assemble(kernel.ptx)


@ptxas
@pytest.mark.parametrize("fmt,dtype,m", [("int4", BF16, 1), ("int4", F16, 16), ("int8", F32, 3),
                                         ("fp8", BF16, 9)])
def test_ptxas_accepts_the_pipelined_kernels(fmt: str, dtype: DType, m: int) -> None:
    """Register prefetching 1..3 steps ahead and cp.async rings of 2..8 stages assemble; the
    ring is one copy a 16-byte code unit (and two 4-byte scale copies a group, int4) per K
    step, waited for ``stages - 1`` groups deep."""
    from tilefuse.codegen.nvptx_qgemm import QGemmConfig, qgemm, supports

    base = QGemmConfig(m, 256, 1024, dtype, fmt, group=64)
    for knobs in ({"prefetch": 1}, {"prefetch": 3, "min_blocks": 3}, {"stages": 2},
                  {"stages": 4, "warps": 4}, {"stages": 8, "warps": 2},
                  {"stream": True, "nsplit": 2}, {"nsplit": 8, "tiles": 2}):
        cfg = QGemmConfig(**{**base.__dict__, **knobs})
        assert supports(cfg) is None, cfg.name
        kernel = qgemm(cfg)
        if cfg.stages:
            body = kernel.ptx
            assert f"cp.async.wait_group {cfg.stages - 1};" in body
            assert body.count("cp.async.cg.shared.global") == cfg.stages * cfg.ring_codes
            scale_copies = 2 * cfg.ring_scales * cfg.stages
            assert body.count("cp.async.ca.shared.global") == scale_copies
        assemble(kernel.ptx)


def test_int4_defaults_follow_the_measured_rules() -> None:
    """The launch knobs the H200 sweeps chose (docs/PERFORMANCE.md): 32 warps an SM with two
    tiles for 16-bit activations up to 8 tokens where two blocks an SM hold the grid, the
    prefetching two-tile kernel for wider N, the streaming one above 8 tokens, one tile and
    16 warps for N < 8192, and a supported kernel with K steps for every warp whatever the
    shape."""
    from dataclasses import replace

    from tilefuse.codegen.nvptx_qgemm import QGemmConfig, supports
    from tilefuse.kernel.lower_gpu_qmatmul import default_knobs

    def tag(m: int, n: int, k: int, dtype: DType = BF16) -> str:
        cfg = QGemmConfig(m, n, k, dtype, "int4")
        chosen = replace(cfg, **default_knobs(cfg))
        assert supports(chosen) is None and k // chosen.k_step >= chosen.kwarps
        return chosen.name.rsplit("_", 1)[-1]

    assert tag(1, 8192, 8192) == tag(4, 8192, 8192) == "t2w16l2nb2"
    assert tag(1, 8192, 8192, F32) == "t2w8l2pn"      # f32's two parts would spill at 64
    assert tag(1, 11008, 4096) == "t2w8l2pn"          # 344 blocks: no two-wave kernel
    assert tag(16, 8192, 8192) == "t2w8l2n"
    assert tag(1, 4096, 4096) == tag(1, 4096, 11008) == "t1w16l2n"
    for m, n, k in ((5, 256, 512), (1, 8192, 512), (33, 4096, 256), (2, 16, 128)):
        tag(m, n, k)


def test_pipelines_are_refused_with_reasons() -> None:
    from tilefuse.codegen.nvptx_qgemm import QGemmConfig, supports

    base = QGemmConfig(1, 256, 1024, BF16, "int4")
    assert "2, 4 or 8" in supports(QGemmConfig(**{**base.__dict__, "stages": 3}))
    assert "both" in supports(QGemmConfig(**{**base.__dict__, "stages": 2, "prefetch": 1}))
    assert "shared memory" in supports(QGemmConfig(**{**base.__dict__, "stages": 8,
                                                      "warps": 16, "tiles": 4}))


def test_products_the_kernel_does_not_take_stay_on_cublas(caplog) -> None:
    b = GraphBuilder("odd")
    x = b.input(((3, 96), BF16), "x")
    y = b.add1("matmul", [x, _const(b, np.ones((96, 200)), BF16)])
    with caplog.at_level(logging.INFO, logger="tilefuse.passes"):
        quantized = run_pipeline(b.build([y]), cuda_pipeline("int4"))[0]
    assert [n.op.name for n in quantized.nodes if n.op.name != "constant"] == ["matmul"]
    assert "K a multiple of 128" in caplog.text


def test_fp8_is_refused_on_the_cpu() -> None:
    with pytest.raises(QuantizeError, match="cuda"):
        run_pipeline(mlp(F32), pipeline_for(parse_quantize("fp8")))


def test_the_cpu_pipeline_is_unchanged_by_for_target() -> None:
    pipeline = pipeline_for(parse_quantize("int4"))
    assert for_target(pipeline, "cpu") is pipeline
    assert for_target(None, "cuda") is None
    quantized = run_pipeline(mlp(F32), pipeline)[0]
    assert "matmul_w4" in [n.op.name for n in quantized.nodes]


def test_onnx_matmul_w4_is_repacked_for_the_gpu() -> None:
    """A ``matmul_w4`` already in the graph (ONNX MatMulNBits) becomes the GPU's op."""
    rng = np.random.default_rng(9)
    packed, scales, zeros = quantize_int4(rng.standard_normal((256, 32)).astype(np.float32),
                                          64, True)
    b = GraphBuilder("nbits")
    x = b.input(((2, 256), F32), "x")
    y = b.add1("matmul_w4", [x, *(_const(b, a, d) for a, d in (
        (packed, DType.u8), (scales, F32), (zeros, DType.u8),
        (np.zeros(32), F32)))], {"group": 64, "act": "none"})
    graph = b.build([y])
    quantized = run_pipeline(graph, cuda_pipeline("int8"))[0]
    assert "matmul_wq" in [n.op.name for n in quantized.nodes]
    xs = _inputs(graph, 13)
    program = build_gpu_program(quantized)
    assert _rel(simulate(program, xs)[0], interpret(graph, *xs)[0]) < 3e-5   # f32 x: hi + lo


def test_torch_linears_in_bf16_become_quantized_products() -> None:
    """A torch MLP (nn.Linear: x @ W.T + b, 3-D activations) in bf16: every linear is a
    ``matmul_wq`` with its bias (and the first one's relu) absorbed, no host step."""
    torch = pytest.importorskip("torch")
    from tilefuse.zoo import torch_graph

    class Mlp(torch.nn.Module):   # f32 in and out (torch_graph takes NumPy inputs)
        def __init__(self) -> None:
            super().__init__()
            self.seq = torch.nn.Sequential(torch.nn.Linear(256, 384), torch.nn.ReLU(),
                                           torch.nn.Linear(384, 128)).to(torch.bfloat16)

        def forward(self, x):
            return self.seq(x.to(torch.bfloat16)).float()

    torch.manual_seed(0)
    x = np.random.default_rng(14).standard_normal((2, 3, 256)).astype(np.float32)
    graph = torch_graph(Mlp().eval(), [x])
    quantized = run_pipeline(graph, cuda_pipeline("int4"))[0]
    ops = [n.op.name for n in quantized.nodes if n.op.name != "constant"]
    assert ops.count("matmul_wq") == 2 and "matmul" not in ops and "relu" not in ops
    assert {n.inputs[0].dtype for n in quantized.nodes if n.op.name == "matmul_wq"} == {BF16}
    program = build_gpu_program(quantized)
    assert not [s for s in program.steps if isinstance(s, HostGroup)]
    got = simulate(program, [x])[0]
    assert _rel(got, interpret(quantized, x)[0]) < 1e-2
    assert _rel(got, interpret(graph, x)[0]) < 0.2


def test_the_driver_quantizes_for_the_cuda_target(monkeypatch) -> None:
    """``compile_graph(target="cuda")`` runs the cuda form of the quantize pass (the build
    itself, which needs a GPU, is replaced)."""
    import tilefuse.driver as driver

    monkeypatch.setattr(driver, "build", lambda graph, target, options: None)
    options = driver.CompileOptions(pipeline=pipeline_for(parse_quantize("int8")))
    on_gpu = driver.compile_graph(mlp(F32), "cuda", options).optimized
    on_cpu = driver.compile_graph(mlp(F32), "cpu", options).optimized
    assert [n.op.name for n in on_gpu.nodes].count("matmul_wq") == 2
    assert [n.op.name for n in on_cpu.nodes].count("qmatmul_i8") == 2


def test_cli_dump_for_cuda_quantizes(tmp_path, monkeypatch, capsys) -> None:
    """``tilefuse dump MODEL --target cuda --quantize int4``: the partition shows the
    quantized kernel, no host step."""
    from tilefuse.cli import main

    (tmp_path / "gq_cli_fn.py").write_text(
        "import numpy as np\n"
        "W = (np.random.default_rng(3).standard_normal((256, 128)) * 0.1).astype(np.float32)\n"
        "def ffn(x):\n    return np.maximum(x @ W, 0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "dump"
    assert main(["dump", "gq_cli_fn:ffn", "--input", "x=3x256", "--target", "cuda",
                 "--quantize", "int4", "-o", str(out)]) == 0
    partition = (out / "partition.txt").read_text()
    assert "qgemm_int4_g128_f32_3x128x256" in partition and ", 0 on the host" in partition
    assert "warning" not in capsys.readouterr().out


EMULATED = [("int4", BF16, 1), ("int4:32+zp", F16, 9), ("int4:64+zp", F32, 3), ("int8", BF16, 16),
            ("int8", F16, 5), ("int8", F32, 2), ("fp8", BF16, 4), ("fp8", F16, 17)]


@pytest.mark.parametrize("mode,dtype,m", EMULATED)
def test_the_kernel_model_matches_the_dequantized_reference(mode: str, dtype: DType,
                                                            m: int) -> None:
    """:func:`emulate` (the kernel's arithmetic: its load offsets, bit-trick dequantization,
    fragment layout, k permutation, group scaling and warp split) against the op's exact
    reference, for the default, the timed alternatives, one warp and prefetching."""
    from dataclasses import replace

    from tilefuse.codegen.nvptx_qgemm import supports
    from tilefuse.kernel.lower_gpu_qmatmul import ALTERNATIVE_KNOBS, config_of, emulate

    graph = run_pipeline(mlp(dtype, m=m, seed=m), cuda_pipeline(mode))[0]
    node = next(n for n in graph.nodes if n.op.name == "matmul_wq")
    consts = {n.output: n.attrs["value"].array for n in graph.nodes if n.op.name == "constant"}
    x = np.random.default_rng(m).standard_normal((m, 256)).astype(dtype.np)
    operands = [consts[v] for v in node.inputs[1:]]
    want = node.op.reference(x, *operands, **node.attrs)
    base = config_of(node)
    for knobs in ({}, *ALTERNATIVE_KNOBS, {"tiles": 1, "warps": 1, "loads": 1},
                  {"tiles": 2, "warps": 4, "loads": 1, "prefetch": True},
                  {"tiles": 1, "warps": 4, "loads": 2, "stages": 8},
                  {"tiles": 1, "warps": 8, "loads": 1, "nsplit": 2, "stream": True}):
        cfg = replace(base, **knobs)
        if supports(cfg) is None:
            got = emulate(cfg, x, *operands)
            assert got.dtype == dtype.np and got.shape == want.shape
            assert _rel(got, want) < (3e-5 if dtype is F32 else 4e-3), cfg.name


def test_the_kernel_model_reads_the_packed_bytes() -> None:
    """Bytes in another order (two lanes' words swapped) give another product: the model
    reads the layout, it does not unpack through the packer."""
    from tilefuse.kernel.lower_gpu_qmatmul import config_of, emulate

    graph = run_pipeline(mlp(BF16), cuda_pipeline("int4"))[0]
    node = next(n for n in graph.nodes if n.op.name == "matmul_wq")
    consts = {n.output: n.attrs["value"].array for n in graph.nodes if n.op.name == "constant"}
    w, *rest = (consts[v] for v in node.inputs[1:])
    swapped = w.copy().view("<u4")
    swapped[:, [0, 4]] = swapped[:, [4, 0]]
    x = np.random.default_rng(2).standard_normal((5, 256)).astype(BF16.np)
    cfg = config_of(node)
    assert _rel(emulate(cfg, x, w, *rest), emulate(cfg, x, swapped.view(np.uint8), *rest)) > 1e-3


def test_a_transposed_constant_weight_is_quantized() -> None:
    """``x @ transpose(W)`` (nn.Linear past constant folding's 64 MiB cap) is quantized with
    W.T; the transpose is left dead."""
    from tilefuse.passes.quantize import MIN_WEIGHTS
    from tilefuse.passes.quantize_gpu import quantize_weights_gpu

    rng = np.random.default_rng(15)
    w = (rng.standard_normal((128, 256)) / 16).astype(BF16.np)     # [N, K], as nn.Linear
    b = GraphBuilder("linear_t")
    x = b.input(((4, 256), BF16), "x")
    wt = b.add1("transpose", [_const(b, w, BF16)], {"perm": [1, 0]})
    graph = b.build([b.add1("matmul", [x, wt])])
    quantized, changed = quantize_weights_gpu(graph, parse_quantize("int8"), MIN_WEIGHTS)
    assert changed and "matmul_wq" in [n.op.name for n in quantized.nodes]
    xs = _inputs(graph, 16)
    assert _rel(interpret(quantized, *xs)[0], interpret(graph, *xs)[0]) < 0.02


@ptxas
def test_sm80_gets_the_fma_form_and_fp8_is_refused_there(caplog) -> None:
    """Before sm_90 there is no ``sub.bf16x2``: the int4 kernel subtracts with
    ``fma.rn.bf16x2`` (assembled for sm_80); fp8 needs sm_89, so on sm_80 its product runs on
    the host, with the reason logged."""
    from tilefuse.codegen.llvm_nvptx import GpuTarget

    sm80 = GpuTarget("sm_80", 70)
    program = build_gpu_program(run_pipeline(mlp(BF16), cuda_pipeline("int4+zp"))[0], sm80)
    kernels = [s.kernel for s in program.steps if isinstance(s, FusedStep)]
    assert len(kernels) == 2 and all("fma.rn.bf16x2" in k.ptx for k in kernels)
    for kernel in kernels:
        assemble(kernel.ptx)
    with caplog.at_level(logging.WARNING, logger="tilefuse.fallback"):
        program = build_gpu_program(run_pipeline(mlp(BF16), cuda_pipeline("fp8"))[0], sm80)
    assert len([s for s in program.steps if isinstance(s, HostGroup)]) == 2
    assert "sm_89 for fp8" in caplog.text


def test_the_kernels_erf_is_erf() -> None:
    """The GELU epilogue's erf (``erf_f32``, the same IR builder the kernel uses), JIT-compiled
    for this CPU with ``llvm.exp2`` for the GPU's ``ex2.approx``, against tilefuse's erf."""
    import ctypes

    from llvmlite import binding as llvm
    from llvmlite import ir

    from tilefuse.codegen.llvm_types import F32, intrinsic
    from tilefuse.codegen.nvptx_qgemm import erf_f32
    from tilefuse.special import erf

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = ir.Module("erf_check")
    fn = ir.Function(module, ir.FunctionType(F32, [F32]), "erf_check")
    b = ir.IRBuilder(fn.append_basic_block())
    b.ret(erf_f32(b, fn.args[0], lambda bb, v: intrinsic(bb, "exp2", [v])))
    parsed = llvm.parse_assembly(str(module))
    engine = llvm.create_mcjit_compiler(parsed,
                                        llvm.Target.from_default_triple().create_target_machine())
    engine.finalize_object()
    call = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float)(engine.get_function_address(
        "erf_check"))
    xs = np.concatenate([np.linspace(-6, 6, 4001), [0.0, -0.0, 0.927734375, 1e-30, 40.0]])
    got = np.array([call(float(v)) for v in xs.astype(np.float32)], np.float32)
    assert np.abs(got - erf(xs.astype(np.float32))).max() < 3e-7


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_gelu_after_the_product_is_fused(dtype: DType) -> None:
    rng = np.random.default_rng(17)
    b = GraphBuilder("gelu_mlp")
    x = b.input(((6, 256), dtype), "x")
    y = b.add1("add", [b.add1("matmul", [x, _const(b, rng.standard_normal((256, 128)) / 16,
                                                   dtype)]),
                       _const(b, rng.standard_normal(128), dtype)])
    graph = b.build([b.add1("gelu", [y], {"approximate": "none"})])
    quantized = run_pipeline(graph, cuda_pipeline("int8"))[0]
    (node,) = [n for n in quantized.nodes if n.op.name != "constant"]
    assert node.op.name == "matmul_wq" and node.attrs["act"] == "gelu"
    program = build_gpu_program(quantized)
    (step,) = program.steps
    assert step.kernel.name.endswith("_gelu") and "ex2.approx" in step.kernel.ptx
    if shutil.which("ptxas"):
        assemble(step.kernel.ptx)
    xs = _inputs(graph, 18)
    assert _rel(simulate(program, xs)[0], interpret(quantized, *xs)[0]) < (
        3e-5 if dtype is F32 else 4e-3)
