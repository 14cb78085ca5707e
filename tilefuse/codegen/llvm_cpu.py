"""Loop IR -> LLVM IR for x86-64 CPUs (llvmlite), with the thread pool for parallel loops.

The module holds one exported C-ABI function per kernel::

    void <name>(void **buffers, int64_t *scalars, int32_t num_threads)

It loads the arguments and calls ``<name>.impl``, an internal, always-inlined function whose
buffer parameters are ``noalias`` (and ``align N`` where the kernel declares it), so LLVM may
reorder and vectorise memory accesses freely. ``num_threads`` (0: every thread of the pool) is
passed to every parallel loop.

Lowering choices:

* Values are SSA; loop variables are phis. ``unrolled`` loops are emitted once per iteration with
  the variable bound to a constant. ``vectorized`` loops are plain loops: the body already works
  on vectors (see :mod:`tilefuse.loop.ir`). Tails are the lowering's job, written in the loop IR
  as scalar remainder loops or ``If``\\ s; there are no masked loads.
* Loads and stores use element alignment (NumPy buffers need not be vector aligned).
* ``Local`` arrays are allocas in the function's entry block; with constant indices (unrolled
  loops) SROA turns them into registers.
* A ``parallel`` loop is outlined: its free values and buffers go into a context struct on the
  stack; ``tilefuse_parallel(fn, ctx, num_threads)`` (:mod:`tilefuse.codegen.pool`) runs
  ``fn(ctx, tid, threads)`` on the calling thread and on the pool's workers. Each thread owns
  the contiguous range a static schedule would give it and takes it in grains through an
  atomic counter, then steals the grains other threads have not taken yet, calling the loop
  body function (again with ``noalias`` buffers) per grain: on a busy machine a descheduled
  thread no longer holds up the loop for its whole share, and the pool does not wait for a
  worker that took no grain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from llvmlite import ir

from tilefuse.codegen.llvm_ops import LLVMOps, emit_value_op
from tilefuse.codegen.llvm_types import (
    I8,
    I32,
    I64,
    PTR,
    VOID,
    declare,
    llvm_type,
    scalar_type,
)
from tilefuse.codegen.math_lib import MathLib
from tilefuse.codegen.pool import SYMBOL as POOL_SYMBOL
from tilefuse.codegen.target import CpuTarget
from tilefuse.dtypes import DType
from tilefuse.errors import CompileError, TilefuseError
from tilefuse.loop.ir import (
    Block,
    BufferParam,
    Expr,
    For,
    If,
    Let,
    Local,
    LocalStore,
    LoopFunction,
    LoopKind,
    Prefetch,
    Stmt,
    Store,
    XOp,
    defined_names,
    expr_children,
    walk_expr,
    walk_stmts,
)
from tilefuse.loop.verify import verify

Value = ir.Value


def lower_to_llvm(fn: LoopFunction, target: CpuTarget | None = None) -> ir.Module:
    """The LLVM module for ``fn`` (verified first; CompileError if lowering fails); ``target``
    lets the math library use its instructions (AVX-512's vscalef), else the IR is generic."""
    verify(fn)
    module = ir.Module(name=fn.name)
    try:
        LoopLowering(fn, module, scalef=target is not None and target.has("avx512f")).lower()
    except TilefuseError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, AssertionError) as exc:
        raise CompileError(f"lowering kernel {fn.name} to LLVM failed: {exc}") from exc
    return module


def uses_threads(fn: LoopFunction) -> bool:
    """Whether ``fn`` has a parallel loop (and so calls the thread pool at run time)."""
    return any(isinstance(s, For) and s.kind is LoopKind.PARALLEL for s in walk_stmts(fn.body))


@dataclass
class FnState:
    """Where code is being emitted: one LLVM function and what is in scope there."""

    fn: ir.Function
    b: ir.IRBuilder
    allocas: ir.IRBuilder
    ops: LLVMOps
    buffers: dict[str, tuple[Value, BufferParam]]
    env: dict[str, Value] = field(default_factory=dict)
    locals: dict[str, Value] = field(default_factory=dict)  # typed pointers to arrays
    num_threads: Value | None = None
    thread_id: Value = field(default_factory=lambda: ir.Constant(I64, 0))


