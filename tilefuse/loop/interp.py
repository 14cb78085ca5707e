"""The loop interpreter: runs a LoopFunction on NumPy arrays, slowly and simply.

It is the oracle for the code generator and for the lowering into loop IR. Every value is a 1-D
NumPy array of ``lanes`` elements. Math functions are computed in float64 (scipy for ``erf``) and
rounded once to the value's type. Parallel loops run serially. Loads and stores are bounds-checked
and reading a local element before it was written is an error, so a wrong index shows up here
rather than as memory corruption in generated code.

Semantics differences from the generated code (within the numerics contract): ``fma`` on f32 is
computed in float64 and rounded (equal to a fused result except in rare double-rounding ties),
on f64 it is not fused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tilefuse.codegen.abi import check_arguments
from tilefuse.codegen.scalar_ops import apply_op, reduction_identity
from tilefuse.dtypes import DType, from_numpy
from tilefuse.errors import VerifyError
from tilefuse.loop.ir import (
    Block,
    Expr,
    For,
    If,
    Let,
    Local,
    LocalStore,
    LoopFunction,
    LType,
    Prefetch,
    Stmt,
    Store,
    XOp,
)
from tilefuse.loop.verify import verify
from tilefuse.special import erf, expit

Array = np.ndarray


def _int_range(dtype: DType) -> tuple[int, int]:
    info = np.iinfo(dtype.np)
    return int(info.min), int(info.max)


def tree_reduce(x: Array, op: XOp, combine: Callable[[Array, Array], Array]) -> Array:
    """Pads ``x`` to a power of two with ``op``'s identity, then folds halves: the order the
    code generator uses too."""
    width = 1 << (len(x) - 1).bit_length()
    pad = np.full(width - len(x), reduction_identity(op, from_numpy(x.dtype)), x.dtype)
    x = np.concatenate([x, pad])
    while len(x) > 1:
        half = len(x) // 2
        x = combine(x[:half], x[half:])
    return x


class NumpyOps:
    """The scalar-op protocol over NumPy arrays of shape ``(lanes,)``."""

    def const(self, t: LType, value: int | float | bool) -> Array:
        return np.full(t.lanes, value, dtype=t.dtype.np)

    def broadcast(self, t: LType, x: Array, lanes: int) -> Array:
        return np.repeat(x, lanes)

    def cast(self, t: LType, x: Array, to: LType) -> Array:
        dst = to.dtype
        if dst.is_bool:
            return x != 0
        if dst.is_int and t.dtype.is_float:
            return _saturating_float_to_int(x, dst)
        if dst is DType.bf16 and t.dtype is DType.f64:
            x = x.astype(np.float32)  # the generated code goes through f32 too
        return x.astype(dst.np)

    def select(self, t: LType, cond: Array, a: Array, b: Array) -> Array:
        return np.where(cond, a, b)

    def fma(self, t: LType, a: Array, b: Array, c: Array) -> Array:
        if t.dtype.is_float:
            wide = a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)
            return wide.astype(t.dtype.np)
        return a * b + c

    def add(self, t: LType, a: Array, b: Array) -> Array:
        return a + b

    def sub(self, t: LType, a: Array, b: Array) -> Array:
        return a - b

    def mul(self, t: LType, a: Array, b: Array) -> Array:
        return a * b

    def div(self, t: LType, a: Array, b: Array) -> Array:
        return a / b

    def mod(self, t: LType, a: Array, b: Array) -> Array:
        return np.mod(a, b)

    def floordiv(self, t: LType, a: Array, b: Array) -> Array:
        return np.floor_divide(a, b)

    def min(self, t: LType, a: Array, b: Array) -> Array:
        return np.minimum(a, b)

    def max(self, t: LType, a: Array, b: Array) -> Array:
        return np.maximum(a, b)

    def pow(self, t: LType, a: Array, b: Array) -> Array:
        return np.power(a.astype(np.float64), b.astype(np.float64)).astype(t.dtype.np)

    def and_(self, t: LType, a: Array, b: Array) -> Array:
        return a & b

    def or_(self, t: LType, a: Array, b: Array) -> Array:
        return a | b

    def xor(self, t: LType, a: Array, b: Array) -> Array:
        return a ^ b

    def neg(self, t: LType, x: Array) -> Array:
        return -x

    def not_(self, t: LType, x: Array) -> Array:
        return ~x

    def abs(self, t: LType, x: Array) -> Array:
        return np.abs(x)

    def isnan(self, t: LType, x: Array) -> Array:
        return np.isnan(x)

    def lt(self, t: LType, a: Array, b: Array) -> Array:
        return a < b

    def le(self, t: LType, a: Array, b: Array) -> Array:
        return a <= b

    def eq(self, t: LType, a: Array, b: Array) -> Array:
        return a == b

    def ne(self, t: LType, a: Array, b: Array) -> Array:
        return a != b

    def gt(self, t: LType, a: Array, b: Array) -> Array:
        return a > b

    def ge(self, t: LType, a: Array, b: Array) -> Array:
        return a >= b

    def _math(self, x: Array, f: Callable[[Array], Array]) -> Array:
        return f(x.astype(np.float64)).astype(x.dtype)

    def exp(self, t: LType, x: Array) -> Array:
        return self._math(x, np.exp)

    def log(self, t: LType, x: Array) -> Array:
        return self._math(x, np.log)

    def log1p(self, t: LType, x: Array) -> Array:
        return self._math(x, np.log1p)

    def expm1(self, t: LType, x: Array) -> Array:
        return self._math(x, np.expm1)

    def sqrt(self, t: LType, x: Array) -> Array:
        return self._math(x, np.sqrt)

    def rsqrt(self, t: LType, x: Array) -> Array:
        return self._math(x, lambda v: 1.0 / np.sqrt(v))

    def tanh(self, t: LType, x: Array) -> Array:
        return self._math(x, np.tanh)

    def sigmoid(self, t: LType, x: Array) -> Array:
        return self._math(x, expit)

    def erf(self, t: LType, x: Array) -> Array:
        return self._math(x, erf)

    def sin(self, t: LType, x: Array) -> Array:
        return self._math(x, np.sin)

    def cos(self, t: LType, x: Array) -> Array:
        return self._math(x, np.cos)

    def floor(self, t: LType, x: Array) -> Array:
        return np.floor(x)

    def ceil(self, t: LType, x: Array) -> Array:
        return np.ceil(x)

    def round(self, t: LType, x: Array) -> Array:
        return np.rint(x)

    def reduce_add(self, t: LType, x: Array) -> Array:
        return tree_reduce(x, XOp.REDUCE_ADD, np.add)

    def reduce_max(self, t: LType, x: Array) -> Array:
        return tree_reduce(x, XOp.REDUCE_MAX, np.maximum)

    def reduce_min(self, t: LType, x: Array) -> Array:
        return tree_reduce(x, XOp.REDUCE_MIN, np.minimum)


def _saturating_float_to_int(x: Array, dst: DType) -> Array:
    lo, hi = _int_range(dst)
    r = np.trunc(x.astype(np.float64))
    big, small = r >= float(hi + 1), r < float(lo)
    out = np.where(big | small | np.isnan(r), 0, r).astype(dst.np)
    out[big] = hi
    out[small] = lo
    return out


def interpret(fn: LoopFunction, *args: object, check: bool = True) -> None:
    """Runs ``fn`` on ``args`` (arrays, then scalars), writing results into the arrays."""
    if check:
        verify(fn)
    arrays, values = check_arguments(fn.name, fn.buffers, fn.scalars, args)
    machine = _Machine(fn, arrays, values)
    with np.errstate(all="ignore"):
        machine.run(fn.body)


class _Machine:
    def __init__(self, fn: LoopFunction, arrays: list[Array], values: list[int]):
        self.ops = NumpyOps()
        self.buffers = {b.name: a.reshape(-1) for b, a in zip(fn.buffers, arrays)}
        self.env: dict[str, Array] = {s: np.array([v], np.int64) for s, v in
                                      zip(fn.scalars, values)}
        self.locals: dict[str, tuple[Array, Array]] = {}

    def run(self, s: Stmt) -> None:
        if isinstance(s, Block):
            for child in s.stmts:
                self.run(child)
        elif isinstance(s, For):
            start, stop = self.scalar(s.start), self.scalar(s.stop)
            for i in range(start, stop, s.step):
                self.env[s.var] = np.array([i], np.int64)
                self.run(s.body)
        elif isinstance(s, If):
            if self.eval(s.cond, {})[0]:
                self.run(s.then)
            elif s.else_ is not None:
                self.run(s.else_)
        elif isinstance(s, Let):
            self.env[s.name] = self.eval(s.value, {})
        elif isinstance(s, Local):
            data = np.zeros((s.count, s.type.lanes), s.type.dtype.np)
            self.locals[s.name] = (data, np.zeros(s.count, bool))
        elif isinstance(s, LocalStore):
            data, written = self.locals[s.name]
            i = self.local_index(s.name, s.index)
            data[i] = self.eval(s.value, {})
            written[i] = True
        elif isinstance(s, Prefetch):
            pass  # a cache hint: no value changes
        elif isinstance(s, Store):
            value = self.eval(s.value, {})
            self.buffer_slice(s.buffer, self.scalar(s.index), len(value))[:] = value

    def scalar(self, e: Expr) -> int:
        return int(self.eval(e, {})[0])

    def buffer_slice(self, name: str, start: int, lanes: int) -> Array:
        buf = self.buffers[name]
        if start < 0 or start + lanes > buf.size:
            raise VerifyError(f"access {name}[{start}:+{lanes}] is out of bounds "
                              f"(the buffer has {buf.size} elements)")
        return buf[start:start + lanes]

    def local_index(self, name: str, index: Expr) -> int:
        i = self.scalar(index)
        count = len(self.locals[name][1])
        if not 0 <= i < count:
            raise VerifyError(f"local {name}[{i}] is out of range (count {count})")
        return i

    def eval(self, e: Expr, memo: dict[int, Array]) -> Array:
        """The value of ``e``; ``memo`` shares repeated sub-trees within one statement."""
        found = memo.get(id(e))
        if found is not None:
            return found
        if e.op is XOp.VAR:
            value = self.env[e.arg]  # type: ignore[index]
        elif e.op is XOp.THREAD_ID:
            value = np.zeros(1, np.int64)  # parallel loops run serially here
        elif e.op is XOp.IOTA:
            value = np.arange(e.lanes, dtype=e.dtype.np)
        elif e.op is XOp.LOAD:
            value = self.buffer_slice(e.arg, self.scalar(e.args[0]), e.lanes).copy()  # type: ignore[arg-type]
        elif e.op is XOp.LOCAL_LOAD:
            data, written = self.locals[e.arg]  # type: ignore[index]
            i = self.local_index(e.arg, e.args[0])  # type: ignore[arg-type]
            if not written[i]:
                raise VerifyError(f"local {e.arg}[{i}] is read before it is written")
            value = data[i].copy()
        else:
            args = [self.eval(a, memo) for a in e.args]
            value = np.asarray(apply_op(self.ops, e, args), dtype=e.dtype.np)
        memo[id(e)] = value
        return value
