"""The JIT: generated code's shape (FileCheck-style), OpenMP threads, object code round trip,
argument checks and errors."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from loopkernels import matmul_4x32, relu_sigmoid, relu_sigmoid_reference

from tilefuse.codegen import (
    CpuTarget,
    KernelSignature,
    aligned_empty,
    compile_kernel,
    host_target,
    kernel_from_bytes,
    llvm_ir_text,
    load_kernel,
    lower_to_llvm,
)
from tilefuse.codegen.pool import thread_pool
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, GuardError, VerifyError
from tilefuse.loop import (
    BufferParam,
    LoopFunction,
    LoopKind,
    broadcast,
    fma,
    interpret,
    loop,
    thread_id,
    var,
)
from tilefuse.testing import assert_close, random_array

F32 = DType.f32


def axpy(align: int = 0) -> LoopFunction:
    """Y[i:+16] = 2.5 * X[i:+16] + Y[i:+16] over full vectors (n a multiple of 16)."""
    x, y = BufferParam("X", F32, readonly=True, align=align), BufferParam("Y", F32, align=align)
    i = var("i")
    body = y.store(i, fma(broadcast(2.5, 16), x.load(i, 16), y.load(i, 16)))
    return LoopFunction("axpy", (x, y), ("n",), loop("i", 0, var("n"), [body], step=16,
                                                     kind=LoopKind.VECTORIZED))


def _checks(text: str, patterns: list[str]) -> None:
    """FileCheck's CHECK lines: each pattern must match, in order."""
    pos = 0
    for pattern in patterns:
        found = re.compile(pattern, re.M).search(text, pos)
        assert found, f"no match for {pattern!r} after offset {pos}"
        pos = found.end()


def test_llvm_ir_has_explicit_vectors_and_noalias():
    text = llvm_ir_text(axpy())
    _checks(text, [r"define internal void @\"?axpy\.impl\"?\(ptr noalias",
                   r"load <16 x float>, ptr .*, align 4",
                   r"call <16 x float> @\"?llvm\.fma\.v16f32\"?",
                   r"store <16 x float>",
                   r"define void @\"?axpy\"?\(ptr"])
    assert "align 64" not in text


def test_declared_alignment_reaches_the_ir():
    assert re.search(r"ptr noalias align 64", llvm_ir_text(axpy(align=64)))


@pytest.mark.skipif(not host_target().has("avx512f"), reason="host CPU has no AVX-512")
def test_assembly_uses_zmm_fma():
    asm = compile_kernel(axpy()).assembly()
    _checks(asm, [r"^axpy\.impl:|^axpy:", r"vfmadd\d+ps\s+.*%zmm\d+"])


def test_assembly_uses_vector_fma_on_any_x86():
    asm = compile_kernel(axpy()).assembly()
    assert re.search(r"vfmadd\d+ps\s+.*%[xyz]mm\d+", asm) or re.search(r"mulps", asm)


def test_threads_really_run():
    out = BufferParam("T", DType.i64)
    fn = LoopFunction("tid", (out,), ("n",),
                      loop("i", 0, var("n"), [out.store(var("i"), thread_id())],
                           kind=LoopKind.PARALLEL))
    kernel = compile_kernel(fn)
    # ~1 ms a call: the pool's worker joins a call once the OS runs it, but the caller never
    # waits for it, so on a loaded machine (the test suite's other workers) many calls may
    # run on the caller alone first; go on for up to 30 s
    n = 1 << 20
    ids = np.full(n, -1, np.int64)
    seen: set[int] = set()
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        ids[:] = -1
        kernel(ids, n, num_threads=2)
        ran = set(np.unique(ids).tolist())
        assert ran <= {0, 1}   # every iteration ran, on one of the two
        seen |= ran
        if seen == {0, 1}:
            break
    assert seen == {0, 1}, f"the pool runs {thread_pool().threads} threads"
    ids = ids[:64]
    kernel(ids, 64, num_threads=1)
    assert set(ids.tolist()) == {0}
    interpret(fn, ids, 64)
    assert set(ids.tolist()) == {0}


def test_parallel_loop_with_fewer_iterations_than_threads():
    rng = np.random.default_rng(1)
    a = random_array(rng, (4, 3), F32)
    b = random_array(rng, (3, 32), F32)
    c = np.zeros((4, 32), np.float32)
    compile_kernel(matmul_4x32())(a, b, c, 4, 32, 3, num_threads=2)
    assert_close(c, a @ b, reduction=True)


@pytest.mark.parametrize("build", [axpy, relu_sigmoid])
def test_object_code_round_trip(build):
    fn = build()
    kernel = compile_kernel(fn)
    signature = KernelSignature.from_json(kernel.signature.to_json())
    assert signature == kernel.signature
    loaded = load_kernel(kernel.object_code(), signature)
    rng = np.random.default_rng(7)
    x = random_array(rng, (4099 if build is relu_sigmoid else 4096,), F32)
    y1, y2 = x * 0.5, x * 0.5
    kernel(x, y1, x.size, num_threads=2)
    loaded(x, y2, x.size, num_threads=2)
    assert_close(y2, y1)
    if build is relu_sigmoid:
        assert_close(y2, relu_sigmoid_reference(x))
    with pytest.raises(CompileError):
        loaded.llvm_ir()


def test_kernel_blob_round_trip():
    kernel = compile_kernel(relu_sigmoid())
    loaded = kernel_from_bytes(kernel.to_bytes())
    x = random_array(np.random.default_rng(8), (513,), F32)
    y = np.zeros(513, np.float32)
    loaded(x, y, 513, num_threads=2)
    assert_close(y, relu_sigmoid_reference(x))


