"""Hopper's warpgroup MMA (:mod:`tilefuse.codegen.nvptx_wgmma`) and the fused attention on it
(:mod:`tilefuse.codegen.nvptx_wgmma_attention`): PTX for sm_90a assembled by ``ptxas
-arch=sm_90a`` wherever it is installed, with FileCheck-style checks on the final PTX; which
attentions route to the mma.sync kernel. On an sm_90 GPU: the probe's two products (S = Q·Kᵀ,
O = bf16(S)·V through the swizzled descriptors) against NumPy, the attention against a
float64 reference for odd sizes, masks and f16, and the executable's choice by measurement."""

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
    reference,
)

from tilefuse.codegen.nvptx_attention import (
    FlashConfig,
    FlashShape,
    MaskLayout,
    flash_attention,
    unsupported,
)
from tilefuse.codegen.nvptx_wgmma_attention import WGMMA_CONFIG, WGMMA_CONFIGS, wgmma_probe_ptx
from tilefuse.dtypes import DType
from tilefuse.kernel.lower_gpu_attention import attention_alternatives
from tilefuse.runtime.cuda_driver import cuda_available
from tilefuse.runtime.gpu import FusedStep, build_gpu_program

BF16, F16 = DType.bf16, DType.f16
ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")


def _sm90() -> bool:
    if not cuda_available():
        return False
    from tilefuse.runtime.cuda_driver import CudaContext

    return CudaContext().info.arch == "sm_90"


sm90 = pytest.mark.skipif(not _sm90(), reason="no sm_90 CUDA device here")
CONFIG_IDS = ["1wg", "2wg", "1wg_pipeline"]


@ptxas
def test_probe_assembles_for_sm90a(tmp_path) -> None:
    ptx = wgmma_probe_ptx()
    assert ".target sm_90a" in ptx
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") == 8
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.wait_group.sync.aligned 0" in ptx
    assert "0 bytes spill stores" in assemble(ptx, tmp_path, "sm_90a")


@ptxas
@pytest.mark.parametrize("shape", [
    FlashShape(128, 2048, 2048, 64, 64, 0.125),
    FlashShape(2, 7, 7, 64, 64, 0.125),
    FlashShape(3, 513, 513, 64, 64, 0.125, F16),
    FlashShape(4, 64, 97, 64, 64, 0.125, BF16, MaskLayout((2, 2), (97, 0), 0, 1)),
], ids=["g8", "seq7", "f16_513", "mask_odd_keys"])
@pytest.mark.parametrize("config", WGMMA_CONFIGS, ids=CONFIG_IDS)
def test_wgmma_attention_assembles_for_sm90a(shape: FlashShape, config: FlashConfig,
                                             tmp_path) -> None:
    kernel = flash_attention(shape, config)
    ptx = kernel.ptx
    kind = "f16.f16" if shape.dtype is F16 else "bf16.bf16"
    assert ".target sm_90a" in ptx and f".maxntid {config.threads}" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n64k16.f32.{kind}" in ptx
    assert "mma.sync" not in ptx and "ldmatrix.sync.aligned.m8n8.x4.trans" not in ptx
    assert "fence.proxy.async.shared::cta" in ptx and "st.shared" not in ptx
    report = assemble(ptx, tmp_path, "sm_90a")
    registers = int(re.search(r"Used (\d+) registers", report).group(1))
    assert registers * config.threads * config.min_blocks <= 65536
    assert "0 bytes spill stores" in report
    assert "C7510" not in report   # no "wgmma serialized" warnings
    assert kernel.block == config.threads and kernel.shared_bytes == 32768


@ptxas
def test_g8_wgmma_inner_loop(tmp_path) -> None:
    """A 64-key tile a warpgroup: 4 S products (k16 over D) and 4 P·V products (k16 over the
    keys), each batch fenced, committed and waited; 64 + 2 exponentials a thread."""
    kernel = flash_attention(FlashShape(128, 2048, 2048, 64, 64, 0.125), WGMMA_CONFIG)
    body = kernel.ptx.split("cp.async.commit_group;")[2].split("cp.async.wait_group")[0]
    assert body.count("wgmma.mma_async") == 8
    assert body.count("wgmma.commit_group") == 2 and body.count("wgmma.wait_group") == 2
    assert body.count("ex2.approx.ftz.f32") == 34


def test_wgmma_routes_what_it_does_not_take_to_mma_sync() -> None:
    assert "D = Dv = 64" in unsupported(FlashShape(1, 8, 8, 128, 128, 1.0), WGMMA_CONFIG)
    assert "64" in unsupported(FlashShape(1, 8, 8, 32, 48, 1.0, F16), WGMMA_CONFIG)
    assert "whole warpgroups" in unsupported(FlashShape(1, 8, 8, 64, 64, 1.0),
                                             FlashConfig(128, 64, 4, swizzle=1, wgmma=1))
    assert attention_alternatives(FlashShape(1, 8, 8, 128, 128, 1.0)) == ()
    alts = attention_alternatives(FlashShape(2, 7, 7, 64, 64, 0.125))
    assert [a.config for a in alts] == list(WGMMA_CONFIGS)


