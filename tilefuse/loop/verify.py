"""The loop-IR verifier: names, scopes, types and lanes, readonly buffers, loop kinds.

:func:`verify` raises a :class:`~tilefuse.errors.VerifyError` naming the offending statement; it
returns nothing for a well-formed function. The code generator and the interpreter call it first,
so neither has to defend against malformed IR.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tilefuse.dtypes import DType
from tilefuse.errors import VerifyError
from tilefuse.loop.ir import (
    BINARY,
    BOOL,
    COMPARE,
    FLOAT_ONLY,
    I64,
    INT_ONLY,
    LOGICAL,
    NUMERIC_ONLY,
    REDUCE,
    UNARY,
    UNARY_MATH,
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
    LType,
    Prefetch,
    Stmt,
    Store,
    XOp,
    walk_stmts,
)
from tilefuse.loop.printer import format_stmt

#: the most iterations an ``unrolled`` loop may have (each becomes a copy of the body)
MAX_UNROLL = 1024


@dataclass
class _Scope:
    """What is visible at one point: value names with types, and locals with the parallel depth
    at which they were declared."""

    values: dict[str, LType]
    locals: dict[str, tuple[Local, int]] = field(default_factory=dict)
    parallel_depth: int = 0

    def child(self, *, parallel: bool = False) -> _Scope:
        return _Scope(dict(self.values), dict(self.locals),
                      self.parallel_depth + (1 if parallel else 0))


def verify(fn: LoopFunction) -> None:
    """Raises VerifyError if ``fn`` breaks an invariant of the loop IR."""
    if not fn.name.isidentifier():
        raise VerifyError(f"kernel name {fn.name!r} is not an identifier")
    _check_names(fn)
    for b in fn.buffers:
        _check_buffer(b)
    buffers = {b.name: b for b in fn.buffers}
    scope = _Scope({name: I64 for name in fn.scalars})
    _Checker(buffers).stmt(fn.body, scope)


def _check_names(fn: LoopFunction) -> None:
    names = [b.name for b in fn.buffers] + list(fn.scalars)
    for node in walk_stmts(fn.body):
        if isinstance(node, For):
            names.append(node.var)
        elif isinstance(node, (Let, Local)):
            names.append(node.name)
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise VerifyError(f"name {name!r} is not an identifier")
    dupes = sorted(n for n, c in Counter(names).items() if c > 1)
    if dupes:
        raise VerifyError(f"names defined more than once: {', '.join(dupes)}")


def _check_buffer(b: BufferParam) -> None:
    if not isinstance(b.dtype, DType):
        raise VerifyError(f"buffer {b.name}: dtype {b.dtype!r} is not a DType")
    if b.align and (b.align & (b.align - 1) or b.align < b.dtype.itemsize):
        raise VerifyError(f"buffer {b.name}: align {b.align} must be a power of two "
                          f">= the element size {b.dtype.itemsize}")


class _Checker:
    def __init__(self, buffers: dict[str, BufferParam]):
        self.buffers = buffers

    def fail(self, s: Stmt, message: str) -> VerifyError:
        try:
            where = format_stmt(s)[0].strip()
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            where = f"a malformed {type(s).__name__}"  # the printer expects well-formed IR
        return VerifyError(f"{message} (in `{where}`)")

    def stmt(self, s: Stmt, scope: _Scope) -> None:
        if isinstance(s, Block):
            inner = scope.child()
            for child in s.stmts:
                self.stmt(child, inner)
        elif isinstance(s, For):
            self.loop(s, scope)
        elif isinstance(s, If):
            self.index_like(s, s.cond, scope, BOOL, "if condition")
            self.stmt(s.then, scope.child())
            if s.else_ is not None:
                self.stmt(s.else_, scope.child())
        elif isinstance(s, Let):
            self.expr(s, s.value, scope)
            scope.values[s.name] = s.value.type
        elif isinstance(s, Local):
            if s.count < 1 or s.type.lanes < 1:
                raise self.fail(s, "a local needs count >= 1 and lanes >= 1")
            scope.locals[s.name] = (s, scope.parallel_depth)
        elif isinstance(s, LocalStore):
            local = self.local(s, s.name, s.index, scope)
            self.expr(s, s.value, scope)
            if s.value.type != local.type:
                raise self.fail(s, f"stores {s.value.type} into local {s.name} of {local.type}")
        elif isinstance(s, Store):
            self.store(s, scope)
        elif isinstance(s, Prefetch):
            if s.buffer not in self.buffers:
                raise self.fail(s, f"prefetch of unknown buffer {s.buffer}")
            if s.locality not in (0, 1, 2, 3):
                raise self.fail(s, f"prefetch locality {s.locality} is not in 0..3")
            self.index_like(s, s.index, scope, I64, "prefetch index")
        else:
            raise VerifyError(f"not a loop-IR statement: {type(s).__name__}")

    def loop(self, s: For, scope: _Scope) -> None:
        self.index_like(s, s.start, scope, I64, "loop start")
        self.index_like(s, s.stop, scope, I64, "loop stop")
        if not isinstance(s.step, int) or s.step < 1:
            raise self.fail(s, f"loop step must be a positive int, got {s.step!r}")
        parallel = s.kind is LoopKind.PARALLEL
        if parallel and scope.parallel_depth:
            raise self.fail(s, "nested parallel loops are not supported")
        if s.kind is LoopKind.VECTORIZED and s.step < 2:
            raise self.fail(s, "a vectorized loop steps by its vector width (> 1)")
        if s.kind is LoopKind.UNROLLED:
            if s.start.op is not XOp.CONST or s.stop.op is not XOp.CONST:
                raise self.fail(s, "an unrolled loop needs constant bounds")
            trips = max(0, -(-(s.stop.arg - s.start.arg) // s.step))  # type: ignore[operator]
            if trips > MAX_UNROLL:
                raise self.fail(s, f"unrolled loop has {trips} iterations (max {MAX_UNROLL})")
        inner = scope.child(parallel=parallel)
        inner.values[s.var] = I64
        self.stmt(s.body, inner)

    def store(self, s: Store, scope: _Scope) -> None:
        buf = self.buffers.get(s.buffer)
        if buf is None:
            raise self.fail(s, f"store to unknown buffer {s.buffer}")
        if buf.readonly:
            raise self.fail(s, f"store to readonly buffer {s.buffer}")
        self.index_like(s, s.index, scope, I64, "store index")
        self.expr(s, s.value, scope)
        if s.value.dtype is not buf.dtype:
            raise self.fail(s, f"stores {s.value.type} into {buf.dtype} buffer {s.buffer}")

    def local(self, s: Stmt, name: str, index: Expr, scope: _Scope) -> Local:
        found = scope.locals.get(name)
        if found is None:
            raise self.fail(s, f"local {name} used outside its scope or before it is declared")
        local, depth = found
        if depth < scope.parallel_depth:
            raise self.fail(s, f"local {name} is declared outside the parallel loop that uses it")
        self.index_like(s, index, scope, I64, f"index of local {name}")
        if index.op is XOp.CONST and not 0 <= index.arg < local.count:  # type: ignore[operator]
            raise self.fail(s, f"index {index.arg} out of range for local {name}[{local.count}]")
        return local

    def index_like(self, s: Stmt, e: Expr, scope: _Scope, want: LType, what: str) -> None:
        self.expr(s, e, scope)
        if e.type != want:
            raise self.fail(s, f"{what} must be {want}, got {e.type}")

    def expr(self, s: Stmt, e: Expr, scope: _Scope) -> None:
        if not isinstance(e, Expr) or not isinstance(e.op, XOp):
            raise self.fail(s, f"not an expression: {e!r}")
        if not isinstance(e.type, LType) or not isinstance(e.type.dtype, DType) \
                or e.type.lanes < 1:
            raise self.fail(s, f"{e.op}: bad type {e.type!r}")
        if len(e.args) != arity(e.op):
            raise self.fail(s, f"{e.op}: takes {arity(e.op)} operands, got {len(e.args)}")
        for arg in e.args:
            self.expr(s, arg, scope)
        problem = self.expr_problem(s, e, scope)
        if problem:
            raise self.fail(s, f"{e.op}: {problem}")

    def expr_problem(self, s: Stmt, e: Expr, scope: _Scope) -> str | None:
        """What is wrong with ``e`` itself (its arguments are already checked), or None."""
        op, t, args = e.op, e.type, e.args
        if op is XOp.CONST:
            return _const_problem(e)
        if op is XOp.VAR:
            have = scope.values.get(e.arg)  # type: ignore[arg-type]
            if have is None:
                return f"{e.arg} is used before it is defined or outside its scope"
            return None if have == t else f"{e.arg} is {have}, used as {t}"
        if op is XOp.THREAD_ID:
            return None if t == I64 else f"is {t}, not i64"
        if op is XOp.IOTA:
            return None if t.dtype.is_int and t.dtype is not DType.bool else \
                f"lane indices of {t}, not of an integer type"
        if op is XOp.LOAD:
            buf = self.buffers.get(e.arg)  # type: ignore[arg-type]
            if buf is None:
                return f"unknown buffer {e.arg}"
            if buf.dtype is not t.dtype:
                return f"loads {t} from {buf.dtype} buffer {e.arg}"
            return None if args[0].type == I64 else "index must be i64"
        if op is XOp.LOCAL_LOAD:
            local = self.local(s, e.arg, args[0], scope)  # type: ignore[arg-type]
            return None if local.type == t else f"local {e.arg} is {local.type}, read as {t}"
        return _value_op_problem(e)


def arity(op: XOp) -> int:
    """How many expression operands ``op`` takes."""
    if op in (XOp.CONST, XOp.VAR, XOp.THREAD_ID, XOp.IOTA):
        return 0
    if op in BINARY or op in COMPARE:
        return 2
    return 3 if op in (XOp.SELECT, XOp.FMA) else 1


def _const_problem(e: Expr) -> str | None:
    value, dtype = e.arg, e.dtype
    if dtype.is_bool:
        return None if isinstance(value, bool) else f"bool constant {value!r}"
    if dtype.is_int:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"integer constant {value!r}"
        info = dtype.np
        lo, hi = (0, 255) if dtype is DType.u8 else (-(2 ** (8 * info.itemsize - 1)),
                                                    2 ** (8 * info.itemsize - 1) - 1)
        return None if lo <= value <= hi else f"{value} does not fit {dtype}"
    return None if isinstance(value, float) else f"float constant {value!r}"


def _value_op_problem(e: Expr) -> str | None:
    op, t, args = e.op, e.type, e.args
    dtype = args[0].dtype if args else t.dtype
    if op in FLOAT_ONLY and not dtype.is_float:
        return f"needs a float type, got {dtype}"
    if op in INT_ONLY and not dtype.is_int:
        return f"needs an integer type, got {dtype}"
    if op in LOGICAL and dtype.is_float:
        return f"needs an integer or bool type, got {dtype}"
    if op in NUMERIC_ONLY and dtype.is_bool:
        return "not defined on bool"
    if op is XOp.BROADCAST:
        if args[0].lanes != 1 or args[0].dtype is not t.dtype:
            return f"broadcasts {args[0].type} to {t}"
        return None
    if op is XOp.CAST:
        return None if args[0].lanes == t.lanes else f"changes lanes {args[0].type} -> {t}"
    if op is XOp.SELECT:
        cond, a, b = args
        if cond.type != BOOL.with_lanes(t.lanes):
            return f"condition is {cond.type}, values are {t}"
        return None if a.type == t and b.type == t else f"branches {a.type}, {b.type} -> {t}"
    if op in REDUCE:
        return None if t == args[0].type.scalar else f"reduces {args[0].type} to {t}"
    if op in COMPARE or op is XOp.ISNAN:
        same = all(a.type == args[0].type for a in args)
        ok = same and t == BOOL.with_lanes(args[0].lanes)
        return None if ok else f"operands {', '.join(str(a.type) for a in args)} -> {t}"
    if op in BINARY or op in UNARY or op in UNARY_MATH or op is XOp.FMA:
        if all(a.type == t for a in args):
            return None
        return f"operands {', '.join(str(a.type) for a in args)} do not match result {t}"
    return f"unknown op {op!r}"
