"""Vectors as warps: the per-thread form of a kernel whose vectors span a GPU warp.

The loop IR's vectors are SIMD values; on a GPU a warp of ``W`` (32) threads is the same thing
spread over threads. A kernel lowered with vectors of ``L = W * k`` lanes (a row kernel with
vector width 128, say) runs warp-per-iteration: thread ``t`` of the warp holds lanes
``t*k .. t*k + k-1`` of every vector value, so

* ``load<L>(B, i)`` becomes ``load<k>(B, i + t*k)``: one coalesced warp access;
* a store of ``L`` lanes at ``i`` becomes a store of ``k`` lanes at ``i + t*k``;
* ``bcast<L>(s)`` and ``splat<L>(c)`` become ``bcast<k>``/``splat<k>`` (a scalar when k = 1);
* ``reduce_op(v)`` keeps its node: the code generator reduces the thread's ``k`` lanes, then
  across the warp with butterfly shuffles, leaving the result in every thread;
* scalars (``lanes == 1``) are *uniform*: every thread of the warp computes the same value, so
  scalar control flow stays convergent and a scalar store writes the same value ``W`` times.

:func:`to_simt` rewrites a function into that form (``simt.lane`` is the thread's lane number,
bound by the code generator). The result is for code generation only: it no longer means the
same thing to the loop interpreter. Vectors of any other width are a CompileError.
"""

from __future__ import annotations

from dataclasses import replace

from tilefuse.errors import CompileError
from tilefuse.loop.ir import (
    I64,
    Block,
    Expr,
    For,
    If,
    Let,
    Local,
    LocalStore,
    LoopFunction,
    Prefetch,
    Stmt,
    Store,
    XOp,
    var,
)

LANE = "simt.lane"
"""The scalar variable holding the thread's lane in its warp."""


def to_simt(fn: LoopFunction, width: int) -> LoopFunction:
    """``fn`` in per-thread form for warps of ``width`` threads (module docstring)."""
    return replace(fn, body=_Rewriter(fn.name, width).stmt(fn.body))


class _Rewriter:
    def __init__(self, name: str, width: int):
        self.name = name
        self.width = width
        self.memo: dict[int, Expr] = {}

    def lanes(self, lanes: int) -> int:
        """Per-thread lanes of a ``lanes``-wide value (1 for uniform scalars)."""
        if lanes == 1:
            return 1
        if lanes % self.width:
            raise CompileError(f"kernel {self.name}: a {lanes}-lane vector does not spread "
                               f"over a {self.width}-thread warp")
        return lanes // self.width

    def offset(self, lanes: int) -> Expr:
        """This thread's first lane within a ``lanes``-wide access."""
        return var(LANE, I64) * self.lanes(lanes)

    def expr(self, e: Expr) -> Expr:
        found = self.memo.get(id(e))
        if found is not None:
            return found
        args = tuple(self.expr(a) for a in e.args)
        k = self.lanes(e.lanes)
        if e.op is XOp.LOAD and e.lanes > 1:
            args = (args[0] + self.offset(e.lanes),)
        if e.op is XOp.BROADCAST and k == 1:
            out = args[0]
        else:
            out = Expr(e.op, e.type.with_lanes(k), args, e.arg)
        self.memo[id(e)] = out
        return out

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, Block):
            return Block(tuple(self.stmt(c) for c in s.stmts))
        if isinstance(s, For):
            return replace(s, start=self.expr(s.start), stop=self.expr(s.stop),
                           body=self.stmt(s.body))
        if isinstance(s, If):
            return If(self.expr(s.cond), self.stmt(s.then),
                      None if s.else_ is None else self.stmt(s.else_))
        if isinstance(s, Let):
            return Let(s.name, self.expr(s.value))
        if isinstance(s, Local):
            return replace(s, type=s.type.with_lanes(self.lanes(s.type.lanes)))
        if isinstance(s, LocalStore):
            return LocalStore(s.name, self.expr(s.index), self.expr(s.value))
        if isinstance(s, Prefetch):
            return Block()  # a CPU cache hint
        if isinstance(s, Store):
            index = self.expr(s.index)
            if s.value.lanes > 1:
                index = index + self.offset(s.value.lanes)
            return Store(s.buffer, index, self.expr(s.value))
        raise CompileError(f"kernel {self.name}: cannot spread {type(s).__name__} over a warp")


__all__ = ["LANE", "to_simt"]
