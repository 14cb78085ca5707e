"""The thread pool's LLVM IR (:mod:`tilefuse.codegen.pool` runs it): the fork-join entry
``tilefuse_parallel``, the workers' loop, and the controls, written with llvmlite.ir. Kept apart
from the pool's runtime so that a process which links the pool from an artifact's object code
imports neither llvmlite.ir nor the loop IR."""

from __future__ import annotations

from llvmlite import ir
from llvmlite.ir import instructions

from tilefuse.codegen.llvm_types import I32, I64, PTR, VOID, declare
from tilefuse.codegen.pool import SPIN_CYCLES, SYMBOL, WAKE_CYCLES, YIELD_AFTER

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


def build_pool_ir() -> str:
    """The pool module's LLVM IR."""
    p = _Builder()
    _parallel(p)
    _controls(p, _worker(p))
    _wake(p)
    return str(p.module)
