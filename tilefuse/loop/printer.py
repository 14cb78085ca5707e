"""Readable text for loop IR (for dumps and golden tests).

::

    kernel axpy(X: f32 readonly, Y: f32; n):
      parallel for i in 0..n step 16:
        Y[i:+16] = fma(bcast<16>(2.0), load<16>(X, i), load<16>(Y, i))

Constants print bare when their type is the default for the literal (``i64``, ``f32``, ``bool``)
and as ``value:type`` otherwise. Scalar loads print as ``A[i]``, vector loads as ``load<16>(A, i)``;
vector stores as ``A[i:+16] = value``.
"""

from __future__ import annotations

from tilefuse.dtypes import DType
from tilefuse.loop.ir import (
    COMPARE,
    Block,
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
)

_INFIX: dict[XOp, tuple[str, int]] = {
    XOp.ADD: (" + ", 1), XOp.SUB: (" - ", 1),
    XOp.MUL: ("*", 2), XOp.DIV: ("/", 2), XOp.FLOORDIV: ("//", 2), XOp.MOD: ("%", 2),
    XOp.LT: (" < ", 0), XOp.LE: (" <= ", 0), XOp.EQ: (" == ", 0), XOp.NE: (" != ", 0),
    XOp.GT: (" > ", 0), XOp.GE: (" >= ", 0),
}
_ATOM = 4
_DEFAULT_CONST_TYPE = {int: DType.i64, float: DType.f32, bool: DType.bool}


def _precedence(e: Expr) -> int:
    if e.op in _INFIX:
        return _INFIX[e.op][1]
    return 3 if e.op is XOp.NEG else _ATOM


def _const_text(e: Expr) -> str:
    value = e.arg
    text = repr(value)
    if _DEFAULT_CONST_TYPE.get(type(value)) is not e.dtype:
        text = f"{text}:{e.dtype}"
    return text if e.lanes == 1 else f"splat<{e.lanes}>({text})"


def format_expr(e: Expr) -> str:
    """One expression as text, with the fewest parentheses that keep the tree's shape."""
    op = e.op
    if op is XOp.CONST:
        return _const_text(e)
    if op is XOp.VAR:
        return str(e.arg)
    if op is XOp.LOAD:
        index = format_expr(e.args[0])
        return f"{e.arg}[{index}]" if e.lanes == 1 else f"load<{e.lanes}>({e.arg}, {index})"
    if op is XOp.LOCAL_LOAD:
        return f"{e.arg}[{format_expr(e.args[0])}]"
    if op is XOp.BROADCAST:
        return f"bcast<{e.lanes}>({format_expr(e.args[0])})"
    if op is XOp.IOTA:
        return f"iota<{e.type}>"
    if op is XOp.CAST:
        return f"cast<{e.dtype}>({format_expr(e.args[0])})"
    if op is XOp.NEG:
        return "-" + _operand(e.args[0], 3, strict=True)
    if op in _INFIX:
        symbol, prec = _INFIX[op]
        left = _operand(e.args[0], prec, strict=op in COMPARE)
        right = _operand(e.args[1], prec, strict=True)
        return f"{left}{symbol}{right}"
    return f"{op}({', '.join(format_expr(a) for a in e.args)})"


def _operand(e: Expr, parent_prec: int, *, strict: bool) -> str:
    text = format_expr(e)
    prec = _precedence(e)
    needs = prec <= parent_prec if strict else prec < parent_prec
    return f"({text})" if needs else text


def format_stmt(s: Stmt, indent: int = 0) -> list[str]:
    """The lines of one statement, indented by ``indent`` levels of two spaces."""
    pad = "  " * indent
    if isinstance(s, Block):
        if not s.stmts:
            return [pad + "pass"]
        return [line for child in s.stmts for line in format_stmt(child, indent)]
    if isinstance(s, For):
        kind = "" if s.kind is LoopKind.SERIAL else f"{s.kind} "
        step = "" if s.step == 1 else f" step {s.step}"
        head = f"{pad}{kind}for {s.var} in {format_expr(s.start)}..{format_expr(s.stop)}{step}:"
        return [head, *format_stmt(s.body, indent + 1)]
    if isinstance(s, If):
        lines = [f"{pad}if {format_expr(s.cond)}:", *format_stmt(s.then, indent + 1)]
        if s.else_ is not None:
            lines += [f"{pad}else:", *format_stmt(s.else_, indent + 1)]
        return lines
    if isinstance(s, Store):
        lanes = s.value.lanes
        where = format_expr(s.index) + ("" if lanes == 1 else f":+{lanes}")
        stream = "stream " if s.streaming else ""
        return [f"{pad}{stream}{s.buffer}[{where}] = {format_expr(s.value)}"]
    if isinstance(s, LocalStore):
        return [f"{pad}{s.name}[{format_expr(s.index)}] = {format_expr(s.value)}"]
    if isinstance(s, Let):
        return [f"{pad}let {s.name} = {format_expr(s.value)}"]
    if isinstance(s, Local):
        return [f"{pad}local {s.name}: {s.type}[{s.count}]"]
    if isinstance(s, Prefetch):
        level = "" if s.locality == 3 else f".l{4 - s.locality}"
        return [f"{pad}prefetch{level} {s.buffer}[{format_expr(s.index)}]"]
    return [f"{pad}<unknown statement {type(s).__name__}>"]


def format_function(fn: LoopFunction) -> str:
    """The whole kernel: a header line with its arguments, then the body."""
    params = []
    for b in fn.buffers:
        text = f"{b.name}: {b.dtype}"
        if b.readonly:
            text += " readonly"
        if b.align:
            text += f" align {b.align}"
        params.append(text)
    scalars = f"; {', '.join(fn.scalars)}" if fn.scalars else ""
    header = f"kernel {fn.name}({', '.join(params)}{scalars}):"
    return "\n".join([header, *format_stmt(fn.body, 1)]) + "\n"
