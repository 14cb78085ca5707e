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

from llvmlite import ir
from llvmlite.ir import instructions

from tilefuse.codegen.llvm_types import I32, I64, PTR, VOID, declare
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

_SYS_FUTEX, _FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 202, 128, 129
_JOB = ir.FunctionType(VOID, [PTR, I64, I64])
_STATE = ("seq", "job_fn", "job_ctx", "job_threads", "inflight", "busy", "wake", "sleepers",
          "workers", "stop", "alive")
_STATE_TYPES = {"job_fn": PTR, "job_ctx": PTR, "busy": I32, "wake": I32, "sleepers": I32}


class _Callee:
    """A function pointer as llvmlite's ``call`` wants a callee: with its function type (an
    opaque ``ptr`` has none)."""

    def __init__(self, pointer: ir.Value, ftype: ir.FunctionType):
        self.pointer, self.function_type, self.type = pointer, ftype, pointer.type

    def get_reference(self) -> str:
        return self.pointer.get_reference()


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


def _align(var: ir.GlobalVariable) -> int:
    return 4 if var.value_type == I32 else 8


class _Builder:
    """Emits the pool's functions into one module."""

    def __init__(self) -> None:
        self.module = ir.Module("tilefuse.pool")
        self.state: dict[str, ir.GlobalVariable] = {}
        for name in _STATE:
            typ = _STATE_TYPES.get(name, I64)
            var = ir.GlobalVariable(self.module, typ, f"pool.{name}")
            var.linkage = "internal"
            var.initializer = ir.Constant(typ, None)
            var.align = 64  # one cache line each: workers poll seq while the caller writes
            self.state[name] = var

    def load(self, b: ir.IRBuilder, name: str, order: str = "seq_cst") -> ir.Value:
        var = self.state[name]
        return b.load_atomic(var, order, _align(var), typ=var.value_type)

    def store(self, b: ir.IRBuilder, name: str, value: ir.Value, order: str = "seq_cst") -> None:
        # IRBuilder.store_atomic reads the pointee type, which opaque pointers do not have
        b._insert(instructions.StoreAtomicInstr(b.block, value, self.state[name], order,
                                                _align(self.state[name])))

    def add(self, b: ir.IRBuilder, name: str, delta: int) -> None:
        var = self.state[name]
        b.atomic_rmw("add", var, ir.Constant(var.value_type, delta), "seq_cst")

    def pause(self, b: ir.IRBuilder) -> None:
        b.call(declare(self.module, "llvm.x86.sse2.pause", VOID, []), [])

    def cycles(self, b: ir.IRBuilder) -> ir.Value:
        return b.call(declare(self.module, "llvm.readcyclecounter", I64, []), [])

    def futex(self, b: ir.IRBuilder, op: int, value: ir.Value) -> None:
        syscall = self.module.globals.get("syscall")
        if syscall is None:
            syscall = ir.Function(self.module, ir.FunctionType(I64, [I64], var_arg=True),
                                  "syscall")
        b.call(syscall, [ir.Constant(I64, _SYS_FUTEX), self.state["wake"], ir.Constant(I32, op),
                         value, ir.Constant(PTR, None)])

    def is_new(self, b: ir.IRBuilder, seq: ir.Value, last: ir.Value) -> ir.Value:
        odd = b.icmp_unsigned("!=", b.and_(seq, ir.Constant(I64, 1)), ir.Constant(I64, 0))
        return b.and_(odd, b.icmp_unsigned("!=", seq, last))


