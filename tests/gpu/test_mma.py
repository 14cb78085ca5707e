"""The generated tensor-core product (:mod:`tilefuse.codegen.nvptx_mma`): PTX assembled by
``ptxas -arch=sm_90`` everywhere it is installed; on a GPU, the kernel against a float64
product of the same bf16 operands (fresh random inputs, output poisoned first)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from tilefuse.codegen.nvptx_mma import mma_gemm, supports
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.runtime.cuda_driver import cuda_available
from tilefuse.runtime.gpu import GemmStep, build_gpu_program

BF16 = DType.bf16
gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA device here")


def test_only_tile_multiples_of_bf16_are_generated() -> None:
    assert supports(256, 128, 64, BF16, BF16) and supports(128, 128, 32, BF16, DType.f32)
    assert not supports(256, 100, 64, BF16, BF16) and not supports(128, 128, 48, BF16, BF16)
    assert not supports(128, 128, 32, DType.f32, DType.f32)
    with pytest.raises(CompileError, match="tensor-core"):
        mma_gemm(128, 128, 48)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
@pytest.mark.parametrize("out", [BF16, DType.f32])
def test_mma_kernel_assembles_for_sm90(out: DType, tmp_path) -> None:
    kernel = mma_gemm(256, 384, 96, out)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in kernel.ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in kernel.ptx
    assert "st.shared.v4" in kernel.ptx and "bar.sync" in kernel.ptx
    path = tmp_path / "mma.ptx"
    path.write_text(kernel.ptx)
    done = subprocess.run(["ptxas", "-arch=sm_90", "-v", str(path), "-o",
                           str(tmp_path / "mma.cubin")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0 bytes spill stores" in done.stderr


def test_bf16_products_carry_the_generated_kernel() -> None:
    b = GraphBuilder("mm")
    x = b.input(((256, 64), BF16), "x")
    w = b.input(((64, 128), BF16), "w")
    (gemm,) = build_gpu_program(b.build([b.add1("matmul", [x, w])])).steps
    assert isinstance(gemm, GemmStep) and gemm.mma is not None
    assert (gemm.mma.m, gemm.mma.n, gemm.mma.k) == (256, 128, 64)


def _bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, np.float32).astype(BF16.np)


@gpu
@pytest.mark.parametrize("m,n,k", [(128, 128, 32), (384, 256, 160)])
@pytest.mark.parametrize("out", [BF16, DType.f32])
def test_mma_kernel_matches_float64(m: int, n: int, k: int, out: DType) -> None:
    from tilefuse.runtime.cuda_driver import CudaContext

    ctx = CudaContext()
    kernel = mma_gemm(m, n, k, out)
    function = ctx.load_ptx(kernel.ptx).function(kernel.name)
    for seed in (0, 1):
        rng = np.random.default_rng(seed)
        a, b = _bf16(rng, (m, k)), _bf16(rng, (k, n))
        da, db = ctx.upload(a), ctx.upload(b)
        dc = ctx.upload(np.full((m, n), np.nan, out.np))
        ctx.launch(function, kernel.grid, kernel.block, [da.ptr, db.ptr, dc.ptr])
        got = dc.copy_to(np.empty((m, n), out.np)).astype(np.float64)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        assert np.isfinite(got).all()
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        assert err < (1e-2 if out is BF16 else 1e-5), err


@gpu
def test_executable_product_matches_reference_whichever_is_chosen() -> None:
    from tilefuse.runtime.gpu import CudaExecutable

    b = GraphBuilder("mm")
    x = b.input(((256, 96), BF16), "x")
    w = b.input(((96, 384), BF16), "w")
    executable = CudaExecutable(build_gpu_program(b.build([b.add1("relu", [
        b.add1("matmul", [x, w])])])))
    rng = np.random.default_rng(7)
    a, wt = _bf16(rng, (256, 96)), _bf16(rng, (96, 384))
    (got,) = executable(a, wt)
    ref = np.maximum(a.astype(np.float64) @ wt.astype(np.float64), 0)
    assert np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref) < 1e-2