class LoopLowering:
    """Loop IR -> one LLVM module: statements and expressions are target-independent; the
    entry point and parallel loops are the CPU's (a subclass retargets them, see
    :mod:`tilefuse.codegen.llvm_nvptx`)."""

    ops_class: type[LLVMOps] = LLVMOps
    """The scalar-op protocol implementation (a target may refine its math)."""
    streaming_stores = True
    """Whether ``Store.streaming`` becomes a non-temporal store (x86); else a plain one."""

    def __init__(self, fn: LoopFunction, module: ir.Module, *, scalef: bool = False):
        self.fn = fn
        self.module = module
        self.math = MathLib(module, scalef=scalef)
        self.outlined = 0

    def lower(self) -> None:
        names = [(s, ir.IntType(64)) for s in self.fn.scalars]
        impl, state = self.define(f"{self.fn.name}.impl", list(self.fn.buffers), names,
                                  with_threads=True)
        self.stmt(state, self.fn.body)
        self.fence(state, self.fn.body)
        state.b.ret_void()
        self.define_entry(impl)

    def define_entry(self, impl: ir.Function) -> None:
        entry = ir.Function(self.module, ir.FunctionType(VOID, [PTR, PTR, I32]), self.fn.name)
        entry.attributes.add("nounwind")
        args_ptr, scalars_ptr, threads = entry.args
        b = ir.IRBuilder(entry.append_basic_block("entry"))
        values: list[Value] = []
        for i in range(len(self.fn.buffers)):
            values.append(b.load(b.gep(args_ptr, [ir.Constant(I64, i)], source_etype=PTR),
                                 typ=PTR))
        for i in range(len(self.fn.scalars)):
            values.append(b.load(b.gep(scalars_ptr, [ir.Constant(I64, i)], source_etype=I64),
                                 typ=I64))
        b.call(impl, [*values, threads])
        b.ret_void()

    def define(self, name: str, buffers: list[BufferParam], values: list[tuple[str, ir.Type]],
               *, with_threads: bool = False) -> tuple[ir.Function, FnState]:
        """An internal function taking ``buffers`` (noalias pointers) and named values."""
        params = [PTR] * len(buffers) + [t for _, t in values] + ([I32] if with_threads else [])
        fn = ir.Function(self.module, ir.FunctionType(VOID, params), name)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        fn.attributes.add("nounwind")
        entry = fn.append_basic_block("entry")
        body = fn.append_basic_block("body")
        allocas = ir.IRBuilder(entry)
        allocas.position_before(allocas.branch(body))
        b = ir.IRBuilder(body)
        state = FnState(fn, b, allocas, self.ops_class(b, self.math), {})
        for arg, buf in zip(fn.args, buffers):
            arg.name = buf.name
            arg.add_attribute("noalias")
            if buf.align:
                arg.attributes.align = buf.align
            state.buffers[buf.name] = (arg, buf)
        for arg, (vname, _) in zip(fn.args[len(buffers):], values):
            arg.name = vname
            state.env[vname] = arg
        if with_threads:
            state.num_threads = fn.args[-1]
        return fn, state

    # ------------------------------------------------------------------ statements
    def stmt(self, st: FnState, s: Stmt) -> None:
        if isinstance(s, Block):
            for child in s.stmts:
                self.stmt(st, child)
        elif isinstance(s, For):
            self.loop(st, s)
        elif isinstance(s, If):
            self.branch(st, s)
        elif isinstance(s, Let):
            st.env[s.name] = self.expr(st, s.value, {})
        elif isinstance(s, Local):
            ty = ir.ArrayType(llvm_type(s.type), s.count)
            st.locals[s.name] = st.allocas.alloca(ty, name=s.name)
        elif isinstance(s, LocalStore):
            st.b.store(self.expr(st, s.value, {}), self.local_ptr(st, s.name, s.index))
        elif isinstance(s, Store):
            self.store(st, s)
        elif isinstance(s, Prefetch):
            self.prefetch(st, s)
        else:
            raise CompileError(f"cannot lower statement {type(s).__name__}")

    def store(self, st: FnState, s: Store) -> None:
        value = self.expr(st, s.value, {})
        ptr, buf = st.buffers[s.buffer]
        if buf.dtype is DType.bool:
            value = st.b.zext(value, llvm_type(s.value.type, memory=True))
        address = self.element_ptr(st, ptr, buf, self.expr(st, s.index, {}))
        width = buf.dtype.itemsize * s.value.lanes
        if s.streaming and self.streaming_stores and width in (16, 32, 64):
            self.streaming_store(st, value, address, width, self.access_align(buf, 1))
            return
        st.b.store(value, address, align=self.access_align(buf, s.value.lanes))

    def streaming_store(self, st: FnState, value: Value, address: Value, width: int,
                        align: int) -> None:
        """A non-temporal store (``vmovntps``) where ``address`` is ``width``-aligned, a plain
        one where it is not (x86 has no unaligned vector non-temporal store): the branch is
        the same all along a row, so it predicts perfectly. :meth:`fence` after the loop
        orders the stores before the kernel returns."""
        b = st.b
        aligned = b.icmp_unsigned("==", b.and_(b.ptrtoint(address, I64),
                                               ir.Constant(I64, width - 1)),
                                  ir.Constant(I64, 0))
        nt_bb = st.fn.append_basic_block("nt.store")
        plain_bb = st.fn.append_basic_block("store")
        merge = st.fn.append_basic_block("stored")
        b.cbranch(aligned, nt_bb, plain_bb)
        b.position_at_end(nt_bb)
        store = b.store(value, address, align=width)
        store.set_metadata("nontemporal", self.module.add_metadata([ir.Constant(I32, 1)]))
        b.branch(merge)
        b.position_at_end(plain_bb)
        b.store(value, address, align=align)
        b.branch(merge)
        b.position_at_end(merge)

    def fence(self, st: FnState, body: Stmt) -> None:
        """``sfence`` when ``body`` made streaming stores: they are weakly ordered, and the
        caller (another thread, the next kernel) must see them once this function returns."""
        if self.streaming_stores and any(isinstance(n, Store) and n.streaming
                                         for n in walk_stmts(body)):
            fn = declare(self.module, "llvm.x86.sse.sfence", VOID, [])
            st.b.call(fn, [])

    def prefetch(self, st: FnState, s: Prefetch) -> None:
        """``llvm.prefetch(address, read, the hint's locality, data cache)``; the address
        is computed without ``inbounds``: a hint may point past the buffer."""
        ptr, buf = st.buffers[s.buffer]
        index = self.expr(st, s.index, {})
        address = st.b.gep(ptr, [index], source_etype=scalar_type(buf.dtype, memory=True))
        fn = st.b.module.declare_intrinsic(
            "llvm.prefetch", [address.type], ir.FunctionType(VOID, [PTR, I32, I32, I32]))
        st.b.call(fn, [address, ir.Constant(I32, 0), ir.Constant(I32, s.locality),
                       ir.Constant(I32, 1)])

    def loop(self, st: FnState, s: For) -> None:
        start, stop = self.expr(st, s.start, {}), self.expr(st, s.stop, {})
        if s.kind is LoopKind.UNROLLED:
            for i in range(s.start.arg, s.stop.arg, s.step):  # type: ignore[call-overload]
                st.env[s.var] = ir.Constant(I64, i)
                self.stmt(st, s.body)
        elif s.kind is LoopKind.PARALLEL:
            self.parallel(st, s, start, stop)
        else:
            self.serial(st, s.var, start, stop, s.step, s.body)

    def serial(self, st: FnState, var: str, start: Value, stop: Value, step: int | Value,
               body: Stmt) -> None:
        """``for var in start..stop step step`` (``step`` a constant or a loop-invariant
        value)."""
        b = st.b
        before = b.block
        head = st.fn.append_basic_block(f"{var}.head")
        body_bb = st.fn.append_basic_block(f"{var}.body")
        done = st.fn.append_basic_block(f"{var}.done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name=var)
        i.add_incoming(start, before)
        b.cbranch(b.icmp_signed("<", i, stop), body_bb, done)
        b.position_at_end(body_bb)
        st.env[var] = i
        self.stmt(st, body)
        stride = ir.Constant(I64, step) if isinstance(step, int) else step
        i.add_incoming(b.add(i, stride), b.block)
        b.branch(head)
        b.position_at_end(done)

    def branch(self, st: FnState, s: If) -> None:
        b = st.b
        cond = self.expr(st, s.cond, {})
        then_bb = st.fn.append_basic_block("then")
        else_bb = st.fn.append_basic_block("else") if s.else_ is not None else None
        merge = st.fn.append_basic_block("endif")
        b.cbranch(cond, then_bb, else_bb or merge)
        for bb, body in ((then_bb, s.then), (else_bb, s.else_)):
            if bb is None or body is None:
                continue
            b.position_at_end(bb)
            self.stmt(st, body)
            b.branch(merge)
        b.position_at_end(merge)

    # ------------------------------------------------------------------ parallel loops
    def parallel(self, st: FnState, s: For, start: Value, stop: Value) -> None:
        """Outlines ``s`` and runs it on the thread pool (``tilefuse_parallel``)."""
        inner = defined_names(s.body) | {s.var}
        free = sorted(free_names(s.body) - inner)
        captured = [(n, st.env[n]) for n in free]
        buffers = [st.buffers[n] for n in sorted(buffer_names(s.body))]
        fields = [PTR] * len(buffers) + [v.type for _, v in captured] + [I64, I64, PTR]
        ctx_type = ir.LiteralStructType(fields)
        name = f"{self.fn.name}.par{self.outlined}"
        self.outlined += 1
        body_fn = self.parallel_body(name, s, [buf for _, buf in buffers], captured)
        worker = self.parallel_worker(name, ctx_type, body_fn, s.step)
        ctx = st.allocas.alloca(ctx_type, name=f"{name}.ctx")
        taken = st.allocas.alloca(TAKEN_TYPE, name=f"{name}.taken")
        st.b.store(ir.Constant(TAKEN_TYPE, None), taken)
        values = [ptr for ptr, _ in buffers] + [v for _, v in captured] + [start, stop, taken]
        for i, v in enumerate(values):
            st.b.store(v, st.b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
        pool = declare(self.module, POOL_SYMBOL, VOID, [PTR, PTR, I32])
        threads = st.num_threads if st.num_threads is not None else ir.Constant(I32, 0)
        st.b.call(pool, [worker, ctx, threads])

    def parallel_body(self, name: str, s: For, buffers: list[BufferParam],
                      captured: list[tuple[str, Value]]) -> ir.Function:
        values = [(n, v.type) for n, v in captured] + [("par.tid", I64), ("par.lo", I64),
                                                        ("par.hi", I64)]
        fn, state = self.define(f"{name}.body", buffers, values)
        state.thread_id, lo, hi = fn.args[-3:]
        self.serial(state, s.var, lo, hi, s.step, s.body)
        self.fence(state, s.body)
        state.b.ret_void()
        return fn

    def parallel_worker(self, name: str, ctx_type: ir.LiteralStructType,
                        body_fn: ir.Function, step: int) -> ir.Function:
        """``void name(ptr ctx, i64 tid, i64 threads)``: runs thread ``tid``'s share of the
        loop, then steals.

        The iterations are split into one contiguous range per thread (at most
        ``len(TAKEN_TYPE)`` ranges), as a static schedule splits them, so a thread keeps the
        same data from call to call. Each range is taken from its front in grains of a
        quarter of it through an atomic counter of the trips taken from it (``ctx.taken``):
        a thread takes its own range first, then what is left of the others'. A thread that
        the OS has descheduled therefore delays the loop by at most the grain it holds,
        instead of its whole share (what a static schedule costs on a busy machine)."""
        fn = ir.Function(self.module, ir.FunctionType(VOID, [PTR, I64, I64]), name)
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        entry = fn.append_basic_block("entry")
        b = ir.IRBuilder(entry)
        ctx, tid, nthreads = fn.args
        fields = [b.load(b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, i)],
                               source_etype=ctx_type), typ=t)
                  for i, t in enumerate(ctx_type.elements)]
        start, stop, taken = fields[-3], fields[-2], fields[-1]
        zero, one, step_c = ir.Constant(I64, 0), ir.Constant(I64, 1), ir.Constant(I64, step)
        span = b.sub(stop, start)
        trips = b.sdiv(b.add(span, ir.Constant(I64, step - 1)), step_c)
        trips = b.select(b.icmp_signed(">", span, zero), trips, zero)
        slots = _smin(b, nthreads, ir.Constant(I64, TAKEN_TYPE.count))
        chunk = b.sdiv(b.sub(b.add(trips, slots), one), slots)
        grain = b.sdiv(b.add(chunk, ir.Constant(I64, 3)), ir.Constant(I64, 4))
        grain = b.select(b.icmp_signed(">", grain, zero), grain, one)
        first_slot = b.srem(tid, slots)
        # for visit in 0..slots: range (first_slot + visit) % slots, grain by grain
        visit_head = fn.append_basic_block("visit")
        grab = fn.append_basic_block("grab")
        run = fn.append_basic_block("run")
        next_visit = fn.append_basic_block("next_visit")
        done = fn.append_basic_block("done")
        b.branch(visit_head)
        b.position_at_end(visit_head)
        visit = b.phi(I64, "visit")
        visit.add_incoming(zero, entry)
        b.cbranch(b.icmp_signed("<", visit, slots), grab, done)
        b.position_at_end(grab)
        slot = b.srem(b.add(first_slot, visit), slots)
        own_lo = b.mul(slot, chunk)
        own_hi = _smin(b, b.add(own_lo, chunk), trips)
        counter = b.gep(taken, [ir.Constant(I32, 0), b.trunc(slot, I32)], source_etype=TAKEN_TYPE)
        got = b.atomic_rmw("add", counter, grain, "monotonic")
        lo = b.add(own_lo, got)
        b.cbranch(b.icmp_signed("<", lo, own_hi), run, next_visit)
        b.position_at_end(run)
        hi = _smin(b, b.add(lo, grain), own_hi)
        b.call(body_fn, [*fields[:-3], tid, b.add(start, b.mul(lo, step_c)),
                         b.add(start, b.mul(hi, step_c))])
        b.branch(grab)
        b.position_at_end(next_visit)
        after = b.add(visit, one)
        visit.add_incoming(after, next_visit)
        b.branch(visit_head)
        b.position_at_end(done)
        b.ret_void()
        return fn

    # ------------------------------------------------------------------ expressions
    def expr(self, st: FnState, e: Expr, memo: dict[int, Value]) -> Value:
        """The value of ``e``; ``memo`` shares repeated sub-trees within one statement."""
        found = memo.get(id(e))
        if found is not None:
            return found
        if e.op is XOp.VAR:
            value = st.env[e.arg]  # type: ignore[index]
        elif e.op is XOp.THREAD_ID:
            value = st.thread_id
        elif e.op is XOp.IOTA:
            element = llvm_type(e.type.scalar)
            value = ir.Constant(llvm_type(e.type), [ir.Constant(element, k)
                                                    for k in range(e.lanes)])
        elif e.op is XOp.LOAD:
            value = self.load(st, e, self.expr(st, e.args[0], memo))
        elif e.op is XOp.LOCAL_LOAD:
            ptr = self.local_ptr(st, e.arg, e.args[0], memo)  # type: ignore[arg-type]
            value = st.b.load(ptr, typ=llvm_type(e.type))
        else:
            args = [self.expr(st, a, memo) for a in e.args]
            value = emit_value_op(st.ops, e, args)
        memo[id(e)] = value
        return value

    def load(self, st: FnState, e: Expr, index: Value) -> Value:
        ptr, buf = st.buffers[e.arg]  # type: ignore[index]
        address = self.element_ptr(st, ptr, buf, index)
        value = st.b.load(address, typ=llvm_type(e.type, memory=True),
                          align=self.access_align(buf, e.lanes))
        if buf.dtype is DType.bool:
            value = st.b.icmp_unsigned("!=", value, _zero_bytes(e.lanes))
        return value

    def access_align(self, buf: BufferParam, lanes: int) -> int:
        """The alignment a ``lanes``-wide access of ``buf`` may assume: one element on the CPU
        (NumPy buffers need not be vector aligned)."""
        return buf.dtype.itemsize

    def element_ptr(self, st: FnState, ptr: Value, buf: BufferParam, index: Value) -> Value:
        return st.b.gep(ptr, [index], inbounds=True,
                        source_etype=scalar_type(buf.dtype, memory=True))

    def local_ptr(self, st: FnState, name: str, index: Expr,
                  memo: dict[int, Value] | None = None) -> Value:
        alloca = st.locals[name]
        i = self.expr(st, index, memo if memo is not None else {})
        return st.b.gep(alloca, [ir.Constant(I64, 0), i], inbounds=True)  # typed: no etype


#: one counter of trips taken per thread's range (threads beyond this many only steal)
TAKEN_TYPE = ir.ArrayType(I64, 64)


def _smin(b: ir.IRBuilder, x: Value, y: Value) -> Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


def _zero_bytes(lanes: int) -> ir.Constant:
    zero = ir.Constant(I8, 0)
    return zero if lanes == 1 else ir.Constant(ir.VectorType(I8, lanes), [zero] * lanes)


def free_names(s: Stmt) -> set[str]:
    names: set[str] = set()
    for node in walk_stmts(s):
        for e in expr_children(node):
            names.update(n.arg for n in walk_expr(e) if n.op is XOp.VAR)  # type: ignore[misc]
    return names


def buffer_names(s: Stmt) -> set[str]:
    names: set[str] = set()
    for node in walk_stmts(s):
        if isinstance(node, (Store, Prefetch)):
            names.add(node.buffer)
        for e in expr_children(node):
            names.update(n.arg for n in walk_expr(e) if n.op is XOp.LOAD)  # type: ignore[misc]
    return names
