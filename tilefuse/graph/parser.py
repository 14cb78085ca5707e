"""Reads the text form written by :mod:`tilefuse.graph.printer` back into a :class:`Graph`.

Nodes are built through :class:`GraphBuilder`, so attributes are validated and output types are
re-inferred by the op's rules; a printed type that disagrees with the inferred one is an error.
Every failure, for any input string, is a :class:`ParseError` naming the line and column.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import ParseError, SourceLoc, TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal, Value
from tilefuse.graph.printer import elements_to_array, format_type, parse_loc_comment
from tilefuse.graph.types import Dim, Sym, TensorType

MAX_NESTING = 64

# Quoted forms are "[^"\\\n]*(?:\\.[^"\\\n]*)*" (a run of plain characters, then escapes each
# followed by another run) rather than "(?:[^"\\\n]|\\.)*": the same strings, but the engine
# takes a run in one step instead of one alternation per character, which made tokenizing a graph
# with large base64 constants (a BERT layer's weights, ~40 MB of text) take seconds per string.
_TOKEN = re.compile(r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<comment>\#[^\n]*)
  | (?P<undef>%\?\d+)
  | (?P<value>%(?:[A-Za-z_][A-Za-z0-9_.]*|\d+))
  | (?P<global>@(?:[A-Za-z_][A-Za-z0-9_.]*|"[^"\\\n]*(?:\\.[^"\\\n]*)*"))
  | (?P<float>-?(?:\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+))
  | (?P<int>-?\d+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<string>"[^"\\\n]*(?:\\.[^"\\\n]*)*")
  | (?P<arrow>->)
  | (?P<punct>[-()\[\]{}<>,=:])
""", re.VERBOSE)


@dataclass(frozen=True)
class Token:
    kind: str   # ident, value, global, int, float, string, punct, arrow, eof
    text: str
    line: int
    col: int


def parse_error(message: str, line: int, col: int) -> ParseError:
    """A ParseError whose message starts with the position; ``line``/``column`` attributes too."""
    err = ParseError(f"line {line}, column {col}: {message}")
    err.line = line  # type: ignore[attr-defined]
    err.column = col  # type: ignore[attr-defined]
    return err


def tokenize(text: str) -> tuple[list[Token], dict[int, str]]:
    """The tokens of ``text`` and the comments by line (without the ``#``)."""
    tokens: list[Token] = []
    comments: dict[int, str] = {}
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        col = pos - line_start + 1
        if m is None:
            raise parse_error(f"unexpected character {text[pos]!r}", line, col)
        kind, value = m.lastgroup or "", m.group()
        if kind == "undef":
            raise parse_error(f"{value} is a use of a value that the printed graph never "
                              "defined (it was printed from a graph that does not verify)",
                              line, col)
        if kind == "comment":
            comments[line] = value[1:]
        elif kind != "ws":
            tokens.append(Token(kind, value, line, col))
        newlines = value.count("\n")
        if newlines:
            line += newlines
            line_start = pos + value.rindex("\n") + 1
        pos = m.end()
    tokens.append(Token("eof", "", line, pos - line_start + 1))
    return tokens, comments


def _unquote(tok: Token) -> str:
    try:
        value = json.loads(tok.text)
    except ValueError as exc:
        raise parse_error(f"bad string literal {tok.text}: {exc}", tok.line, tok.col) from None
    return value


def parse_graph(text: str) -> Graph:
    """The graph written in ``text``; ParseError with line and column if it is not valid."""
    if not isinstance(text, str):
        raise ParseError(f"graph text must be a str, got {type(text).__name__}")
    tokens, comments = tokenize(text)
    return _Parser(tokens, comments).graph()


def parse_attr_value(text: str) -> Any:
    """One attribute value in the text form (``[1,2]``, ``"s"``, ``array<f32[2]>[1.0,2.0]``...)."""
    if not isinstance(text, str):
        raise ParseError(f"attribute text must be a str, got {type(text).__name__}")
    tokens, comments = tokenize(text)
    parser = _Parser(tokens, comments)
    value = parser.attr_value(0)
    parser.expect("eof", what="end of input after the value")
    return value