def _parallel(p: _Builder) -> None:
    """``void tilefuse_parallel(ptr fn, ptr ctx, i32 threads)`` (threads 0: all of the pool)."""
    fn = ir.Function(p.module, ir.FunctionType(VOID, [PTR, PTR, I32]), SYMBOL)
    job, ctx, requested = fn.args
    blocks = {n: fn.append_basic_block(n) for n in
              ("entry", "alone", "lock", "publish", "wake", "run", "wait", "spin", "done")}
    b = ir.IRBuilder(blocks["entry"])
    everyone = b.add(p.load(b, "workers", "monotonic"), ir.Constant(I64, 1))
    asked = b.sext(requested, I64)
    n = b.select(b.icmp_signed(">", asked, ir.Constant(I64, 0)), asked, everyone)
    n = b.select(b.icmp_signed("<", n, everyone), n, everyone)
    b.cbranch(b.icmp_signed("<=", n, ir.Constant(I64, 1)), blocks["alone"], blocks["lock"])
    b.position_at_end(blocks["alone"])
    job = _Callee(job, _JOB)
    b.call(job, [ctx, ir.Constant(I64, 0), ir.Constant(I64, 1)])
    b.ret_void()
    b.position_at_end(blocks["lock"])
    taken = b.cmpxchg(p.state["busy"], ir.Constant(I32, 0), ir.Constant(I32, 1), "acquire",
                      "monotonic")
    b.cbranch(b.extract_value(taken, 1), blocks["publish"], blocks["alone"])
    b.position_at_end(blocks["publish"])
    p.store(b, "job_fn", job, "monotonic")
    p.store(b, "job_ctx", ctx, "monotonic")
    p.store(b, "job_threads", n, "monotonic")
    opened = b.add(p.load(b, "seq", "monotonic"), ir.Constant(I64, 1))
    p.store(b, "seq", opened)
    p.add(b, "wake", 1)
    asleep = p.load(b, "sleepers")
    b.cbranch(b.icmp_signed(">", asleep, ir.Constant(I32, 0)), blocks["wake"], blocks["run"])
    b.position_at_end(blocks["wake"])
    p.futex(b, _FUTEX_WAKE_PRIVATE, ir.Constant(I32, 2 ** 31 - 1))
    b.branch(blocks["run"])
    b.position_at_end(blocks["run"])
    b.call(job, [ctx, ir.Constant(I64, 0), n])
    p.store(b, "seq", b.add(opened, ir.Constant(I64, 1)))
    b.branch(blocks["wait"])
    b.position_at_end(blocks["wait"])
    rounds = b.phi(I64, "rounds")
    rounds.add_incoming(ir.Constant(I64, 0), blocks["run"])
    b.cbranch(b.icmp_signed("==", p.load(b, "inflight"), ir.Constant(I64, 0)),
              blocks["done"], blocks["spin"])
    b.position_at_end(blocks["spin"])
    p.pause(b)
    with b.if_then(b.icmp_signed(">", rounds, ir.Constant(I64, YIELD_AFTER))):
        b.call(declare(p.module, "sched_yield", I32, []), [])
    rounds.add_incoming(b.add(rounds, ir.Constant(I64, 1)), b.block)
    b.branch(blocks["wait"])
    b.position_at_end(blocks["done"])
    p.store(b, "busy", ir.Constant(I32, 0), "release")
    b.ret_void()


def _worker(p: _Builder) -> ir.Function:
    """``ptr worker(ptr tid)``: a pool thread's loop (module docstring); never returns."""
    fn = ir.Function(p.module, ir.FunctionType(PTR, [PTR]), "tilefuse.pool.worker")
    fn.linkage = "internal"
    blocks = {n: fn.append_basic_block(n) for n in
              ("entry", "idle", "poll", "clock", "wait", "spin", "sleep", "doze", "woke",
               "job", "enter", "call", "leave", "exit")}
    b = ir.IRBuilder(blocks["entry"])
    tid = b.ptrtoint(fn.args[0], I64)
    b.branch(blocks["idle"])
    b.position_at_end(blocks["idle"])
    last = b.phi(I64, "last")
    last.add_incoming(ir.Constant(I64, 0), blocks["entry"])
    since = p.cycles(b)
    b.branch(blocks["poll"])
    b.position_at_end(blocks["poll"])
    seq = p.load(b, "seq", "acquire")
    b.cbranch(p.is_new(b, seq, last), blocks["job"], blocks["clock"])
    b.position_at_end(blocks["clock"])
    stopping = b.icmp_signed("!=", p.load(b, "stop", "monotonic"), ir.Constant(I64, 0))
    b.cbranch(stopping, blocks["exit"], blocks["wait"])
    b.position_at_end(blocks["wait"])
    waited = b.sub(p.cycles(b), since)
    b.cbranch(b.icmp_unsigned("<", waited, ir.Constant(I64, SPIN_CYCLES)), blocks["spin"],
              blocks["sleep"])
    b.position_at_end(blocks["spin"])
    p.pause(b)
    b.branch(blocks["poll"])
    b.position_at_end(blocks["sleep"])
    p.add(b, "sleepers", 1)
    word = p.load(b, "wake")
    b.cbranch(p.is_new(b, p.load(b, "seq"), last), blocks["woke"], blocks["doze"])
    b.position_at_end(blocks["doze"])
    p.futex(b, _FUTEX_WAIT_PRIVATE, word)
    b.branch(blocks["woke"])
    b.position_at_end(blocks["woke"])
    p.add(b, "sleepers", -1)
    last.add_incoming(last, blocks["woke"])
    b.branch(blocks["idle"])
    b.position_at_end(blocks["job"])
    p.add(b, "inflight", 1)
    b.cbranch(b.icmp_unsigned("==", p.load(b, "seq"), seq), blocks["enter"], blocks["leave"])
    b.position_at_end(blocks["enter"])
    n = p.load(b, "job_threads", "monotonic")
    b.cbranch(b.icmp_signed("<", tid, n), blocks["call"], blocks["leave"])
    b.position_at_end(blocks["call"])
    job = p.load(b, "job_fn", "monotonic")
    b.call(_Callee(job, _JOB), [p.load(b, "job_ctx", "monotonic"), tid, n])
    b.branch(blocks["leave"])
    b.position_at_end(blocks["leave"])
    p.add(b, "inflight", -1)
    last.add_incoming(seq, blocks["leave"])
    b.branch(blocks["idle"])
    b.position_at_end(blocks["exit"])
    p.add(b, "alive", -1)
    b.ret(ir.Constant(PTR, None))
    return fn


