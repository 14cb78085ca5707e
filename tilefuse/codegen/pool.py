"""The thread pool that parallel loops run on: ``tilefuse_parallel(fn, ctx, threads)``.

Generated kernels do not call libgomp. A parallel loop calls ``tilefuse_parallel`` with its
worker function ``void fn(ptr ctx, i64 tid, i64 threads)`` (which takes the loop's iterations
in grains through atomic counters and steals what other threads left, see
:mod:`tilefuse.codegen.llvm_cpu`); this module compiles that function, once per process, with
the pool's worker threads behind it.

Why not ``GOMP_parallel``: libgomp ends every parallel region by joining every thread of its
team, so on a shared machine a worker the OS has not scheduled yet holds up every kernel, even
when the calling thread has stolen all of the work (ResNet-50 took 85-130 ms against
onnxruntime's 47 ms beside two busy processes; it has ~75 parallel loops a call). Here the
calling thread publishes the loop, runs grains itself, and then waits only for workers that
are running a grain at that moment; a worker that comes late finds every grain taken and does
nothing. That is onnxruntime's and Eigen's rule ("the caller runs what nobody claimed").

The protocol (all state below is this module's, one cache line per field):

* ``seq`` numbers the jobs: odd while a job is open, even once it is closed. Only the caller
  holding ``busy`` writes it, so it only grows.
* The caller: takes ``busy`` (a second caller in another thread that finds it taken runs its
  loop alone); stores ``job_fn``, ``job_ctx``, ``job_threads``; opens ``seq``; bumps the
  futex word ``wake`` and wakes sleepers if ``sleepers`` says any; runs ``fn(ctx, 0, n)``,
  which returns once every grain is taken; closes ``seq``; waits for ``inflight`` to drop to
  0; releases ``busy``.
* A worker ``t`` (1..n-1) polls ``seq`` for a new odd value, spinning for
  :data:`SPIN_CYCLES` of the time-stamp counter, then sleeps on ``wake``. On a new job it
  increments ``inflight``, reads ``seq`` again and runs ``fn(ctx, t, n)`` only if the job is
  still open (else the caller may have returned and ``ctx``, on its stack, is gone), then
  decrements ``inflight``. The increment and the caller's close are both sequentially
  consistent, so either the caller sees the worker in flight and waits, or the worker sees the
  job closed and leaves ``ctx`` alone.

Thread count: ``TILEFUSE_NUM_THREADS``, else ``OMP_NUM_THREADS`` (what users of OpenMP
runtimes set), else the CPUs this process may run on; the pool has one worker fewer (the
caller is the other). A forked child gets a fresh pool (``os.register_at_fork``). At
interpreter exit the workers are told to stop and awaited, before the code they run is freed.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tilefuse.codegen.target import (
    CpuTarget,
    host_target,
    register_symbol,
    target_machine,
    usable_cpus,
)
from tilefuse.errors import CompileError

if TYPE_CHECKING:
    import llvmlite.binding as llvm

SPIN_CYCLES = 200_000
"""How long an idle worker polls for the next loop before it sleeps, in time-stamp-counter
cycles (~0.1 ms here): longer than the gap between two kernels of one call and between calls
of a loop in Python, short enough not to take a core from another process for long."""

WAKE_CYCLES = 4_000_000
"""The longest :meth:`ThreadPool.wake` waits for every worker to check in, in time-stamp-counter
cycles (~2 ms here): a worker the OS has not scheduled by then is left to come late."""

YIELD_AFTER = 2048
"""Pause rounds a caller waits for in-flight workers before it yields its core each round."""

SYMBOL = "tilefuse_parallel"
"""The name kernels call the pool by."""


def pool_threads(env: Mapping[str, str] | None = None) -> int:
    """How many threads parallel loops use (the caller and the pool's workers)."""
    env = os.environ if env is None else env
    for name in ("TILEFUSE_NUM_THREADS", "OMP_NUM_THREADS"):
        text = env.get(name, "").strip()
        if not text:
            continue
        first = text.split(",")[0]  # OMP_NUM_THREADS may list one count per nesting level
        if not first.isdigit() or int(first) < 1:
            raise CompileError(f"{name}={text!r}: expected a positive thread count")
        return int(first)
    return usable_cpus()


def pool_ir() -> str:
    """The pool module's LLVM IR (for dumps and tests): built by :mod:`tilefuse.codegen.pool_ir`,
    imported only when the pool is compiled, so a loaded artifact needs no llvmlite.ir."""
    from tilefuse.codegen.pool_ir import build_pool_ir

    return build_pool_ir()


@dataclass
class ThreadPool:
    """The process's pool: its machine code and how many threads it runs loops on."""

    engine: llvm.ExecutionEngine
    threads: int
    address: int
    worker_tids: tuple[int, ...] = ()
    """The workers' kernel thread ids, in pool order (empty where they could not be told)."""

    def restart(self, threads: int) -> None:
        """Starts ``threads - 1`` workers (ids 1..threads-1); fewer if the OS refuses some."""
        spawn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64)(
            self.engine.get_function_address("tilefuse_pool_spawn"))
        set_workers = ctypes.CFUNCTYPE(None, ctypes.c_int64)(
            self.engine.get_function_address("tilefuse_pool_set_workers"))
        set_workers(0)
        started, tids = 0, []
        for tid in range(1, threads):
            before = _thread_ids()
            if spawn(tid) != 0:
                break
            started += 1
            new = _thread_ids() - before
            tids.append(new.pop() if len(new) == 1 else -1)
        set_workers(started)
        self.threads = started + 1
        self.worker_tids = tuple(tids) if -1 not in tids else ()

    def pin(self, first: int = 0) -> bool:
        """Pins the calling thread to CPU ``first`` of the process's affinity mask (modulo its
        size) and each worker to one of the CPUs after it, wrapping around. False where there
        is one CPU or the workers' thread ids are unknown (nothing pinned), or where the OS
        refused a thread (those before it stay pinned).

        For a process that times kernels between pipe messages (a tuning worker): woken by
        the pipe, its thread was seen placed on the core of the pool's worker while the other
        core idled, and a 0.3 ms kernel took 0.65 ms (the scheduler's balancing is slower than
        such a kernel); one timing in three was so hit on a 2-core host (docs/PERFORMANCE.md).
        A process whose thread runs all along (a model's calls) is not hit, so the pool does
        not pin by itself."""
        if len(self.worker_tids) != self.threads - 1 or not hasattr(os, "sched_setaffinity"):
            return False   # not Linux: no thread ids, no affinity calls
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return False
        try:
            os.sched_setaffinity(threading.get_native_id(), {cpus[first % len(cpus)]})
            for i, tid in enumerate(self.worker_tids, start=1):
                os.sched_setaffinity(tid, {cpus[(first + i) % len(cpus)]})
        except OSError:
            return False
        return True

    def wake(self) -> int:
        """Wakes every worker and returns once they are all polling for the next loop (or
        after :data:`WAKE_CYCLES`): the state a kernel finds right after another kernel ran,
        which a tuner's timing after a cache flush must recreate. Returns how many threads
        (the caller included) checked in."""
        return ctypes.CFUNCTYPE(ctypes.c_int64)(
            self.engine.get_function_address("tilefuse_pool_wake"))()

    def stop(self, wait_seconds: float = 2.0) -> bool:
        """Tells the workers to exit and waits for them (at interpreter exit: the machine code
        they run must outlive them). False if some did not exit in time; the engine is then
        never freed."""
        stop = ctypes.CFUNCTYPE(ctypes.c_int64)(
            self.engine.get_function_address("tilefuse_pool_stop"))
        deadline = time.monotonic() + wait_seconds
        while stop() > 0:
            if time.monotonic() > deadline:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(self.engine))  # keep the code mapped
                return False
            time.sleep(0.001)
        return True