class _Parser:
    def __init__(self, tokens: list[Token], comments: dict[int, str]):
        self.tokens = tokens
        self.comments = comments
        self.pos = 0
        self.env: dict[str, Value] = {}
        self.builder = GraphBuilder()

    # ---- token helpers ----

    def peek(self, offset: int = 0) -> Token:
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def next(self) -> Token:
        tok = self.peek()
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return tok

    def error(self, message: str, tok: Token | None = None) -> ParseError:
        tok = tok or self.peek()
        return parse_error(message, tok.line, tok.col)

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        return tok.kind == kind and (text is None or tok.text == text)

    def accept(self, kind: str, text: str | None = None) -> Token | None:
        return self.next() if self.at(kind, text) else None

    def expect(self, kind: str, text: str | None = None, what: str | None = None) -> Token:
        if not self.at(kind, text):
            tok = self.peek()
            found = "end of input" if tok.kind == "eof" else repr(tok.text)
            raise self.error(f"expected {what or repr(text) or kind}, found {found}")
        return self.next()

    def comma_list(self, close: str, item: Any) -> list[Any]:
        """Items separated by commas up to (and consuming) the punctuation ``close``."""
        items: list[Any] = []
        if self.accept("punct", close):
            return items
        while True:
            items.append(item())
            if self.accept("punct", close):
                return items
            self.expect("punct", ",", f"',' or {close!r}")

    # ---- graph structure ----

    def graph(self) -> Graph:
        self.expect("ident", "graph")
        name_tok = self.expect("global", what="a graph name such as @main")
        body = name_tok.text[1:]
        self.builder.name = _unquote(Token("string", body, name_tok.line, name_tok.col)) \
            if body.startswith('"') else body
        self.expect("punct", "(")
        self.comma_list(")", self.param)
        self.expect("arrow", what="'->'")
        results = self.result_types()
        self.expect("punct", "{")
        while not self.at("ident", "return"):
            self.statement()
        ret = self.next()
        outputs: list[Value] = []
        if not self.at("punct", "}"):
            outputs.append(self.use())
            while self.accept("punct", ","):
                outputs.append(self.use())
        self.expect("punct", "}")
        self.expect("eof", what="end of input after '}'")
        actual = [v.type for v in outputs]
        if actual != results:
            shown = ", ".join(format_type(t) for t in actual) or "nothing"
            declared = ", ".join(format_type(t) for t in results) or "nothing"
            raise self.error(f"the graph declares results {declared} but returns {shown}", ret)
        return self.builder.build(outputs)

    def param(self) -> None:
        tok = self.expect("value", what="a parameter such as %x")
        if tok.text[1:].isdigit():
            raise self.error(f"parameter {tok.text} must be named by an identifier (such as "
                             "%x); numbers name node results", tok)
        self.expect("punct", ":")
        self.define(tok, self.builder.input(self.type_(), tok.text[1:]))

    def result_types(self) -> list[TensorType]:
        if self.accept("punct", "("):
            return self.comma_list(")", self.type_)
        return [self.type_()]

    def define(self, tok: Token, value: Value) -> None:
        if tok.text in self.env:
            raise self.error(f"{tok.text} is defined twice", tok)
        self.env[tok.text] = value

    def use(self) -> Value:
        tok = self.expect("value", what="a value such as %0")
        if tok.text not in self.env:
            raise self.error(f"use of undefined value {tok.text}", tok)
        return self.env[tok.text]

    def statement(self) -> None:
        first = self.peek()
        lhs: list[Token] = []
        if first.kind == "value":
            lhs.append(self.next())
            while self.accept("punct", ","):
                lhs.append(self.expect("value", what="a result name such as %1"))
            self.expect("punct", "=")
        op_tok = self.expect("ident", what="an op name or 'return'")
        self.expect("punct", "(")
        args = self.comma_list(")", self.use)
        attrs = self.attrs() if self.at("punct", "{") else {}
        self.expect("punct", ":")
        printed = self.node_types()
        loc = self.trailing_loc()
        self.add_node(first, op_tok, args, attrs, loc, lhs, printed)

    def node_types(self) -> list[TensorType]:
        if self.accept("punct", "("):
            self.expect("punct", ")", "')' (a node with no results prints ': ()')")
            return []
        types = [self.type_()]
        while self.accept("punct", ","):
            types.append(self.type_())
        return types

    def trailing_loc(self) -> SourceLoc | None:
        """The location in a comment on the line where the statement ends, if it ends the line."""
        last = self.tokens[self.pos - 1].line
        if self.peek().line == last and self.peek().kind != "eof":
            return None
        body = self.comments.get(last)
        return parse_loc_comment(body) if body is not None else None

    def add_node(self, first: Token, op_tok: Token, args: list[Value], attrs: dict[str, Any],
                 loc: SourceLoc | None, lhs: list[Token], printed: list[TensorType]) -> None:
        try:
            outs = self.builder.add(op_tok.text, args, attrs, loc)
        except TilefuseError as err:
            raise self.error(str(err), op_tok) from None
        except (ArithmeticError, ValueError, TypeError, LookupError, RecursionError) as err:
            raise self.error(f"{op_tok.text}: rules failed ({type(err).__name__}: {err})",
                             op_tok) from None
        if len(outs) != len(lhs):
            raise self.error(f"{op_tok.text} has {len(outs)} results, the text names "
                             f"{len(lhs)}", first)
        inferred = [v.type for v in outs]
        if inferred != printed:
            shown = ", ".join(format_type(t) for t in printed) or "()"
            want = ", ".join(format_type(t) for t in inferred) or "()"
            raise self.error(f"{op_tok.text}: the text says {shown} but the op's rules infer "
                             f"{want}", op_tok)
        for tok, value in zip(lhs, outs):
            self.define(tok, value)

    # ---- types ----

    def dtype(self) -> DType:
        tok = self.expect("ident", what="a dtype such as f32")
        try:
            return DType(tok.text)
        except ValueError:
            known = ", ".join(t.value for t in DType)
            raise self.error(f"unknown dtype {tok.text!r} (known: {known})", tok) from None

    def type_(self) -> TensorType:
        dtype = self.dtype()
        self.expect("punct", "[")
        return TensorType(tuple(self.comma_list("]", self.dim)), dtype)

    def dim(self) -> Dim:
        tok = self.next()
        if tok.kind == "int" and not tok.text.startswith("-"):
            return self.integer(tok)
        if tok.kind == "ident":
            return Sym(tok.text)
        if tok.kind == "string":
            return Sym(_unquote(tok))
        raise self.error(f"expected a dim (a size >= 0 or a symbol), found {tok.text!r}", tok)

    # ---- attributes ----

    def attrs(self) -> dict[str, Any]:
        self.expect("punct", "{")
        result: dict[str, Any] = {}

        def item() -> None:
            key = self.expect("ident", what="an attribute name")
            self.expect("punct", "=")
            if key.text in result:
                raise self.error(f"attribute {key.text!r} is given twice", key)
            result[key.text] = self.attr_value(0)

        self.comma_list("}", item)
        return result

    def attr_value(self, depth: int) -> Any:
        if depth > MAX_NESTING:
            raise self.error(f"lists nested more than {MAX_NESTING} deep")
        tok = self.peek()
        if tok.kind in ("int", "float") or tok.text in ("-", "inf", "nan"):
            return self.number()
        if tok.kind == "string":
            return _unquote(self.next())
        if self.accept("punct", "["):
            return tuple(self.comma_list("]", lambda: self.attr_value(depth + 1)))
        if tok.kind != "ident":
            raise self.error(f"expected an attribute value, found {tok.text or 'end of input'!r}")
        self.next()
        constants = {"true": True, "false": False, "none": None}
        if tok.text in constants:
            return constants[tok.text]
        if tok.text == "array":
            return self.array()
        if tok.text == "sym":
            self.expect("punct", "(")
            name = _unquote(self.expect("string", what="a quoted symbol name"))
            self.expect("punct", ")")
            return Sym(name)
        if tok.text in DType.__members__:
            return DType(tok.text)
        return Sym(tok.text)

    def integer(self, tok: Token) -> int:
        try:
            return int(tok.text)
        except ValueError as err:  # more digits than Python converts
            raise self.error(f"integer too long: {err}", tok) from None

    def number(self) -> int | float:
        """An int, a float, ``inf``, ``-inf`` or ``nan``."""
        tok = self.next()
        if tok.kind == "int":
            return self.integer(tok)
        if tok.kind == "float":
            return float(tok.text)
        if tok.text in ("inf", "nan"):
            return float(tok.text)
        if tok.text == "-" and self.accept("ident", "inf"):
            return -math.inf
        raise self.error(f"expected a number, found {tok.text or 'end of input'!r}", tok)

    # ---- array literals ----

    def array(self) -> Literal:
        start = self.peek()
        self.expect("punct", "<")
        type_ = self.type_()
        self.expect("punct", ">")
        if not type_.is_static:
            raise self.error(f"an array literal needs a static shape, got {type_}", start)
        shape = tuple(int(d) for d in type_.shape)  # type: ignore[arg-type]
        if self.at("ident", "elided") or self.at("ident", "b64"):
            kind = self.next()
            self.expect("punct", "(")
            payload = _unquote(self.expect("string", what="a quoted payload"))
            self.expect("punct", ")")
            if kind.text == "elided":
                raise self.error(f"this constant ({type_}, sha1 {payload}) was elided when the "
                                 "graph was printed; print it with elide_constants_over=None "
                                 "to keep its value", kind)
            return Literal(self.decode_b64(payload, type_, shape, kind))
        flat: list[Any] = []
        self.elements(shape, type_.dtype, flat, 0)
        try:
            return Literal(elements_to_array(flat, type_))
        except (ArithmeticError, ValueError, TypeError) as err:
            raise self.error(f"array values do not fit {type_}: {err}", start) from None

    def decode_b64(self, payload: str, type_: TensorType, shape: tuple[int, ...],
                   tok: Token) -> np.ndarray:
        try:
            raw = base64.b64decode(payload.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError) as err:
            raise self.error(f"bad base64 payload: {err}", tok) from None
        expected = math.prod(shape) * type_.dtype.itemsize
        if len(raw) != expected:
            raise self.error(f"{type_} needs {expected} bytes, the payload has {len(raw)}", tok)
        try:
            little = np.frombuffer(raw, dtype=type_.dtype.np.newbyteorder("<"))
            return little.astype(type_.dtype.np).reshape(shape)
        except ValueError as err:
            raise self.error(f"cannot read {type_}: {err}", tok) from None

    def elements(self, shape: tuple[int, ...], dtype: DType, out: list[Any], depth: int) -> None:
        """Reads a nested list (or, for rank 0, one scalar) shaped exactly like ``shape``."""
        if depth > MAX_NESTING:
            raise self.error(f"array nested more than {MAX_NESTING} deep")
        if not shape:
            out.append(self.element(dtype))
            return
        start = self.expect("punct", "[", "'[' (array literal row)")
        items = self.comma_list("]", lambda: self.elements(shape[1:], dtype, out, depth + 1))
        if len(items) != shape[0]:
            raise self.error(f"expected {shape[0]} entries here for shape {list(shape)}, "
                             f"found {len(items)}", start)

    def element(self, dtype: DType) -> bool | int | float:
        tok = self.peek()
        if dtype is DType.bool:
            if tok.text in ("true", "false") and tok.kind == "ident":
                self.next()
                return tok.text == "true"
            raise self.error(f"expected true or false, found {tok.text!r}")
        value = self.number()
        if not dtype.is_float and not isinstance(value, int):
            raise self.error(f"expected an integer for {dtype.value}, found {tok.text!r}", tok)
        return value
