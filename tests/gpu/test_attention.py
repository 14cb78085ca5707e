"""The fused GPU attention (:mod:`tilefuse.codegen.nvptx_attention`): PTX assembled by
``ptxas -arch=sm_90`` wherever it is installed, with FileCheck-style checks on the final PTX;
attention groups as one fused step (or unfused, logged, for what the kernel does not take); the
SDPA converters on CPU tensors. On a GPU: the kernel against a float64 NumPy reference for odd
sizes, masks, f16 and wide heads (fresh random inputs, outputs poisoned first), and
``torch.compile`` of SDPA modules on CUDA tensors against eager."""

from __future__ import annotations

import logging
import re
import shutil

import numpy as np
import pytest
from attentioncheck import (
    CASES,
    assemble,
    attention_graph,
    case_arrays,
    case_graph,
    case_reference,
    case_scale,
    random_input,
)

from tilefuse.codegen.nvptx_attention import (
    FlashConfig,
    FlashShape,
    MaskLayout,
    flash_attention,
    unsupported,
)
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.interpreter import interpret
from tilefuse.runtime.cuda_driver import cuda_available
from tilefuse.runtime.gpu import FusedStep, build_gpu_program

BF16, F16, F32 = DType.bf16, DType.f16, DType.f32
gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")
ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")


@ptxas
@pytest.mark.parametrize("shape", [
    FlashShape(128, 2048, 2048, 64, 64, 0.125),
    FlashShape(3, 513, 513, 64, 64, 0.125),
    FlashShape(2, 7, 7, 64, 64, 0.125),
    FlashShape(4, 100, 70, 32, 48, -0.3, F16),
    FlashShape(2, 130, 200, 128, 128, 0.08),
    FlashShape(4, 64, 97, 64, 64, 0.125, BF16, MaskLayout((2, 2), (97, 0), 0, 1)),
], ids=["g8", "odd513", "seq7", "f16_dv48", "d128", "mask_odd_keys"])
def test_flash_kernel_assembles_for_sm90(shape: FlashShape, tmp_path) -> None:
    kernel = flash_attention(shape)
    ptx = kernel.ptx
    kind = "f16.f16" if shape.dtype is F16 else "bf16.bf16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx          # Q and K fragments
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx    # V fragments
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group 0" in ptx
    assert "ex2.approx.ftz.f32" in ptx and "shfl.sync.bfly" in ptx and "bar.sync" in ptx
    assert ".maxntid 128" in ptx
    # P goes from accumulators to A fragments in registers: no shared store in the kernel
    assert "st.shared" not in ptx
    report = assemble(ptx, tmp_path, "sm_90")
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers <= 255
    if shape.mask is None:
        assert "0 bytes spill stores" in report


@ptxas
def test_g8_kernel_keeps_the_inner_loop_lean(tmp_path) -> None:
    """One 64-key tile of 128 rows over 4 warps: 2·8·4 S products and as many P·V products a
    warp (128 mma a thread), 16 + 16 ldmatrix.x4, 64 + 4 exponentials, 2 shuffles a row."""
    kernel = flash_attention(FlashShape(128, 2048, 2048, 64, 64, 0.125))
    # prologue | commit after the prefetch, the loop body | the loop head's wait
    body = kernel.ptx.split("cp.async.commit_group;")[2].split("cp.async.wait_group")[0]
    assert body.count("mma.sync.aligned") == 128
    assert body.count("ldmatrix.sync.aligned.m8n8.x4.shared") == 16
    assert body.count("ldmatrix.sync.aligned.m8n8.x4.trans") == 16
    assert body.count("ex2.approx.ftz.f32") == 68
    assert body.count("shfl.sync.bfly") == 8
    assert kernel.grid == 128 * 16 and kernel.block == 128 and kernel.shared_bytes == 36864


def test_unsupported_attentions_say_why() -> None:
    assert "bf16 or f16" in unsupported(FlashShape(1, 8, 8, 64, 64, 1.0, F32))
    assert "multiples of 16" in unsupported(FlashShape(1, 8, 8, 80 + 8, 64, 1.0))
    assert "up to 128" in unsupported(FlashShape(1, 8, 8, 256, 256, 1.0))
    assert "shared memory" in unsupported(FlashShape(1, 8, 8, 64, 64, 1.0),
                                          FlashConfig(256, 64, 4))
    with pytest.raises(CompileError, match="bf16 or f16"):
        flash_attention(FlashShape(1, 8, 8, 64, 64, 1.0, F32))


