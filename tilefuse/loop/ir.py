"""The loop IR: immutable expression and statement nodes for one kernel.

Expressions are one frozen node type, :class:`Expr` (``op``, ``type``, ``args``, ``arg``), in the
style of tinygrad's UOp: ``arg`` holds the non-expression payload (a constant's value, a
variable's, buffer's or local's name). Op categories are frozensets next to :class:`XOp`.

Semantics, written once (the interpreter and the code generator both follow them):

* Buffers are flat, element-indexed arrays. ``load(B, i, lanes)`` reads elements
  ``i .. i+lanes-1`` (contiguous, unaligned unless ``B`` was declared aligned); a store writes
  ``lanes(value)`` elements starting at ``index``. Indices are ``i64`` scalars.
* Binary ops need operands of one type (no implicit broadcast: use :func:`broadcast`).
  ``div`` is true division (floats only); ``floordiv``/``mod`` follow Python (ints only; a zero
  divisor gives 0). Integer arithmetic wraps. ``min``/``max`` propagate NaN like NumPy.
* Casts float→int truncate toward zero and saturate, NaN gives 0; anything→bool is ``x != 0``.
* ``reduce_*`` fold a vector's lanes in a fixed tree order (halves, pairwise), giving a scalar.
* Names (buffers, scalars, loop variables, lets, locals) are unique within a function.

Statements: :class:`For` (serial, parallel, vectorized, unrolled), :class:`Store`,
:class:`Local` / :class:`LocalStore`, :class:`Let`, :class:`If`, :class:`Block`, and
:class:`Prefetch` (a cache hint with no effect on results). A ``Let`` or
``Local`` is visible in the rest of its block. Loop bounds are evaluated once, on entry; the loop
variable takes ``start, start+step, ...`` while it is below ``stop`` (for every kind).

Loop kinds:

* ``serial``: a plain loop.
* ``parallel``: iterations split into one static chunk per OpenMP thread. The body must not use a
  ``Local`` declared outside the loop (it would be shared) and must not contain another parallel
  loop.
* ``vectorized``: the lowering has already widened the body to ``step`` lanes; the loop variable
  is the index of lane 0. It runs like a serial loop (the code generator does not widen it again).
  The lowering chooses ``stop`` so that every lane is in range and emits the tail separately
  (a scalar remainder loop or an ``If``).
* ``unrolled``: constant bounds; the code generator emits one copy of the body per iteration.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

from tilefuse.dtypes import DType


class XOp(enum.Enum):
    """An expression op. The value is the name of its method in the scalar-op protocol."""

    CONST = "const"
    VAR = "var"
    THREAD_ID = "thread_id"
    IOTA = "iota"
    LOAD = "load"
    LOCAL_LOAD = "local_load"
    BROADCAST = "broadcast"
    CAST = "cast"
    SELECT = "select"
    FMA = "fma"
    # binary
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MOD = "mod"
    FLOORDIV = "floordiv"
    MIN = "min"
    MAX = "max"
    POW = "pow"
    AND = "and_"
    OR = "or_"
    XOR = "xor"
    # unary
    NEG = "neg"
    NOT = "not_"
    ABS = "abs"
    ISNAN = "isnan"
    # comparisons
    LT = "lt"
    LE = "le"
    EQ = "eq"
    NE = "ne"
    GT = "gt"
    GE = "ge"
    # math (floats only)
    EXP = "exp"
    LOG = "log"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    # horizontal reductions: vector -> scalar
    REDUCE_ADD = "reduce_add"
    REDUCE_MAX = "reduce_max"
    REDUCE_MIN = "reduce_min"

    def __str__(self) -> str:
        return self.value.rstrip("_")


BINARY = frozenset({XOp.ADD, XOp.SUB, XOp.MUL, XOp.DIV, XOp.MOD, XOp.FLOORDIV, XOp.MIN, XOp.MAX,
                    XOp.POW, XOp.AND, XOp.OR, XOp.XOR})
UNARY = frozenset({XOp.NEG, XOp.NOT, XOp.ABS, XOp.ISNAN})
COMPARE = frozenset({XOp.LT, XOp.LE, XOp.EQ, XOp.NE, XOp.GT, XOp.GE})
UNARY_MATH = frozenset({XOp.EXP, XOp.LOG, XOp.LOG1P, XOp.EXPM1, XOp.SQRT, XOp.RSQRT, XOp.TANH,
                        XOp.SIGMOID, XOp.ERF, XOp.SIN, XOp.COS, XOp.FLOOR, XOp.CEIL, XOp.ROUND})
REDUCE = frozenset({XOp.REDUCE_ADD, XOp.REDUCE_MAX, XOp.REDUCE_MIN})
MEMORY = frozenset({XOp.LOAD, XOp.LOCAL_LOAD})
LEAF = frozenset({XOp.CONST, XOp.VAR, XOp.THREAD_ID, XOp.IOTA})
#: ops computed by the scalar-op protocol (all but variables, thread ids, lane indices and
#: memory accesses)
VALUE_OPS = frozenset(XOp) - MEMORY - {XOp.VAR, XOp.THREAD_ID, XOp.IOTA}
FLOAT_ONLY = UNARY_MATH | {XOp.DIV, XOp.POW, XOp.ISNAN}
INT_ONLY = frozenset({XOp.MOD, XOp.FLOORDIV})
LOGICAL = frozenset({XOp.AND, XOp.OR, XOp.XOR, XOp.NOT})  # ints (bitwise) and bools
_ARITH = frozenset({XOp.ADD, XOp.SUB, XOp.MUL, XOp.MIN, XOp.MAX, XOp.NEG, XOp.ABS, XOp.FMA})
NUMERIC_ONLY = _ARITH | REDUCE | FLOAT_ONLY | INT_ONLY  # rejected on bools


@dataclass(frozen=True)
class LType:
    """A scalar (``lanes == 1``) or vector type of ``lanes`` elements of ``dtype``."""

    dtype: DType
    lanes: int = 1

    def __str__(self) -> str:
        return str(self.dtype) if self.lanes == 1 else f"{self.dtype}x{self.lanes}"

    @property
    def scalar(self) -> LType:
        return LType(self.dtype)

    def with_lanes(self, lanes: int) -> LType:
        return LType(self.dtype, lanes)


I64 = LType(DType.i64)
BOOL = LType(DType.bool)

@dataclass(frozen=True)
class Expr:
    """An expression node. Build them with the functions below rather than directly."""

    op: XOp
    type: LType
    args: tuple[Expr, ...] = ()
    arg: object = None

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def lanes(self) -> int:
        return self.type.lanes

    def __str__(self) -> str:
        from tilefuse.loop.printer import format_expr

        return format_expr(self)

    # Python operators: arithmetic only (== stays structural equality). Plain numbers become
    # constants of this expression's type.
    def __add__(self, other: Expr | int | float) -> Expr:
        return binary(XOp.ADD, self, other)

    def __radd__(self, other: int | float) -> Expr:
        return binary(XOp.ADD, other, self)

    def __sub__(self, other: Expr | int | float) -> Expr:
        return binary(XOp.SUB, self, other)

    def __rsub__(self, other: int | float) -> Expr:
        return binary(XOp.SUB, other, self)

    def __mul__(self, other: Expr | int | float) -> Expr:
        return binary(XOp.MUL, self, other)

    def __rmul__(self, other: int | float) -> Expr:
        return binary(XOp.MUL, other, self)

    def __truediv__(self, other: Expr | int | float) -> Expr:
        return binary(XOp.DIV, self, other)

    def __floordiv__(self, other: Expr | int) -> Expr:
        return binary(XOp.FLOORDIV, self, other)

    def __mod__(self, other: Expr | int) -> Expr:
        return binary(XOp.MOD, self, other)

    def __neg__(self) -> Expr:
        return Expr(XOp.NEG, self.type, (self,))


# ----------------------------------------------------------------------------- constructors


def const(value: int | float | bool, dtype: DType = DType.i64, lanes: int = 1) -> Expr:
    """A constant; with ``lanes > 1`` every lane holds ``value``."""
    if dtype.is_bool:
        value = bool(value)
    elif dtype.is_int:
        value = int(value)
    else:
        value = float(value)
    return Expr(XOp.CONST, LType(dtype, lanes), (), value)


def var(name: str, type: LType = I64) -> Expr:
    """A loop variable, scalar parameter (both ``i64``) or let-bound value."""
    return Expr(XOp.VAR, type, (), name)


def iota(lanes: int, dtype: DType = DType.i32) -> Expr:
    """The lane indices ``[0, 1, ..., lanes - 1]`` as an integer vector (printed
    ``iota<i32x16>``): an arg-reduction's exact element index is ``bcast(i) + iota``."""
    return Expr(XOp.IOTA, LType(dtype, lanes))


