"""Loop IR text back to a :class:`~tilefuse.loop.ir.LoopFunction`: the inverse of
:mod:`tilefuse.loop.printer`, so a kernel dump (``kernels/<name>.loop``) can be read, edited and
compiled again, and golden tests can be written as text.

``parse_function(format_function(fn))`` prints back to the same text. Types the printer leaves
implicit are recovered from declarations: a load's dtype from its buffer parameter, a variable's
type from its ``let`` (loop variables and scalar parameters are ``i64``), ``A[i]`` is a local
load when ``A`` is a declared local, and a store's lanes from its value. Two spellings print
alike and parse as one: ``-2.0`` is the constant -2.0 (never ``neg`` of 2.0), and a loop or
``if`` body is always a block. A malformed text is a :class:`~tilefuse.errors.ParseError`
naming the line and what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from tilefuse.dtypes import DType
from tilefuse.errors import ParseError
from tilefuse.loop.ir import (
    BOOL,
    COMPARE,
    I64,
    REDUCE,
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
)

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<num>\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<op>\.\.|//|<=|>=|==|!=|[-+*/%<>()\[\],:=;])
""", re.VERBOSE)

_INFIX = {"+": XOp.ADD, "-": XOp.SUB, "*": XOp.MUL, "/": XOp.DIV, "//": XOp.FLOORDIV,
          "%": XOp.MOD}
_COMPARE = {"<": XOp.LT, "<=": XOp.LE, "==": XOp.EQ, "!=": XOp.NE, ">": XOp.GT, ">=": XOp.GE}
_CALLS = {str(op): op for op in XOp} | {"thread_id": XOp.THREAD_ID}
_NOT_CALLS = {XOp.CONST, XOp.VAR, XOp.LOAD, XOp.LOCAL_LOAD, XOp.BROADCAST, XOp.CAST,
              XOp.IOTA}
_DTYPES = {d.value: d for d in DType}
_KINDS = {k.value: k for k in LoopKind if k is not LoopKind.SERIAL}


@dataclass
class _Line:
    number: int
    indent: int
    text: str


class _Tokens:
    """The tokens of one line, with a cursor."""

    def __init__(self, line: _Line):
        self.line = line
        self.items: list[tuple[str, str]] = []
        pos, text = 0, line.text
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                self.fail(f"unexpected character {text[pos]!r}")
            kind = match.lastgroup or ""
            if kind != "space":
                self.items.append((kind, match.group()))
            pos = match.end()
        self.pos = 0

    def fail(self, message: str) -> None:
        raise ParseError(f"loop IR line {self.line.number}: {message}: {self.line.text.strip()!r}")

    def peek(self, ahead: int = 0) -> str | None:
        i = self.pos + ahead
        return self.items[i][1] if i < len(self.items) else None

    def kind(self, ahead: int = 0) -> str | None:
        i = self.pos + ahead
        return self.items[i][0] if i < len(self.items) else None

    def next(self) -> str:
        if self.pos >= len(self.items):
            self.fail("unexpected end of line")
        self.pos += 1
        return self.items[self.pos - 1][1]

    def expect(self, text: str) -> None:
        got = self.peek()
        if got != text:
            self.fail(f"expected {text!r}, got {got!r}")
        self.pos += 1

    def name(self) -> str:
        if self.kind() != "name":
            self.fail(f"expected a name, got {self.peek()!r}")
        return self.next()

    def integer(self) -> int:
        if self.kind() != "num" or not self.peek().isdigit():  # type: ignore[union-attr]
            self.fail(f"expected an integer, got {self.peek()!r}")
        return int(self.next())

    def dtype(self) -> DType:
        name = self.name()
        if name not in _DTYPES:
            self.fail(f"unknown dtype {name!r}")
        return _DTYPES[name]

    def done(self) -> None:
        if self.pos != len(self.items):
            self.fail(f"unexpected {self.peek()!r}")