def test_attention_group_is_one_fused_step(tmp_path) -> None:
    graph = attention_graph((2, 3), 65, 65, 64, 64, BF16, 0.125, mask=(2, 1, 65, 65))
    program = build_gpu_program(graph, dump_dir=tmp_path)
    (step,) = program.steps
    assert isinstance(step, FusedStep)
    assert step.bindings == (*graph.inputs, graph.outputs[0])
    mask = step.kernel.shape.mask
    assert mask is not None and mask.batch_strides == (65 * 65, 0) and mask.row_stride == 65
    text = (tmp_path / "partition.txt").read_text()
    assert "flash_attention_6x65x65x64x64_bf16_mask" in text and "copies per call\nnone" in text
    assert list((tmp_path / "kernels").glob("flash_attention_*.ptx"))


@pytest.mark.parametrize("dtype,d,reason", [(F32, 64, "bf16 or f16"),
                                            (BF16, 40, "multiples of 16")])
def test_attention_the_kernel_cannot_take_runs_unfused_and_logged(dtype, d, reason, caplog
                                                                  ) -> None:
    graph = attention_graph((2,), 33, 33, d, d, dtype, 0.2)
    with caplog.at_level(logging.INFO, logger="tilefuse.fallback"):
        program = build_gpu_program(graph)
    assert not any(isinstance(s, FusedStep) for s in program.steps)
    assert {n.op.name for s in program.steps for n in s.group.nodes} >= {"matmul", "exp"}
    assert any("runs unfused on the GPU" in r.message and reason in r.message
               for r in caplog.records)