def _thread_ids() -> set[int]:
    """This process's kernel thread ids (empty where ``/proc`` does not list them)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _pool_module(target: CpuTarget, tm: llvm.TargetMachine) -> llvm.ModuleRef:
    import llvmlite.binding as llvm

    module = llvm.parse_assembly(pool_ir())
    module.triple = target.triple
    module.data_layout = str(tm.target_data)
    module.verify()
    return module


def pool_object(target: CpuTarget) -> bytes:
    """The pool's code as relocatable object code for ``target``: what a compiled artifact
    carries, so that loading it in a fresh process compiles nothing
    (:func:`start_pool_from_object`)."""
    tm = target_machine(target)
    return tm.emit_object(_pool_module(target, tm))


_LINKED: list[Any] = []  # the pool's code linked from object code, not started yet


def start_pool_from_object(obj: bytes, target: CpuTarget) -> ThreadPool:
    """The process's pool; when it has not started yet, it starts from ``obj`` (made by
    :func:`pool_object` for ``target``, which the caller has checked) instead of being
    compiled. It is linked without LLVM (:mod:`tilefuse.runtime.object_link`); CompileError
    when it does not link (nothing is started then)."""
    if thread_pool.cache_info().currsize == 0:
        from tilefuse.runtime.object_link import link

        _LINKED[:] = [link([obj])]
    return thread_pool()


@functools.cache
def thread_pool() -> ThreadPool:
    """Compiles the pool (or takes the one :func:`start_pool_from_object` linked) and starts
    its workers (once per process); registers ``tilefuse_parallel`` so that kernels compiled or
    loaded afterwards link against it."""
    threads = pool_threads()
    if _LINKED:
        engine = _LINKED.pop()
    else:
        import llvmlite.binding as llvm

        target = host_target()
        tm = target_machine(target)
        engine = llvm.create_mcjit_compiler(_pool_module(target, tm), tm)
        engine.finalize_object()
    address = engine.get_function_address(SYMBOL)
    if not address:
        raise CompileError("the thread pool's code has no tilefuse_parallel")
    register_symbol(SYMBOL, address)  # for kernels linked after this, by LLVM or not
    pool = ThreadPool(engine, 1, address)
    pool.restart(threads)
    os.register_at_fork(after_in_child=lambda: pool.restart(pool_threads()))
    atexit.register(pool.stop)
    return pool


__all__ = ["SPIN_CYCLES", "SYMBOL", "WAKE_CYCLES", "ThreadPool", "pool_ir", "pool_object",
           "pool_threads", "start_pool_from_object", "thread_pool"]