def thread_id() -> Expr:
    """The OpenMP thread number inside a parallel loop, 0 elsewhere (``i64``). The interpreter
    runs parallel loops serially, so there it is always 0."""
    return Expr(XOp.THREAD_ID, I64)


def as_expr(value: Expr | int | float | bool, like: LType = I64) -> Expr:
    """``value`` itself if it is an Expr, else a constant of type ``like``."""
    if isinstance(value, Expr):
        return value
    return const(value, like.dtype, like.lanes)


def load(buffer: BufferParam | str, index: Expr | int, lanes: int = 1,
         dtype: DType | None = None) -> Expr:
    """A contiguous load of ``lanes`` elements of ``buffer`` starting at ``index``."""
    if isinstance(buffer, BufferParam):
        name, dtype = buffer.name, buffer.dtype
    else:
        name = buffer
    if dtype is None:
        raise TypeError("load from a buffer name needs its dtype")
    return Expr(XOp.LOAD, LType(dtype, lanes), (as_expr(index),), name)


def local_load(local: Local, index: Expr | int = 0) -> Expr:
    """Element ``index`` of a local array (a value of the local's type)."""
    return Expr(XOp.LOCAL_LOAD, local.type, (as_expr(index),), local.name)


def broadcast(x: Expr | int | float, lanes: int, dtype: DType | None = None) -> Expr:
    """A vector of ``lanes`` copies of the scalar ``x``."""
    if not isinstance(x, Expr):
        x = const(x, dtype or (DType.i64 if isinstance(x, int) else DType.f32))
    return Expr(XOp.BROADCAST, x.type.with_lanes(lanes), (x,))