def test_corrupt_or_foreign_code_is_refused_not_run():
    kernel = compile_kernel(relu_sigmoid())
    obj, blob = kernel.object_code(), kernel.to_bytes()
    signature = kernel.signature
    far_table = obj[:0x28] + len(obj).to_bytes(8, "little") + obj[0x30:]  # e_shoff
    for bad in (b"junk" * 10, obj[: len(obj) // 2], far_table, obj.replace(b"ELF", b"FLE", 1)):
        with pytest.raises(CompileError):
            load_kernel(bad, signature)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0xFF
    with pytest.raises(CompileError, match="corrupt"):
        kernel_from_bytes(bytes(flipped))
    with pytest.raises(CompileError, match="not a tilefuse kernel"):
        kernel_from_bytes(obj)
    other = CpuTarget(host_target().triple, "znver1", "+avx2,+fma")
    with pytest.raises(CompileError, match="compiled for"):
        kernel_from_bytes(blob, target=other)


def test_unchecked_call_on_raw_addresses():
    kernel = compile_kernel(axpy())
    rng = np.random.default_rng(12)
    x, y = random_array(rng, (64,), F32), random_array(rng, (64,), F32)
    expected = (2.5 * x.astype(np.float64) + y).astype(np.float32)
    kernel.call_unchecked([x.ctypes.data, y.ctypes.data], [64])
    assert_close(y, expected)
    assert kernel.address


def test_aligned_buffers():
    kernel = compile_kernel(axpy(align=64))
    rng = np.random.default_rng(2)
    x = aligned_empty(4096, np.float32)
    y = aligned_empty(4096, np.float32)
    x[:] = random_array(rng, (4096,), F32)
    y[:] = random_array(rng, (4096,), F32)
    expected = (2.5 * x.astype(np.float64) + y).astype(np.float32)
    kernel(x, y, 4096)
    assert_close(y, expected)
    misaligned = aligned_empty(4097, np.float32)[1:]
    with pytest.raises(GuardError, match="aligned"):
        kernel(misaligned, y, 4096)


def test_argument_checks():
    kernel = compile_kernel(axpy())
    x, y = np.ones(32, np.float32), np.ones(32, np.float32)
    with pytest.raises(GuardError, match="takes 2 arrays and 1 scalars"):
        kernel(x, y)
    with pytest.raises(GuardError, match="f32 array"):
        kernel(x.astype(np.float64), y, 32)
    with pytest.raises(GuardError, match="contiguous"):
        kernel(np.ones(64, np.float32)[::2], y, 32)
    with pytest.raises(GuardError, match="overlap"):
        kernel(x, x, 32)
    frozen = np.ones(32, np.float32)
    frozen.setflags(write=False)
    with pytest.raises(GuardError, match="readonly"):
        kernel(x, frozen, 32)
    with pytest.raises(GuardError, match="int"):
        kernel(x, y, 32.0)
    with pytest.raises(GuardError, match="num_threads"):
        kernel(x, y, 32, num_threads=-1)
    kernel(frozen, y, 32)  # a readonly buffer may get a readonly array


def test_errors_are_tilefuse_errors():
    with pytest.raises(CompileError):
        load_kernel(b"not an object file", KernelSignature.of(axpy()))
    with pytest.raises(CompileError, match="malformed"):
        KernelSignature.from_json({"name": "k", "buffers": [{"name": "X"}], "scalars": []})
    bad = LoopFunction("bad", (BufferParam("X", F32, readonly=True),), (),
                       BufferParam("X", F32).store(0, broadcast(1.0, 1)))
    with pytest.raises(VerifyError, match="readonly"):
        compile_kernel(bad)
    with pytest.raises(VerifyError):
        lower_to_llvm(bad)


@pytest.mark.parametrize("threads", [2, 3, 70])   # 70: more threads than ranges (64)
@pytest.mark.parametrize("n,step", [(1, 1), (7, 1), (513, 1), (513, 3), (130, 2)])
def test_parallel_loop_runs_each_iteration_once(threads, n, step):
    """Ranges taken in grains and stolen: every iteration exactly once, whatever the thread
    count (more threads than cores or than ranges) and trip count."""
    out = BufferParam("T", DType.i64)
    fn = LoopFunction("count", (out,), ("n",),
                      loop("i", 0, var("n"), [out.store(var("i"), out.load(var("i")) + 1)],
                           step=step, kind=LoopKind.PARALLEL))
    kernel = compile_kernel(fn)
    for _ in range(5):
        hits = np.zeros(n, np.int64)
        kernel(hits, n, num_threads=threads)
        expected = np.zeros(n, np.int64)
        expected[::step] = 1
        np.testing.assert_array_equal(hits, expected)


def test_openmp_wait_default_respects_the_users_choice():
    """tilefuse shortens libgomp's idle spin unless the user chose a wait policy."""
    from tilefuse.codegen.target import SPIN_COUNT, quiet_openmp_waits

    env: dict[str, str] = {}
    quiet_openmp_waits(env)
    assert env == {"GOMP_SPINCOUNT": str(SPIN_COUNT)}
    for chosen in ({"GOMP_SPINCOUNT": "7"}, {"OMP_WAIT_POLICY": "active"}):
        env = dict(chosen)
        quiet_openmp_waits(env)
        assert env == chosen
