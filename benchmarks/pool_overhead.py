"""The cost of one fork/join of tilefuse's thread pool, against libgomp's and a serial call.

    python benchmarks/pool_overhead.py [--calls 20000] [--rounds 7]

Compiles, next to the pool, a loop that runs ``calls`` parallel regions back to back (what a
model's launcher does between kernels) with a job of ``work`` nanoseconds-ish of register
arithmetic per thread, and times it; the same loop through ``GOMP_parallel`` (libgomp, the
OpenMP runtime LLVM and GCC use) and a plain serial call of the job. Printed: the minimum over
rounds of the time per region, in microseconds. An empty region measures the fork/join alone:
publish the job, wake or find the worker, run, wait for it to leave.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import statistics
import time

import llvmlite.binding as llvm

from tilefuse.codegen.pool import thread_pool
from tilefuse.codegen.target import host_target, target_machine

IR = r"""
declare void @tilefuse_parallel(ptr, ptr, i32)
declare void @GOMP_parallel(ptr, ptr, i32, i32)

; a job of `work` dependent multiply-adds per thread, a result the optimiser cannot drop
define void @job(ptr %ctx, i64 %tid, i64 %n) {
entry:
  %work = load i64, ptr %ctx
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %x = phi i64 [1, %entry], [%x1, %loop]
  %x0 = mul i64 %x, 6364136223846793005
  %x1 = add i64 %x0, 1442695040888963407
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %work
  br i1 %more, label %loop, label %done
done:
  %slot = getelementptr i64, ptr %ctx, i64 1
  store volatile i64 %x1, ptr %slot
  ret void
}

define void @gomp_job(ptr %ctx) {
  call void @job(ptr %ctx, i64 0, i64 1)
  ret void
}

define void @run_pool(i64 %calls, ptr %ctx) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  call void @tilefuse_parallel(ptr @job, ptr %ctx, i32 0)
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %calls
  br i1 %more, label %loop, label %done
done:
  ret void
}

define void @run_gomp(i64 %calls, ptr %ctx) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  call void @GOMP_parallel(ptr @gomp_job, ptr %ctx, i32 0, i32 0)
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %calls
  br i1 %more, label %loop, label %done
done:
  ret void
}

define void @run_serial(i64 %calls, ptr %ctx) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  call void @job(ptr %ctx, i64 0, i64 1)
  %i1 = add i64 %i, 1
  %more = icmp slt i64 %i1, %calls
  br i1 %more, label %loop, label %done
done:
  ret void
}
"""


def build() -> dict[str, ctypes._CFuncPtr]:
    """The three loops as ctypes functions ``f(calls, ctx)``."""
    pool = thread_pool()
    gomp = ctypes.util.find_library("gomp")
    if gomp:
        ctypes.CDLL(gomp, mode=ctypes.RTLD_GLOBAL)
        llvm.load_library_permanently(gomp)
    target = host_target()
    tm = target_machine(target)
    module = llvm.parse_assembly(IR)
    module.triple = target.triple
    engine = llvm.create_mcjit_compiler(module, tm)
    engine.finalize_object()
    build.engine = engine  # type: ignore[attr-defined]  # keep the code mapped
    kind = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_void_p)
    fns = {"serial": kind(engine.get_function_address("run_serial")),
           "pool": kind(engine.get_function_address("run_pool"))}
    if gomp:
        fns["libgomp"] = kind(engine.get_function_address("run_gomp"))
    print(f"pool threads: {pool.threads}; libgomp: {gomp or 'not found'}")
    return fns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--work", default="0,1000,10000",
                        help="multiply-adds per thread per region, comma-separated")
    args = parser.parse_args()
    fns = build()
    ctx = (ctypes.c_int64 * 2)()
    print(f"{'work':>7} " + " ".join(f"{n:>18}" for n in fns) + "   (us per region: min / median)")
    for work in (int(w) for w in args.work.split(",")):
        ctx[0] = work
        times: dict[str, list[float]] = {n: [] for n in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():  # interleaved
                t0 = time.perf_counter()
                fn(args.calls, ctypes.addressof(ctx))
                times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
        print(f"{work:>7} " + " ".join(
            f"{min(t):8.2f} / {statistics.median(t):7.2f}" for t in times.values()))


if __name__ == "__main__":
    main()