def cast(x: Expr, dtype: DType) -> Expr:
    return Expr(XOp.CAST, LType(dtype, x.lanes), (x,))


def _pair(a: Expr | int | float, b: Expr | int | float) -> tuple[Expr, Expr]:
    if isinstance(a, Expr):
        return a, as_expr(b, a.type)
    if isinstance(b, Expr):
        return as_expr(a, b.type), b
    return as_expr(a), as_expr(b)


def binary(op: XOp, a: Expr | int | float, b: Expr | int | float) -> Expr:
    """A binary op (see :data:`BINARY`) or comparison (:data:`COMPARE`)."""
    a, b = _pair(a, b)
    if op in COMPARE:
        return Expr(op, BOOL.with_lanes(a.lanes), (a, b))
    return Expr(op, a.type, (a, b))


def unary(op: XOp, x: Expr) -> Expr:
    """A unary op (:data:`UNARY`) or math function (:data:`UNARY_MATH`)."""
    result = BOOL.with_lanes(x.lanes) if op is XOp.ISNAN else x.type
    return Expr(op, result, (x,))


def fma(a: Expr, b: Expr, c: Expr) -> Expr:
    """``a * b + c`` with a single rounding (floats)."""
    return Expr(XOp.FMA, a.type, (a, b, c))


def select(cond: Expr, a: Expr | int | float, b: Expr | int | float) -> Expr:
    """Lane-wise ``a if cond else b``; both sides are evaluated."""
    a, b = _pair(a, b)
    return Expr(XOp.SELECT, a.type, (cond, a, b))


def reduce(op: XOp, x: Expr) -> Expr:
    """A horizontal reduction (:data:`REDUCE`) of a vector to a scalar."""
    return Expr(op, x.type.scalar, (x,))


def minimum(a: Expr | int | float, b: Expr | int | float) -> Expr:
    return binary(XOp.MIN, a, b)


def maximum(a: Expr | int | float, b: Expr | int | float) -> Expr:
    return binary(XOp.MAX, a, b)


# ----------------------------------------------------------------------------- statements


