"""The loop-IR parser: printer output parses back to the same function (structurally, up to the
two spellings the printer merges) for hand-written kernels and for every kernel the lowerings
make of a few graphs; malformed text is a ParseError naming the line."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tilefuse.driver import plan_kernels
from tilefuse.dtypes import DType
from tilefuse.errors import ParseError, TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.lower_elementwise import lower_group
from tilefuse.kernel.lower_gpu import lower_group_gpu
from tilefuse.kernel.lower_matmul import lower_matmul
from tilefuse.kernel.schedule import CpuTarget, default_schedule
from tilefuse.loop import (
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
    Store,
    XOp,
    binary,
    broadcast,
    cast,
    const,
    fma,
    format_function,
    iota,
    loop,
    select,
    thread_id,
    unary,
    var,
    verify,
)
from tilefuse.loop.ir import Block, Stmt, maximum
from tilefuse.loop.parser import parse_function

F32 = DType.f32


# ---- comparing up to what the text merges -----------------------------------------------------
def _expr(e: Expr) -> Expr:
    args = tuple(_expr(a) for a in e.args)
    if e.op is XOp.NEG and args[0].op is XOp.CONST:   # "-2.0" reads as the constant -2.0
        return Expr(XOp.CONST, args[0].type, (), -args[0].arg)  # type: ignore[operator]
    return Expr(e.op, e.type, args, e.arg)


def _stmt(s: Stmt) -> Stmt:
    if isinstance(s, Block):
        flat: list[Stmt] = []
        for child in s.stmts:
            n = _stmt(child)
            flat.extend(n.stmts if isinstance(n, Block) else [n])
        return Block(tuple(flat))
    if isinstance(s, For):
        return dataclasses.replace(s, start=_expr(s.start), stop=_expr(s.stop), body=_body(s.body))
    if isinstance(s, If):
        return If(_expr(s.cond), _body(s.then), None if s.else_ is None else _body(s.else_))
    if isinstance(s, Store | LocalStore):
        return dataclasses.replace(s, index=_expr(s.index), value=_expr(s.value))
    if isinstance(s, Prefetch):
        return dataclasses.replace(s, index=_expr(s.index))
    if isinstance(s, Let):
        return Let(s.name, _expr(s.value))
    return s


def _body(s: Stmt) -> Block:
    n = _stmt(s)
    return n if isinstance(n, Block) else Block((n,))


def normal(fn: LoopFunction) -> LoopFunction:
    """A loop or if body is always a block; a negated constant is a negative constant."""
    return dataclasses.replace(fn, body=_body(fn.body))


def round_trip(fn: LoopFunction) -> LoopFunction:
    text = format_function(fn)
    parsed = parse_function(text)
    assert format_function(parsed) == text
    assert normal(parsed) == normal(fn)
    return parsed


# ---- hand-written kernels ---------------------------------------------------------------------
def every_construct() -> LoopFunction:
    a = BufferParam("A", F32, readonly=True, align=64)
    h = BufferParam("H", DType.f16, readonly=True)
    c = BufferParam("C", F32)
    m = BufferParam("M", DType.i32)
    i, k, n = var("i"), var("k"), var("n")
    acc = Local("acc", a.load(0, 16).type, 2)
    best = Local("best", a.load(0).type)
    row = Let("row", i * 768 + (n - 2) // 3 % 5 - (n + 1))
    flag = Let("flag", binary(XOp.LE, row.ref, n - 1))
    body = [
        acc, best, row, flag,
        acc.store(0, broadcast(0.0, 16)),
        best.store(0, const(-math.inf, F32)),
        acc.store(1, const(-0.0, F32, 16)),
        loop("k", 0, 768, [acc.store(0, fma(a.load(row.ref + k, 16), broadcast(2.5e-07, 16),
                                             acc.load(0))),
                           Prefetch("A", row.ref + k + 64), Prefetch("A", k, locality=2)],
             step=16, kind=LoopKind.VECTORIZED),
        loop("u", 0, 4, [m.store(var("u"), cast(const(3, DType.i32) * -const(2, DType.i32),
                                                  DType.i32))], kind=LoopKind.UNROLLED),
        If(flag.ref,
           c.store(i, unary(XOp.SQRT, maximum(-unary(XOp.ABS, a.load(i)), best.load(0)))),
           Block((If(unary(XOp.ISNAN, c.load(i)),
                     c.store(i, select(binary(XOp.GT, cast(h.load(i), F32), 1.5),
                                       const(1.0, F32), cast(thread_id(), F32)))),
                  c.store(i + 1, -(a.load(i) * 2.0)),
                  c.store(i + 2, (a.load(i) - a.load(n)) / unary(XOp.NEG, -a.load(n)))))),
        c.store(i, binary(XOp.POW, c.load(i), const(2.0, F32)) + cast(const(True, DType.bool),
                                                                     F32)),
        m.store(i, binary(XOp.AND, binary(XOp.XOR, m.load(i), const(7, DType.i32)),
                          unary(XOp.NOT, m.load(n)))),
        If(binary(XOp.EQ, i, 0), Block(())),
        Store("C", i * 16, acc.load(1), streaming=True),
        m.store(i * 16, iota(16) + broadcast(cast(i, DType.i32), 16)),
    ]
    return LoopFunction("every", (a, h, c, m), ("n",),
                        loop("i", 0, n, body, step=12, kind=LoopKind.PARALLEL))


def test_every_construct_round_trips() -> None:
    parsed = round_trip(every_construct())
    verify(parsed)
    text = format_function(parsed)
    assert "prefetch.l2 A[k]" in text and "splat<16>(-0.0)" in text and "-inf" in text
    assert "stream C[i*16:+16] = acc[1]" in text and "iota<i32x16>" in text
    outer = parsed.body.stmts[0]  # type: ignore[union-attr]
    [stmt] = [s for s in outer.body.stmts if isinstance(s, LocalStore)
              and s.name == "acc" and s.index == const(1)]
    assert math.copysign(1.0, stmt.value.arg) == -1.0   # -0.0 keeps its sign


def test_types_come_from_declarations() -> None:
    fn = parse_function("kernel k(X: f16 readonly, Y: f64; n):\n"
                        "  local acc: f16x8[1]\n"
                        "  let v = load<8>(X, n*8)\n"
                        "  acc[0] = v\n"
                        "  let s = reduce_max(acc[0])\n"
                        "  Y[0] = cast<f64>(s) + 1.5:f64\n")
    let_v, let_s = fn.body.stmts[1], fn.body.stmts[3]  # type: ignore[union-attr]
    assert let_v.value.type == let_v.value.type.with_lanes(8) and let_v.value.dtype is DType.f16
    assert let_s.value.lanes == 1 and let_s.value.dtype is DType.f16
    store = fn.body.stmts[4]  # type: ignore[union-attr]
    assert store.value.dtype is DType.f64 and store.value.args[1] == const(1.5, DType.f64)


# ---- kernels the lowerings make ---------------------------------------------------------------
def _graph() -> GraphBuilder:
    rng = np.random.default_rng(0)
    b = GraphBuilder("mix")
    x = b.input(((7, 45), F32), "x")
    y = b.input(((45,), F32), "y")
    w = b.add1("constant", [], {"value": rng.standard_normal((45, 19)).astype(np.float32)})
    h = b.add1("gelu", [b.add1("add", [b.add1("matmul", [x, w]), b.add1("constant", [], {
        "value": np.ones(19, np.float32)})])])
    s = b.add1("softmax", [h], {"axis": -1})
    t = b.add1("tanh", [b.add1("mul", [x, y])])
    m = b.add1("cast", [b.add1("gt", [t, b.add1("constant", [], {
        "value": np.array(0.25, np.float32)})])], {"dtype": DType.i32})
    return b.build([s, b.add1("sum", [b.add1("exp", [t])], {"axes": (1,)}), m])


def test_every_lowered_kernel_round_trips() -> None:
    plan = plan_kernels(_graph())
    target = CpuTarget(512, 2)
    made = []
    for group in plan.groups:
        if group.kind is KernelKind.CONTRACTION:
            made += lower_matmul(group, default_schedule(group, target), constant_b=True).functions
        elif group.kind in (KernelKind.ELEMENTWISE, KernelKind.ROW_REDUCTION):
            made.append(lower_group(group, default_schedule(group, target)))
            made.append(lower_group_gpu(group).fn)
    assert len(made) >= 5
    for fn in made:
        verify(round_trip(fn))


# ---- errors -----------------------------------------------------------------------------------
HEAD = "kernel k(X: f32 readonly, Y: f32; n):\n"


@pytest.mark.parametrize("text,match", [
    ("", "empty"),
    ("kernal k():\n  pass\n", "line 1: expected 'kernel"),
    (HEAD + "  Y[0] = Z[0]\n", "line 2: unknown buffer 'Z'"),
    (HEAD + "  Y[0] = j\n", "line 2: unknown name 'j'"),
    (HEAD + "   Y[0] = 1.0\n", "line 2: indent by two spaces"),
    (HEAD + "  Y[0:+8] = 1.0\n", "a store of 1 lanes written as 8"),
    (HEAD + "  local a: q32[1]\n", "unknown type 'q32'"),
    (HEAD + "  Y[0] = cast<f33>(X[0])\n", "unknown dtype 'f33'"),
    (HEAD + "  for n in 0..4:\n    pass\n", "name 'n' defined twice"),
    (HEAD + "  Y[0] = X[0] X[1]\n", "unexpected 'X'"),
    (HEAD + "  Y[0] = max(X[0])\n", "max takes 2 operands, got 1"),
    (HEAD + "  for i in 0..4:\n", "expected an indented block"),
    (HEAD + "  Y[0] = X[0] $\n", "unexpected character"),
    (HEAD + "  prefetch.l7 X[0]\n", "unknown prefetch level"),
    (HEAD + "  Y[0] = 1.0\n    Y[1] = 2.0\n", "unexpected indentation"),
])
def test_malformed_text_names_the_line(text: str, match: str) -> None:
    with pytest.raises(ParseError, match=match) as info:
        parse_function(text)
    assert isinstance(info.value, TilefuseError)


def test_not_a_string() -> None:
    with pytest.raises(ParseError, match="must be a str, got bytes"):
        parse_function(b"kernel k():\n")  # type: ignore[arg-type]