def _controls(p: _Builder, worker: ir.Function) -> None:
    """``i32 tilefuse_pool_spawn(i64 tid)`` (pthread_create's result),
    ``void tilefuse_pool_set_workers(i64 count)`` (with 0, before workers start, also clears
    the state: a forked child) and
    ``i64 tilefuse_pool_stop()`` (tells the workers to exit; returns how many still run)."""
    spawn = ir.Function(p.module, ir.FunctionType(I32, [I64]), "tilefuse_pool_spawn")
    b = ir.IRBuilder(spawn.append_basic_block("entry"))
    handle = b.alloca(I64)
    create = declare(p.module, "pthread_create", I32, [PTR, PTR, PTR, PTR])
    rc = b.call(create, [handle, ir.Constant(PTR, None), worker,
                         b.inttoptr(spawn.args[0], PTR)])
    with b.if_then(b.icmp_signed("==", rc, ir.Constant(I32, 0))):
        b.call(declare(p.module, "pthread_detach", I32, [I64]), [b.load(handle, typ=I64)])
    b.ret(rc)
    setter = ir.Function(p.module, ir.FunctionType(VOID, [I64]), "tilefuse_pool_set_workers")
    b = ir.IRBuilder(setter.append_basic_block("entry"))
    # The state is cleared by set_workers(0), before any worker starts, never after: a worker
    # spawned since may already sleep, counted in sleepers (clearing that left it asleep for
    # good, every caller believing no one slept: a forked child's pool lost its worker).
    with b.if_then(b.icmp_signed("==", setter.args[0], ir.Constant(I64, 0))):
        for name in ("inflight", "busy", "sleepers", "stop"):
            typ = p.state[name].value_type
            p.store(b, name, ir.Constant(typ, 0))
    p.store(b, "workers", setter.args[0])
    p.store(b, "alive", setter.args[0])
    b.ret_void()
    stop = ir.Function(p.module, ir.FunctionType(I64, []), "tilefuse_pool_stop")
    b = ir.IRBuilder(stop.append_basic_block("entry"))
    p.store(b, "stop", ir.Constant(I64, 1))
    p.add(b, "wake", 1)
    p.futex(b, _FUTEX_WAKE_PRIVATE, ir.Constant(I32, 2 ** 31 - 1))
    b.ret(p.load(b, "alive"))


def _wake(p: _Builder) -> None:
    """``i64 tilefuse_pool_wake()``: runs a job in which every thread adds one to a counter
    on the caller's stack and the caller waits (at most :data:`WAKE_CYCLES`) until all have:
    afterwards every worker that came is awake and polling, as after a kernel. Returns the
    count (the caller included)."""
    job = ir.Function(p.module, _JOB, "tilefuse.pool.wake_job")
    job.linkage = "internal"
    ctx, tid, n = job.args
    blocks = {k: job.append_basic_block(k) for k in ("entry", "caller", "poll", "spin", "done")}
    b = ir.IRBuilder(blocks["entry"])
    b.atomic_rmw("add", ctx, ir.Constant(I64, 1), "seq_cst")
    b.cbranch(b.icmp_signed("==", tid, ir.Constant(I64, 0)), blocks["caller"], blocks["done"])
    b.position_at_end(blocks["caller"])
    since = p.cycles(b)
    b.branch(blocks["poll"])
    b.position_at_end(blocks["poll"])
    arrived = b.load_atomic(ctx, "seq_cst", 8, typ=I64)
    waited = b.sub(p.cycles(b), since)
    pending = b.and_(b.icmp_signed("<", arrived, n),
                     b.icmp_unsigned("<", waited, ir.Constant(I64, WAKE_CYCLES)))
    b.cbranch(pending, blocks["spin"], blocks["done"])
    b.position_at_end(blocks["spin"])
    p.pause(b)
    b.branch(blocks["poll"])
    b.position_at_end(blocks["done"])
    b.ret_void()
    wake = ir.Function(p.module, ir.FunctionType(I64, []), "tilefuse_pool_wake")
    b = ir.IRBuilder(wake.append_basic_block("entry"))
    counter = b.alloca(I64)
    b.store(ir.Constant(I64, 0), counter)
    b.call(p.module.get_global(SYMBOL), [job, counter, ir.Constant(I32, 0)])
    b.ret(b.load_atomic(counter, "seq_cst", 8, typ=I64))


def pool_ir() -> str:
    """The pool module's LLVM IR (for dumps and tests)."""
    p = _Builder()
    _parallel(p)
    _controls(p, _worker(p))
    _wake(p)
    return str(p.module)


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