class LoopKind(enum.Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class BufferParam:
    """A kernel argument array. ``align`` (bytes, 0 = element alignment) is a promise made by the
    caller that the base address is a multiple of it (checked when a compiled kernel is called)."""

    name: str
    dtype: DType
    readonly: bool = False
    align: int = 0

    def load(self, index: Expr | int, lanes: int = 1) -> Expr:
        return load(self, index, lanes)

    def store(self, index: Expr | int, value: Expr) -> Store:
        return Store(self.name, as_expr(index), value)


@dataclass(frozen=True)
class For:
    var: str
    start: Expr
    stop: Expr
    step: int
    kind: LoopKind
    body: Stmt

    @property
    def index(self) -> Expr:
        """The loop variable as an expression."""
        return var(self.var)


@dataclass(frozen=True)
class Store:
    """``buffer[index:+lanes] = value``. ``streaming``: a non-temporal store (written
    ``stream buffer[...] = ...``), for output that is not read again soon: it goes to memory
    without reading the line first or evicting what the cache holds. Targets without such
    stores (the GPU, the interpreter) store normally."""

    buffer: str
    index: Expr
    value: Expr
    streaming: bool = False


@dataclass(frozen=True)
class Local:
    """A local array of ``count`` elements of ``type`` (registers or stack), uninitialised."""

    name: str
    type: LType
    count: int = 1

    def load(self, index: Expr | int = 0) -> Expr:
        return local_load(self, index)

    def store(self, index: Expr | int, value: Expr) -> LocalStore:
        return LocalStore(self.name, as_expr(index), value)


@dataclass(frozen=True)
class LocalStore:
    name: str
    index: Expr
    value: Expr


@dataclass(frozen=True)
class Let:
    """Binds ``name`` to ``value`` for the rest of the enclosing block."""

    name: str
    value: Expr

    @property
    def ref(self) -> Expr:
        return var(self.name, self.value.type)


@dataclass(frozen=True)
class If:
    cond: Expr
    then: Stmt
    else_: Stmt | None = None


@dataclass(frozen=True)
class Prefetch:
    """A hint that the cache line holding element ``index`` of ``buffer`` will soon be read.
    It changes no value: the interpreter skips it, a GPU kernel drops it, and the CPU code
    generator emits ``llvm.prefetch``, which does not fault (``index`` may be past the end)."""

    buffer: str
    index: Expr
    locality: int = 3
    """``llvm.prefetch``'s locality: 3 into every cache level, 2 into L2 and beyond (x86
    ``prefetcht1``), for a line needed later than the next few hundred cycles."""


@dataclass(frozen=True)
class Block:
    stmts: tuple[Stmt, ...] = ()


Stmt = For | Store | Local | LocalStore | Let | If | Block | Prefetch


@dataclass(frozen=True)
class LoopFunction:
    """A kernel: buffer arguments, ``i64`` scalar arguments, and a body."""

    name: str
    buffers: tuple[BufferParam, ...]
    scalars: tuple[str, ...]
    body: Stmt

    def buffer(self, name: str) -> BufferParam | None:
        for b in self.buffers:
            if b.name == name:
                return b
        return None

    def __str__(self) -> str:
        from tilefuse.loop.printer import format_function

        return format_function(self)


def block(*stmts: Stmt) -> Block:
    """A block of ``stmts``, with nested blocks flattened."""
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Block):
            flat.extend(s.stmts)
        else:
            flat.append(s)
    return Block(tuple(flat))


def loop(name: str, start: Expr | int, stop: Expr | int, body: Stmt | list[Stmt],
         step: int = 1, kind: LoopKind = LoopKind.SERIAL) -> For:
    """A :class:`For`; int bounds become ``i64`` constants, a list body becomes a block."""
    if isinstance(body, list):
        body = block(*body)
    return For(name, as_expr(start), as_expr(stop), step, kind, body)


# ----------------------------------------------------------------------------- traversal


def expr_children(s: Stmt) -> tuple[Expr, ...]:
    """The expressions a statement evaluates itself (not those of nested statements)."""
    if isinstance(s, For):
        return (s.start, s.stop)
    if isinstance(s, (Store, LocalStore)):
        return (s.index, s.value)
    if isinstance(s, Let):
        return (s.value,)
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, Prefetch):
        return (s.index,)
    return ()


def stmt_children(s: Stmt) -> tuple[Stmt, ...]:
    if isinstance(s, For):
        return (s.body,)
    if isinstance(s, If):
        return (s.then,) if s.else_ is None else (s.then, s.else_)
    if isinstance(s, Block):
        return s.stmts
    return ()


def walk_expr(e: Expr) -> Iterator[Expr]:
    """Yields ``e`` and every sub-expression (pre-order; shared nodes once per occurrence)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.args))


def walk_stmts(s: Stmt) -> Iterator[Stmt]:
    """Yields ``s`` and every nested statement (pre-order)."""
    yield s
    for child in stmt_children(s):
        yield from walk_stmts(child)


def free_vars(e: Expr) -> frozenset[str]:
    return frozenset(n.arg for n in walk_expr(e) if n.op is XOp.VAR)  # type: ignore[misc]


def defined_names(s: Stmt) -> set[str]:
    """Names a statement (and its nested statements) define: loop variables, lets, locals."""
    names: set[str] = set()
    for node in walk_stmts(s):
        if isinstance(node, For):
            names.add(node.var)
        elif isinstance(node, (Let, Local)):
            names.add(node.name)
    return names


def all_names(fn: LoopFunction) -> set[str]:
    return {b.name for b in fn.buffers} | set(fn.scalars) | defined_names(fn.body)
