"""The compute roof: the FMA rate of every usable core, measured with a register-only loop.

The stored compute peak used to be the fastest of a few f32 matmuls (NumPy's sgemm and
tilefuse's own kernel). Measured once on a busy 2-core host, that gave 225 GFLOP/s, about one
core's worth, while single 3×3 convolutions of ResNet-50 reach 453-460 GFLOP/s there, the two
cores' AVX-512 FMA peak: every "% of bound" in ``tilefuse explain`` and the tuner was taken
against half the roof. A roof is what the cores can issue, not what some kernel reached, so it
is measured here directly: ``chains`` independent vector FMA chains (enough to cover the FMA
latency on every pipe), no memory operand, run on every usable core at once (Python threads
released by ctypes, started together at a barrier), each native call repeated until it takes
:attr:`FmaProbe.CALL_SECONDS`; the best of several short runs counts, so a spell in which the
OS gave a core to another process does not lower it.
"""

from __future__ import annotations

import ctypes

from tilefuse.codegen.target import CpuTarget, host_target, target_machine, usable_cpus
from tilefuse.tune.bandwidth import slowest_thread_seconds


def fma_chains(target: CpuTarget) -> int:
    """Independent accumulators: 16 of the 32 vector registers with AVX-512 (2 FMA pipes × a
    latency of 4 need 8; 16 leave room for a latency of 8), 10 of 16 registers otherwise."""
    return 16 if target.vector_bits == 512 else 10


def _fma_ir(triple: str, layout: str, lanes: int, chains: int) -> str:
    """``float tf_fma_loop(float a, float b, i64 reps)``: ``reps`` rounds of ``chains``
    vector FMAs ``acc = acc * a + b`` (a and b are arguments, so nothing folds; a < 1 keeps the
    accumulators finite and normal), then the sum of every lane (so nothing is dropped)."""
    vec = f"<{lanes} x float>"
    phis = "\n".join(f"  %a{j} = phi {vec} [ %init, %entry ], [ %n{j}, %loop ]"
                     for j in range(chains))
    fmas = "\n".join(f"  %n{j} = call {vec} @llvm.fma.v{lanes}f32({vec} %a{j}, {vec} %va, "
                     f"{vec} %vb)" for j in range(chains))
    sums = "\n".join(f"  %s{j} = fadd {vec} %s{j - 1}, %n{j}" for j in range(1, chains))
    return f"""
target triple = "{triple}"
target datalayout = "{layout}"
declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})
declare float @llvm.vector.reduce.fadd.v{lanes}f32(float, {vec})

define float @tf_fma_loop(float %a, float %b, i64 %reps) {{
entry:
  %ia = insertelement {vec} poison, float %a, i64 0
  %va = shufflevector {vec} %ia, {vec} poison, <{lanes} x i32> zeroinitializer
  %ib = insertelement {vec} poison, float %b, i64 0
  %vb = shufflevector {vec} %ib, {vec} poison, <{lanes} x i32> zeroinitializer
  %init = fadd {vec} %vb, %vb
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
{phis}
{fmas}
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, %reps
  br i1 %more, label %loop, label %done
done:
  %s0 = fadd {vec} %n0, zeroinitializer
{sums}
  %sum = call float @llvm.vector.reduce.fadd.v{lanes}f32(float 0.0, {vec} %s{chains - 1})
  ret float %sum
}}
"""


class FmaProbe:
    """The FMA loop compiled once for the host; :meth:`flops_per_second` measures it."""

    CALL_SECONDS = 2e-3
    """How long one timed native call runs (its rounds amortise the call's cost)."""

    def __init__(self, threads: int | None = None, target: CpuTarget | None = None):
        import llvmlite.binding as llvm

        target = target or host_target()
        tm = target_machine(target)
        self.lanes = target.vector_lanes(4)
        self.chains = fma_chains(target)
        module = llvm.parse_assembly(_fma_ir(target.triple, str(tm.target_data), self.lanes,
                                             self.chains))
        module.verify()
        self._engine = llvm.create_mcjit_compiler(module, tm)  # keeps the code alive
        self._engine.finalize_object()
        self._loop = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_float, ctypes.c_float,
                                      ctypes.c_int64)(
            self._engine.get_function_address("tf_fma_loop"))
        self.threads = threads or usable_cpus()

    def flops_per_round(self) -> float:
        """FLOP of one round of one thread (an FMA is two)."""
        return 2.0 * self.lanes * self.chains

    def _run(self, reps: int) -> float:
        """Seconds of every thread running ``reps`` rounds at once (the slowest thread's)."""

        def call(_t: int, times: int) -> None:
            self._loop(0.999, 0.001, times)

        return slowest_thread_seconds(self.threads, call, 64, reps)

    def flops_per_second(self, repeats: int) -> float:
        """FLOP/s of all threads together, the best of ``repeats`` timed runs."""
        reps = 1 << 12
        while (seconds := self._run(reps)) < self.CALL_SECONDS / 4 and reps < 1 << 30:
            reps *= 4
        reps = max(1, int(reps * self.CALL_SECONDS / max(seconds, 1e-9)))
        best = min(self._run(reps) for _ in range(max(1, repeats)))
        return self.threads * reps * self.flops_per_round() / best


def fma_peak(repeats: int = 8) -> float:
    """The host's FMA roof in FLOP/s (f32, every usable core), the best of ``repeats`` runs."""
    return FmaProbe().flops_per_second(repeats)


__all__ = ["FmaProbe", "fma_chains", "fma_peak"]