class _Parser:
    def __init__(self, text: str):
        self.lines: list[_Line] = []
        for number, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            stripped = raw.lstrip(" ")
            indent = len(raw) - len(stripped)
            if indent % 2 or "\t" in raw[:indent + 1]:
                raise ParseError(f"loop IR line {number}: indent by two spaces: {raw!r}")
            self.lines.append(_Line(number, indent // 2, stripped.rstrip()))
        self.pos = 0
        self.buffers: dict[str, BufferParam] = {}
        self.names: dict[str, LType] = {}     # scalars, loop variables, lets
        self.locals: dict[str, LType] = {}

    # ---- structure ----------------------------------------------------------------------------
    def function(self) -> LoopFunction:
        if not self.lines:
            raise ParseError("loop IR text is empty")
        head = _Tokens(self.lines[0])
        if head.line.indent or head.name() != "kernel":
            head.fail("expected 'kernel NAME(...):'")
        name = head.name()
        head.expect("(")
        buffers: list[BufferParam] = []
        scalars: list[str] = []
        while head.peek() not in (")", ";"):
            buffers.append(self._param(head))
            if head.peek() == ",":
                head.next()
        if head.peek() == ";":
            head.next()
            scalars.append(head.name())
            while head.peek() == ",":
                head.next()
                scalars.append(head.name())
        head.expect(")")
        head.expect(":")
        head.done()
        for b in buffers:
            self._declare(head, b.name)
            self.buffers[b.name] = b
        for s in scalars:
            self._declare(head, s)
            self.names[s] = I64
        self.pos = 1
        body = self.block(1)
        if self.pos != len(self.lines):
            line = self.lines[self.pos]
            raise ParseError(f"loop IR line {line.number}: unexpected indentation: "
                             f"{line.text!r}")
        return LoopFunction(name, tuple(buffers), tuple(scalars), body)

    def _param(self, t: _Tokens) -> BufferParam:
        name = t.name()
        t.expect(":")
        dtype = t.dtype()
        readonly, align = False, 0
        while t.peek() in ("readonly", "align"):
            if t.next() == "readonly":
                readonly = True
            else:
                align = t.integer()
        return BufferParam(name, dtype, readonly, align)

    def _declare(self, t: _Tokens, name: str) -> None:
        if name in self.buffers or name in self.names or name in self.locals:
            t.fail(f"name {name!r} defined twice")

    def block(self, indent: int) -> Block:
        stmts: list[Stmt] = []
        while self.pos < len(self.lines) and self.lines[self.pos].indent == indent:
            line = self.lines[self.pos]
            self.pos += 1
            if line.text == "pass":
                continue
            stmts.append(self.statement(_Tokens(line), indent))
        if not stmts and not (self.pos > 0 and self.lines[self.pos - 1].text == "pass"):
            where = self.lines[min(self.pos, len(self.lines) - 1)]
            raise ParseError(f"loop IR line {where.number}: expected an indented block")
        return Block(tuple(stmts))

    def statement(self, t: _Tokens, indent: int) -> Stmt:
        first = t.peek()
        if first in _KINDS or first == "for":
            return self._for(t, indent)
        if first == "if":
            t.next()
            cond = self.expr(t)
            t.expect(":")
            t.done()
            then = self.block(indent + 1)
            else_ = None
            if self.pos < len(self.lines) and self.lines[self.pos].indent == indent \
                    and self.lines[self.pos].text == "else:":
                self.pos += 1
                else_ = self.block(indent + 1)
            return If(cond, then, else_)
        if first == "let" and t.kind(1) == "name" and t.peek(2) == "=":
            t.next()
            name = t.name()
            t.expect("=")
            value = self.expr(t)
            t.done()
            self._declare(t, name)
            self.names[name] = value.type
            return Let(name, value)
        if first == "local" and t.kind(1) == "name" and t.peek(2) == ":":
            t.next()
            name = t.name()
            t.expect(":")
            dtype, lanes = self._ltype(t)
            t.expect("[")
            count = t.integer()
            t.expect("]")
            t.done()
            self._declare(t, name)
            self.locals[name] = LType(dtype, lanes)
            return Local(name, LType(dtype, lanes), count)
        if first is not None and (first == "prefetch" or first.startswith("prefetch.l")) \
                and t.kind(1) == "name":
            t.next()
            level = first[len("prefetch.l"):] if first != "prefetch" else ""
            if level and (not level.isdigit() or not 1 <= int(level) <= 3):
                t.fail(f"unknown prefetch level {first!r}")
            buffer = self._buffer(t, t.name())
            t.expect("[")
            index = self.expr(t)
            t.expect("]")
            t.done()
            return Prefetch(buffer.name, index, 4 - int(level) if level else 3)
        if first == "stream" and t.kind(1) == "name" and t.peek(2) == "[":
            t.next()
            store = self._store(t)
            if not isinstance(store, Store):
                t.fail("a streaming store writes a buffer, not a local")
            return replace(store, streaming=True)
        return self._store(t)

    def _for(self, t: _Tokens, indent: int) -> For:
        kind = _KINDS[t.next()] if t.peek() in _KINDS else LoopKind.SERIAL
        t.expect("for")
        name = t.name()
        t.expect("in")
        start = self.expr(t)
        t.expect("..")
        stop = self.expr(t)
        step = 1
        if t.peek() == "step":
            t.next()
            step = t.integer()
        t.expect(":")
        t.done()
        self._declare(t, name)
        self.names[name] = I64
        return For(name, start, stop, step, kind, self.block(indent + 1))

    def _store(self, t: _Tokens) -> Stmt:
        name = t.name()
        t.expect("[")
        index = self.expr(t)
        lanes = 1
        if t.peek() == ":":
            t.next()
            t.expect("+")
            lanes = t.integer()
        t.expect("]")
        t.expect("=")
        value = self.expr(t)
        t.done()
        if name in self.locals and lanes == 1:
            return LocalStore(name, index, value)
        if value.lanes != lanes:
            t.fail(f"a store of {value.lanes} lanes written as {lanes}")
        self._buffer(t, name)
        return Store(name, index, value)

    @staticmethod
    def _ltype(t: _Tokens) -> tuple[DType, int]:
        """A local's type: ``f32`` or ``f32x16`` (one name token)."""
        text = t.name()
        match = re.fullmatch(r"([a-z]+\d*)x(\d+)", text)
        name, lanes = (match[1], int(match[2])) if match else (text, 1)
        if name not in _DTYPES or lanes < 1:
            t.fail(f"unknown type {text!r}")
        return _DTYPES[name], lanes

    def _buffer(self, t: _Tokens, name: str) -> BufferParam:
        buffer = self.buffers.get(name)
        if buffer is None:
            t.fail(f"unknown buffer {name!r}")
        return buffer  # type: ignore[return-value]

    # ---- expressions --------------------------------------------------------------------------
    def expr(self, t: _Tokens) -> Expr:
        left = self._additive(t)
        op = _COMPARE.get(t.peek() or "")
        if op is None:
            return left
        t.next()
        right = self._additive(t)
        return Expr(op, BOOL.with_lanes(left.lanes), (left, right))

    def _additive(self, t: _Tokens) -> Expr:
        left = self._multiplicative(t)
        while t.peek() in ("+", "-"):
            op = _INFIX[t.next()]
            left = Expr(op, left.type, (left, self._multiplicative(t)))
        return left

    def _multiplicative(self, t: _Tokens) -> Expr:
        left = self._unary(t)
        while t.peek() in ("*", "/", "//", "%"):
            op = _INFIX[t.next()]
            left = Expr(op, left.type, (left, self._unary(t)))
        return left

    def _unary(self, t: _Tokens) -> Expr:
        if t.peek() != "-":
            return self._atom(t)
        t.next()
        if t.kind() == "num" or t.peek() in ("inf", "nan"):
            return self._constant(t, negative=True)
        operand = self._unary(t)
        return Expr(XOp.NEG, operand.type, (operand,))

    def _constant(self, t: _Tokens, *, negative: bool = False) -> Expr:
        text = t.next()
        value: int | float | bool
        if text in ("True", "False"):
            value = text == "True"
        elif text in ("inf", "nan") or not text.isdigit():
            value = float(text)
        else:
            value = int(text)
        if negative:
            value = -value
        dtype = {bool: DType.bool, int: DType.i64, float: DType.f32}[type(value)]
        if t.peek() == ":" and t.peek(1) in _DTYPES:
            t.next()
            dtype = t.dtype()
        return Expr(XOp.CONST, LType(dtype), (), value)

    def _lanes(self, t: _Tokens) -> int:
        t.expect("<")
        lanes = t.integer()
        t.expect(">")
        return lanes

    def _atom(self, t: _Tokens) -> Expr:
        token, kind = t.peek(), t.kind()
        if token == "(":
            t.next()
            inner = self.expr(t)
            t.expect(")")
            return inner
        if kind == "num" or token in ("True", "False", "inf", "nan"):
            return self._constant(t)
        if kind != "name":
            t.fail(f"expected an expression, got {token!r}")
        name = t.next()
        if name == "iota" and t.peek() == "<":
            t.next()
            dtype, lanes = self._ltype(t)
            t.expect(">")
            return Expr(XOp.IOTA, LType(dtype, lanes))
        if name in ("load", "bcast", "splat", "cast") and t.peek() == "<":
            return self._special(t, name)
        if t.peek() == "[":
            t.next()
            index = self.expr(t)
            t.expect("]")
            if name in self.locals:
                return Expr(XOp.LOCAL_LOAD, self.locals[name], (index,), name)
            return Expr(XOp.LOAD, LType(self._buffer(t, name).dtype), (index,), name)
        if t.peek() == "(" and name in _CALLS and _CALLS[name] not in _NOT_CALLS:
            t.next()
            args: list[Expr] = []
            while t.peek() != ")":
                args.append(self.expr(t))
                if t.peek() == ",":
                    t.next()
            t.expect(")")
            return self._call(t, _CALLS[name], tuple(args))
        found = self.names.get(name) or _IMPLICIT.get(name)
        if found is None:
            t.fail(f"unknown name {name!r}")
        return Expr(XOp.VAR, found, (), name)  # type: ignore[arg-type]

    def _special(self, t: _Tokens, name: str) -> Expr:
        if name == "cast":
            t.expect("<")
            dtype = t.dtype()
            t.expect(">")
            t.expect("(")
            x = self.expr(t)
            t.expect(")")
            return Expr(XOp.CAST, LType(dtype, x.lanes), (x,))
        lanes = self._lanes(t)
        t.expect("(")
        if name == "load":
            buffer = self._buffer(t, t.name())
            t.expect(",")
            index = self.expr(t)
            t.expect(")")
            return Expr(XOp.LOAD, LType(buffer.dtype, lanes), (index,), buffer.name)
        if name == "splat":
            negative = t.peek() == "-"
            if negative:
                t.next()
            c = self._constant(t, negative=negative)
            t.expect(")")
            return Expr(XOp.CONST, c.type.with_lanes(lanes), (), c.arg)
        x = self.expr(t)
        t.expect(")")
        return Expr(XOp.BROADCAST, x.type.with_lanes(lanes), (x,))

    def _call(self, t: _Tokens, op: XOp, args: tuple[Expr, ...]) -> Expr:
        arity = 0 if op is XOp.THREAD_ID else 3 if op in (XOp.SELECT, XOp.FMA) else \
            1 if op in REDUCE or op in (XOp.NEG, XOp.NOT, XOp.ABS, XOp.ISNAN) or \
            op.value in _UNARY_MATH else 2
        if len(args) != arity:
            t.fail(f"{op} takes {arity} operands, got {len(args)}")
        if op is XOp.THREAD_ID:
            return Expr(op, I64)
        if op is XOp.SELECT:
            return Expr(op, args[1].type, args)
        if op in REDUCE:
            return Expr(op, args[0].type.scalar, args)
        if op is XOp.ISNAN or op in COMPARE:
            return Expr(op, BOOL.with_lanes(args[0].lanes), args)
        return Expr(op, args[0].type, args)


_IMPLICIT = {"simt.lane": I64}
"""Variables no declaration introduces: the warp lane of the GPU code generator's per-thread
form (``codegen/simt.py``)."""

_UNARY_MATH = {"exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin",
               "cos", "floor", "ceil", "round"}


def parse_function(text: str) -> LoopFunction:
    """The kernel ``text`` describes (the printer's format); ParseError when malformed."""
    if not isinstance(text, str):
        raise ParseError(f"loop IR text must be a str, got {type(text).__name__}")
    return _Parser(text).function()


__all__ = ["parse_function"]
