"""Loop-IR simplification: index-arithmetic folding and loop-invariant hoisting.

Each pass is a plain function ``LoopFunction -> (LoopFunction, changed)``. Folding touches
integer and bool expressions only (float folding would have to reproduce IEEE rounding, and
``x + 0.0`` is not ``x`` for ``x = -0.0``); it keeps unchanged sub-trees as the same objects.

Hoisting moves pure expressions that do not depend on a loop's variable (nor on anything the body
defines, nor on local arrays) into ``let``\\ s in front of the loop. A load is hoisted only from a
readonly buffer and only where it would have run anyway: not from under an ``if`` and not out of
a loop that might run zero times (a hoisted load must not fault where the original did not).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.loop.ir import (
    COMPARE,
    Block,
    Expr,
    For,
    If,
    Let,
    LocalStore,
    LoopFunction,
    Prefetch,
    Stmt,
    Store,
    XOp,
    all_names,
    block,
    const,
    defined_names,
    expr_children,
    walk_expr,
)

_INT_FOLD: dict[XOp, Callable[[int, int], int | bool]] = {
    XOp.ADD: lambda a, b: a + b, XOp.SUB: lambda a, b: a - b, XOp.MUL: lambda a, b: a * b,
    XOp.MIN: min, XOp.MAX: max,
    XOp.AND: lambda a, b: a & b, XOp.OR: lambda a, b: a | b, XOp.XOR: lambda a, b: a ^ b,
    XOp.LT: lambda a, b: a < b, XOp.LE: lambda a, b: a <= b, XOp.EQ: lambda a, b: a == b,
    XOp.NE: lambda a, b: a != b, XOp.GT: lambda a, b: a > b, XOp.GE: lambda a, b: a >= b,
}


_NEVER_HOISTED = frozenset({XOp.LOCAL_LOAD, XOp.THREAD_ID})  # locals change; ids differ by region


def _wrap(value: int, dtype: DType) -> int | bool:
    """``value`` as ``dtype`` stores it (two's complement wrap-around)."""
    if dtype.is_bool:
        return bool(value)
    return int(np.array(value & 0xFFFF_FFFF_FFFF_FFFF, np.uint64).astype(dtype.np))


def _is_const(e: Expr, value: int | None = None) -> bool:
    return e.op is XOp.CONST and (value is None or e.arg == value)


def _folds(e: Expr) -> bool:
    return not e.dtype.is_float


# ----------------------------------------------------------------------------- expressions


def fold_expr(e: Expr) -> Expr:
    """``e`` with integer/bool constant sub-expressions folded and identities applied."""
    if not e.args:
        return e
    args = tuple(fold_expr(a) for a in e.args)
    if any(n is not o for n, o in zip(args, e.args)):
        e = replace(e, args=args)
    return _fold_node(e)


def _fold_node(e: Expr) -> Expr:
    op, args = e.op, e.args
    if op is XOp.SELECT and _is_const(args[0]):
        return args[1] if args[0].arg else args[2]
    if op is XOp.BROADCAST and _is_const(args[0]):
        return const(args[0].arg, e.dtype, e.lanes)  # type: ignore[arg-type]
    if not all(_folds(a) for a in args):
        return e
    if all(_is_const(a) for a in args):
        folded = _fold_constants(e)
        if folded is not None:
            return folded
    if op in (XOp.ADD, XOp.SUB, XOp.MUL, XOp.FLOORDIV, XOp.MOD):
        return _arith_identity(e)
    return e


def _fold_constants(e: Expr) -> Expr | None:
    op, values = e.op, [a.arg for a in e.args]
    dtype = e.dtype
    if op in _INT_FOLD:
        result = _INT_FOLD[op](*values)  # type: ignore[arg-type]
    elif op in (XOp.FLOORDIV, XOp.MOD) and values[1] != 0:
        result = values[0] // values[1] if op is XOp.FLOORDIV else values[0] % values[1]
    elif op is XOp.NEG:
        result = -values[0]
    elif op is XOp.ABS:
        result = abs(values[0])
    elif op is XOp.NOT:
        result = (not values[0]) if dtype.is_bool else ~values[0]
    elif op is XOp.CAST and not dtype.is_float:
        result = values[0] != 0 if dtype.is_bool else int(values[0])
    else:
        return None
    if op in COMPARE:
        return const(bool(result), DType.bool, e.lanes)
    return const(_wrap(int(result), dtype), dtype, e.lanes)


def _arith_identity(e: Expr) -> Expr:
    """x+0, x*1, x*0, x//1, x%1, constants moved right and merged: (x+c1)+c2 -> x+(c1+c2)."""
    op, (a, b) = e.op, e.args
    if e.dtype.is_bool:
        return e
    if op in (XOp.ADD, XOp.MUL) and _is_const(a) and not _is_const(b):
        a, b = b, a
        e = replace(e, args=(a, b))
    if op is XOp.SUB and _is_const(b):
        return _fold_node(replace(e, op=XOp.ADD, args=(a, _neg_const(b))))
    if op is XOp.ADD:
        return _add_identity(e, a, b)
    if op is XOp.MUL:
        return _mul_identity(e, a, b)
    if _is_const(b, 1):
        return a if op is XOp.FLOORDIV else const(0, e.dtype, e.lanes)
    return e


def fold_index(e: Expr) -> Expr:
    """:func:`fold_expr` for an address (an i64 index that cannot overflow), with two more
    rules: ``(q*c + k) // c -> q + k // c`` and ``(q*c + k) % c -> k % c`` (floor division,
    c > 0). Not for values: with wrap-around (a u8 ``x * 4``) they would not hold."""
    if not e.args or e.dtype is not DType.i64:
        return e
    args = tuple(fold_index(a) for a in e.args)
    if any(n is not o for n, o in zip(args, e.args)):
        e = replace(e, args=args)
    e = _fold_node(e)
    if e.op in (XOp.FLOORDIV, XOp.MOD) and e.lanes == 1 and _is_const(e.args[1]) \
            and e.args[1].arg > 0:  # type: ignore[operator]
        c = int(e.args[1].arg)  # type: ignore[arg-type]
        split = _split_multiple(e.args[0], c)
        if split is not None:
            q, k = split
            if e.op is XOp.MOD:
                return const(k % c, e.dtype)
            return _fold_node(replace(e, op=XOp.ADD, args=(q, const(k // c, e.dtype))))
    return e


def _split_multiple(a: Expr, c: int) -> tuple[Expr, int] | None:
    """``(q, k)`` with ``a == q * c + k`` and ``k`` a constant, when ``a`` is ``x * m`` or
    ``x * m + k`` with ``m`` a multiple of ``c`` (an interleaved index ``i*g + j`` seen
    through a ``[g, m]`` transpose); None otherwise."""
    k = 0
    if a.op is XOp.ADD and _is_const(a.args[1]):
        a, k = a.args[0], a.args[1].arg  # type: ignore[assignment]
    if a.op is XOp.MUL and _is_const(a.args[1]) and a.args[1].arg % c == 0:  # type: ignore[operator]
        x, m = a.args
        factor = m.arg // c  # type: ignore[operator]
        q = x if factor == 1 else _fold_node(replace(a, args=(x, const(factor, a.dtype))))
        return q, k
    return None


def _neg_const(c: Expr) -> Expr:
    return const(_wrap(-c.arg, c.dtype), c.dtype, c.lanes)  # type: ignore[operator]


def _add_identity(e: Expr, a: Expr, b: Expr) -> Expr:
    if _is_const(b, 0):
        return a
    if a.op is XOp.ADD and _is_const(a.args[1]):  # (x + c1) + b
        x, c1 = a.args
        if _is_const(b):
            return _fold_node(replace(e, args=(x, fold_expr(replace(e, args=(c1, b))))))
        return _fold_node(replace(e, args=(_fold_node(replace(e, args=(x, b))), c1)))
    if b.op is XOp.ADD and _is_const(b.args[1]):  # a + (y + c)
        y, c = b.args
        return _fold_node(replace(e, args=(_fold_node(replace(e, args=(a, y))), c)))
    return e


def _mul_identity(e: Expr, a: Expr, b: Expr) -> Expr:
    if _is_const(b, 1):
        return a
    if _is_const(b, 0):
        return const(0, e.dtype, e.lanes)
    if _is_const(b) and a.op is XOp.MUL and _is_const(a.args[1]):  # (x * c1) * c2
        x, c1 = a.args
        return replace(e, args=(x, fold_expr(replace(e, args=(c1, b)))))
    if _is_const(b) and a.op is XOp.ADD and _is_const(a.args[1]):  # (x + c1) * c2
        x, c1 = a.args
        scaled = _fold_node(replace(e, args=(x, b)))
        offset = fold_expr(replace(e, args=(c1, b)))
        return _fold_node(replace(a, args=(scaled, offset)))
    return e


# ----------------------------------------------------------------------------- statements


def _map_exprs(s: Stmt, f: Callable[[Expr], Expr]) -> Stmt:
    """``s`` with ``f`` applied to the expressions it evaluates itself (same object if none
    changed)."""
    if isinstance(s, For):
        start, stop = f(s.start), f(s.stop)
        return s if start is s.start and stop is s.stop else replace(s, start=start, stop=stop)
    if isinstance(s, (Store, LocalStore)):
        index, value = f(s.index), f(s.value)
        return s if index is s.index and value is s.value else replace(s, index=index,
                                                                       value=value)
    if isinstance(s, Let):
        value = f(s.value)
        return s if value is s.value else replace(s, value=value)
    if isinstance(s, If):
        cond = f(s.cond)
        return s if cond is s.cond else replace(s, cond=cond)
    if isinstance(s, Prefetch):
        index = f(s.index)
        return s if index is s.index else replace(s, index=index)
    return s


def _fold_stmt(s: Stmt) -> Stmt:
    s = _map_exprs(s, fold_expr)
    if isinstance(s, Block):
        stmts = tuple(_fold_stmt(c) for c in s.stmts)
        changed = any(n is not o for n, o in zip(stmts, s.stmts))
        flat = block(*stmts)
        return flat if changed or len(flat.stmts) != len(s.stmts) else s
    if isinstance(s, For):
        body = _fold_stmt(s.body)
        if _trip_count(s) == 0 or body == Block():
            return Block()
        return s if body is s.body else replace(s, body=body)
    if isinstance(s, If):
        then = _fold_stmt(s.then)
        else_ = None if s.else_ is None else _fold_stmt(s.else_)
        if _is_const(s.cond):
            return then if s.cond.arg else (else_ or Block())
        if then is s.then and else_ is s.else_:
            return s
        return replace(s, then=then, else_=else_)
    return s


def _trip_count(s: For) -> int | None:
    if _is_const(s.start) and _is_const(s.stop):
        return max(0, -(-(s.stop.arg - s.start.arg) // s.step))  # type: ignore[operator]
    return None


def fold_constants(fn: LoopFunction) -> tuple[LoopFunction, bool]:
    """Folds index arithmetic and removes dead branches and zero-trip loops."""
    body = _fold_stmt(fn.body)
    return (fn, False) if body is fn.body else (replace(fn, body=body), True)


# ----------------------------------------------------------------------------- hoisting


class _Namer:
    def __init__(self, taken: set[str], prefix: str = "inv"):
        self.taken, self.prefix, self.next = taken, prefix, 0

    def fresh(self) -> str:
        while f"{self.prefix}{self.next}" in self.taken:
            self.next += 1
        name = f"{self.prefix}{self.next}"
        self.taken.add(name)
        return name


class _Hoister:
    def __init__(self, fn: LoopFunction):
        self.readonly = {b.name for b in fn.buffers if b.readonly}
        self.namer = _Namer(all_names(fn))

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, Block):
            stmts = tuple(self.stmt(c) for c in s.stmts)
            return s if all(n is o for n, o in zip(stmts, s.stmts)) else block(*stmts)
        if isinstance(s, If):
            then = self.stmt(s.then)
            else_ = None if s.else_ is None else self.stmt(s.else_)
            return s if then is s.then and else_ is s.else_ else replace(s, then=then,
                                                                          else_=else_)
        if isinstance(s, For):
            body = self.stmt(s.body)
            return self.hoist_from(s if body is s.body else replace(s, body=body))
        return s

    def invariant(self, e: Expr, variant: set[str], loads_ok: bool) -> bool:
        for node in walk_expr(e):
            if (node.op is XOp.VAR and node.arg in variant) or node.op in _NEVER_HOISTED:
                return False
            if node.op is XOp.LOAD and not (loads_ok and node.arg in self.readonly):
                return False
        return True

    def hoist_from(self, loop: For) -> Stmt:
        runs = (_trip_count(loop) or 0) > 0
        variant = defined_names(loop.body) | {loop.var}
        body = loop.body.stmts if isinstance(loop.body, Block) else (loop.body,)
        moved: list[Stmt] = []
        kept: list[Stmt] = []
        for s in body:  # whole lets first: their names become invariant for what follows
            if isinstance(s, Let) and self.invariant(s.value, variant, runs):
                moved.append(s)
                variant.discard(s.name)
            else:
                kept.append(s)
        found: dict[Expr, str] = {}
        for s in kept:
            self.collect(s, variant, runs, found)
        if not moved and not found:
            return loop
        new_body = block(*(_map_exprs_deep(s, lambda e: _substitute(e, found)) for s in kept))
        lets = [Let(name, e) for e, name in found.items()]
        return block(*moved, *lets, replace(loop, body=new_body))

    def collect(self, s: Stmt, variant: set[str], loads_ok: bool, found: dict[Expr, str]) -> None:
        """Records the largest invariant, non-trivial expressions that ``s`` evaluates."""
        for e in expr_children(s):
            self.collect_expr(e, variant, loads_ok, found)
        if isinstance(s, Block):
            for child in s.stmts:
                self.collect(child, variant, loads_ok, found)
        elif isinstance(s, For):
            self.collect(s.body, variant, loads_ok and (_trip_count(s) or 0) > 0, found)
        elif isinstance(s, If):
            self.collect(s.then, variant, False, found)
            if s.else_ is not None:
                self.collect(s.else_, variant, False, found)

    def collect_expr(self, e: Expr, variant: set[str], loads_ok: bool,
                     found: dict[Expr, str]) -> None:
        if e.op in (XOp.CONST, XOp.VAR, XOp.THREAD_ID, XOp.IOTA):
            return
        if e in found or self.invariant(e, variant, loads_ok):
            found.setdefault(e, self.namer.fresh())
            return
        for a in e.args:
            self.collect_expr(a, variant, loads_ok, found)


def _substitute(e: Expr, names: dict[Expr, str]) -> Expr:
    name = names.get(e)
    if name is not None:
        return Expr(XOp.VAR, e.type, (), name)
    if not e.args:
        return e
    args = tuple(_substitute(a, names) for a in e.args)
    return e if all(n is o for n, o in zip(args, e.args)) else replace(e, args=args)


def _map_exprs_deep(s: Stmt, f: Callable[[Expr], Expr]) -> Stmt:
    s = _map_exprs(s, f)
    if isinstance(s, Block):
        return Block(tuple(_map_exprs_deep(c, f) for c in s.stmts))
    if isinstance(s, For):
        return replace(s, body=_map_exprs_deep(s.body, f))
    if isinstance(s, If):
        else_ = None if s.else_ is None else _map_exprs_deep(s.else_, f)
        return replace(s, then=_map_exprs_deep(s.then, f), else_=else_)
    return s


def hoist_invariants(fn: LoopFunction) -> tuple[LoopFunction, bool]:
    """Moves loop-invariant pure expressions into lets in front of their loops."""
    body = _Hoister(fn).stmt(fn.body)
    return (fn, False) if body is fn.body else (replace(fn, body=body), True)


def simplify(fn: LoopFunction, max_rounds: int = 8) -> tuple[LoopFunction, bool]:
    """Folding and hoisting, repeated until nothing changes (at most ``max_rounds`` times)."""
    changed_any = False
    for _ in range(max_rounds):
        fn, folded = fold_constants(fn)
        fn, hoisted = hoist_invariants(fn)
        if not (folded or hoisted):
            break
        changed_any = True
    return fn, changed_any