def test_attention_step_carries_the_wgmma_alternative(tmp_path, monkeypatch) -> None:
    program = build_gpu_program(attention_graph((2,), 65, 65, 64, 64, BF16, 0.125),
                                dump_dir=tmp_path)
    (step,) = program.steps
    assert isinstance(step, FusedStep) and not step.kernel.config.wgmma
    assert [a.config.wgmma for a in step.alternatives] == [1] * len(WGMMA_CONFIGS)
    assert "_wgmma, by measurement" in (tmp_path / "partition.txt").read_text()
    monkeypatch.setenv("TILEFUSE_NO_WGMMA", "1")
    (step,) = build_gpu_program(attention_graph((2,), 65, 65, 64, 64, BF16, 0.125)).steps
    assert step.alternatives == ()


# ---- on the device ---------------------------------------------------------------------

@sm90
@pytest.mark.parametrize("dtype", [BF16, F16])
def test_probe_products_match_numpy(dtype: DType) -> None:
    from tilefuse.runtime.cuda_driver import CudaContext

    ctx = CudaContext()
    fn = ctx.load_ptx(wgmma_probe_ptx(dtype is F16)).function("wgmma_probe")
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((64, 64), np.float32).astype(dtype.np) for _ in range(3))
    bufs = [ctx.upload(a) for a in (q, k, v)]
    outs = [ctx.upload(np.full((64, 64), np.nan, np.float32)) for _ in range(2)]
    ctx.launch(fn, 1, 128, [b.ptr for b in bufs] + [o.ptr for o in outs])
    s, o = (b.copy_to(np.empty((64, 64), np.float32)) for b in outs)
    want_s = q.astype(np.float64) @ k.astype(np.float64).T
    assert np.abs(s - want_s).max() < 1e-3 * np.abs(want_s).max(), "S = Q·Kᵀ"
    want_o = s.astype(dtype.np).astype(np.float64) @ v.astype(np.float64)
    assert np.abs(o - want_o).max() < 1e-3 * np.abs(want_o).max(), "O = S·V"


@sm90
@pytest.mark.parametrize("name", ["seq7", "seq513", "sq_ne_sk", "mask_full",
                                  "mask_padding_odd_keys", "mask_causal"])
@pytest.mark.parametrize("f16", [False, True])
@pytest.mark.parametrize("config", [*WGMMA_CONFIGS,
                                    FlashConfig(64, 32, 4, 4, pipeline=1, swizzle=1, wgmma=1)],
                         ids=[*CONFIG_IDS, "1wg_pipeline_32_keys"])
def test_wgmma_attention_matches_float64(name: str, f16: bool, config: FlashConfig) -> None:
    from tilefuse.kernel.lower_gpu_attention import attention_shape
    from tilefuse.runtime.cuda_driver import CudaContext

    batch, sq, _, _, dv, _, _ = CASES[name]
    dtype = F16 if f16 else BF16
    arrays = case_arrays(name, 11, dtype)
    shape = attention_shape(case_graph(name, dtype).nodes[-1])
    kernel = flash_attention(shape, config)
    ctx = CudaContext()
    function = ctx.load_ptx(kernel.ptx).function(kernel.name)
    buffers = [ctx.upload(np.ascontiguousarray(a)) for a in arrays]
    out = ctx.upload(np.full((*batch, sq, dv), np.nan, dtype.np))
    ctx.launch(function, kernel.grid, kernel.block, [b.ptr for b in buffers] + [out.ptr])
    got = out.copy_to(np.empty((*batch, sq, dv), dtype.np)).astype(np.float64)
    ref = case_reference(arrays, shape.scale)
    assert np.isfinite(got).all(), name
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-2, (name, err)


@sm90
def test_executable_chooses_by_measurement_and_logs(caplog) -> None:
    from tilefuse.runtime.gpu import CudaExecutable

    graph = attention_graph((4, 8), 1024, 1024, 64, 64, BF16, 0.125)
    with caplog.at_level(logging.INFO, logger="tilefuse.fallback"):
        executable = CudaExecutable(build_gpu_program(graph))
    assert any("chosen" in r.message and "wgmma" in r.message for r in caplog.records)
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(tuple(v.shape), np.float32).astype(BF16.np)
              for v in graph.inputs]
    (got,) = executable(*arrays)
    ref = reference(*[a.astype(np.float64) for a in arrays], None, 0.125)
    assert np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref) < 1e-2