def test_sdpa_ops_of_cuda_traces_convert_to_attention() -> None:
    """The fused SDPA ops that tracing CUDA tensors gives, called directly on CPU tensors
    (their fake kernels trace anywhere): converted, none left to torch."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    import tilefuse.torch

    aten = torch.ops.aten

    def flash(q, k, v):  # type: ignore[no-untyped-def]
        return aten._scaled_dot_product_flash_attention.default(q, k, v, 0.0, True)[0]

    def efficient(q, k, v, m):  # type: ignore[no-untyped-def]
        return aten._scaled_dot_product_efficient_attention.default(
            q, k, v, m, False, 0.0, False, scale=0.3)[0]

    q, k, v = (torch.randn(2, 3, 37, 16) for _ in range(3))
    mask = torch.randn(2, 1, 37, 37)
    torch._dynamo.reset()
    got = torch.compile(flash, backend=tilefuse.torch.backend)(q, k, v)
    assert torch.allclose(got, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                          atol=1e-5)
    got = torch.compile(efficient, backend=tilefuse.torch.backend)(q, k, v, mask)
    assert torch.allclose(got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                              scale=0.3), atol=1e-5)


# ---- on the device ---------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("name", CASES)
def test_fused_attention_matches_float64(name: str) -> None:
    from tilefuse.runtime.gpu import CudaExecutable

    scale = case_scale(name)
    executable = CudaExecutable(build_gpu_program(case_graph(name)))
    assert isinstance(executable.program.steps[0], FusedStep)
    out = executable.graph.outputs[0]
    for seed in (0, 1):
        arrays = case_arrays(name, seed)
        executable._buffer(out).copy_from(np.full(out.shape, np.nan, out.dtype.np))
        (got,) = executable(*arrays)
        ref = case_reference(arrays, scale)
        got = got.astype(np.float64)
        assert np.isfinite(got).all(), name
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < 1e-2, (name, err)
        assert np.abs(got - ref).max() < 1.6e-2 * max(1.0, np.abs(ref).max()), name


@gpu
@pytest.mark.parametrize("config", [
    FlashConfig(sum_mma=1), FlashConfig(exp_pairs=1), FlashConfig(128, 32, 4, 2, pipeline=1),
    FlashConfig(128, 32, 4, 2, pipeline=1, exp_pairs=1), FlashConfig(pipeline=1, exp_pairs=1),
    FlashConfig(swizzle=1), FlashConfig(pipeline=1, swizzle=1, q_shared=1),
    FlashConfig(128, 32, 4, 2, 1, pipeline=1, swizzle=1),
], ids=["sum_mma", "exp_pairs", "pipeline_32_keys", "pipeline_exp_pairs_32_keys",
        "pipeline_exp_pairs", "swizzle", "pipeline_swizzle_q_shared",
        "sum_mma_pipeline_swizzle_32_keys"])
@pytest.mark.parametrize("name", ["seq7", "seq513", "f16_dv48_negative_scale",
                                  "mask_padding_odd_keys", "mask_causal", "sq_ne_sk"])
def test_kernel_knobs_match_float64(name: str, config: FlashConfig) -> None:
    from tilefuse.kernel.lower_gpu_attention import attention_shape
    from tilefuse.runtime.cuda_driver import CudaContext

    batch, sq, _, d, dv, dtype, _ = CASES[name]
    if config.swizzle and d % 64:
        pytest.skip("swizzled tiles take head dims of multiples of 64")
    kernel = flash_attention(attention_shape(case_graph(name).nodes[-1]), config)
    ctx = CudaContext()
    function = ctx.load_ptx(kernel.ptx).function(kernel.name)
    arrays = case_arrays(name, 5)
    buffers = [ctx.upload(a) for a in arrays]
    out = ctx.upload(np.full((*batch, sq, dv), np.nan, dtype.np))
    ctx.launch(function, kernel.grid, kernel.block, [b.ptr for b in buffers] + [out.ptr])
    got = out.copy_to(np.empty((*batch, sq, dv), dtype.np)).astype(np.float64)
    ref = case_reference(arrays, case_scale(name))
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2


@ptxas
def test_a_constant_causal_mask_offers_the_tile_skipping_kernel(tmp_path) -> None:
    """A causal constant mask (everything above the diagonal -inf) gives the attention step a
    tile-skipping alternative (chosen by measurement, checked against the default kernel on
    the real mask); a mask with one unmasked entry above the diagonal does not."""
    from tilefuse.graph.builder import GraphBuilder
    from tilefuse.graph.ir import Literal
    from tilefuse.kernel.lower_gpu_attention import causal_mask

    sq = 256
    causal = np.where(np.tril(np.ones((sq, sq), bool)), 0.0, -np.inf).astype(np.float32)
    leaky = causal.copy()
    leaky[3, 200] = 0.0
    assert causal_mask(causal, sq, sq) and causal_mask(causal[None, None], sq, sq)
    assert not causal_mask(leaky, sq, sq) and not causal_mask(causal, sq, sq + 1)
    for mask, skips in ((causal, True), (leaky, False)):
        b = GraphBuilder("causal")
        q, k, v = (b.input(((2, 4, sq, 64), BF16), n) for n in "qkv")
        m = b.add1("constant", [], {"value": Literal(mask.astype(BF16.np))})
        graph = b.build([b.add1("attention", [q, k, v, m], {"scale": 0.125})])
        (step,) = [s for s in build_gpu_program(graph).steps if isinstance(s, FusedStep)]
        names = [a.name for a in step.alternatives]
        assert any(n.endswith("_causal") for n in names) is skips, names
        for kernel in step.alternatives:
            if kernel.name.endswith("_causal"):
                assemble(kernel.ptx, tmp_path, "sm_90")


@gpu
@pytest.mark.parametrize("name", ["mask_causal_whole_tiles", "mask_causal_d128"])
def test_causal_tile_skip_matches_float64(name: str) -> None:
    from dataclasses import replace

    from tilefuse.codegen.nvptx_attention import default_config
    from tilefuse.kernel.lower_gpu_attention import attention_shape
    from tilefuse.runtime.cuda_driver import CudaContext

    batch, sq, _, _, dv, dtype, _ = CASES[name]
    shape = attention_shape(case_graph(name).nodes[-1])
    kernel = flash_attention(shape, replace(default_config(shape), causal=1))
    ctx = CudaContext()
    function = ctx.load_ptx(kernel.ptx).function(kernel.name)
    for seed in (5, 6):
        arrays = case_arrays(name, seed)
        buffers = [ctx.upload(a) for a in arrays]
        out = ctx.upload(np.full((*batch, sq, dv), np.nan, dtype.np))
        ctx.launch(function, kernel.grid, kernel.block, [b.ptr for b in buffers] + [out.ptr])
        got = out.copy_to(np.empty((*batch, sq, dv), dtype.np)).astype(np.float64)
        ref = case_reference(arrays, case_scale(name))
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2, name


@gpu
def test_fused_attention_against_interpreter_through_build_executable() -> None:
    from tilefuse.runtime.executable import build_executable
    from tilefuse.testing import assert_close

    graph = attention_graph((2, 4), 256, 256, 64, 64, BF16, 0.125)
    executable = build_executable(graph, "cuda")
    arrays = [random_input(np.random.default_rng(4), tuple(v.shape), BF16) for v in graph.inputs]
    (got,) = executable(*arrays)
    (want,) = interpret(graph, *arrays)
    assert_close(got, want, reduction=True)


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_torch_sdpa_module_on_cuda_tensors(causal: bool, tmp_path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    import tilefuse.torch

    class Sdpa(torch.nn.Module):
        def forward(self, q, k, v):  # type: ignore[no-untyped-def]
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    q, k, v = (torch.randn(2, 4, 257, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    torch._dynamo.reset()
    compiled = torch.compile(Sdpa(), backend=tilefuse.torch.backend,
                             options={"target": "cuda", "dump": str(tmp_path)})
    with torch.no_grad():
        got, want = compiled(q, k, v), Sdpa()(q, k, v)
    assert got.device.type == "cuda" and got.shape == want.shape
    (partitions,) = tmp_path.glob("*/s0/partitions.txt")
    assert partitions.read_text().endswith("# torch fallbacks\nnone\n"), partitions.read_text()
    (dump,) = tmp_path.glob("*/s0/tilefuse_0")
    assert "flash_attention_" in (dump / "partition.txt").read_text()
    err = (got.float() - want.float()).norm() / want.float().norm()
    assert err.item() < 1e-2
