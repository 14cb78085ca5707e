"""The graph's text form. :func:`print_graph` writes it and :mod:`tilefuse.graph.parser` reads it.

```
graph @ffn(%x: f32[512,768], %w: f32[768,3072], %b: f32[3072]) -> f32[512,3072] {
  %0 = matmul(%x, %w) : f32[512,3072]
  %1 = add(%0, %b) : f32[512,3072]  # model.py:12 in forward
  %2, %3 = split(%1) {axis=1, sizes=[1536,1536]} : f32[512,1536], f32[512,1536]
  return %2
}
```

Graph inputs print under their names (unique identifiers; others get ``%argN``), node outputs
are numbered in definition order. The result list is bare for one result and parenthesised
otherwise. Attribute values: ints, floats (``repr``, so they round-trip exactly; ``inf``, ``-inf``,
``nan``), JSON-escaped strings, ``true``/``false``/``none``, nested ``[lists]``, dtypes and
symbols as bare names (``sym("f32")`` for a symbol whose name is not a plain identifier or is a
reserved word) and arrays as ``array<f32[2,3]>[[...],[...]]`` (small), ``array<f32[n]>b64("...")``
(raw little-endian bytes) or, when asked, ``array<f32[n]>elided("<sha1>")``, which the parser
refuses. A node's source location is a trailing comment that the parser reads back.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.errors import SourceLoc
from tilefuse.graph.ir import Attrs, Graph, Literal, Value
from tilefuse.graph.types import Dim, Sym, TensorType

SMALL_LITERAL_ELEMENTS = 64
"""Arrays with at most this many elements print as nested lists; larger ones as base64."""

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
RESERVED_WORDS = frozenset({"true", "false", "none", "inf", "nan", "array", "sym", "graph",
                            "return"} | {t.value for t in DType})
_LOC_PLAIN = re.compile(r"(?P<file>.+):(?P<line>\d+)(?: in (?P<fn>\S+))?\Z", re.DOTALL)


def is_identifier(name: object) -> bool:
    """Whether ``name`` prints bare: a letter or ``_``, then letters, digits, ``_`` or ``.``."""
    return isinstance(name, str) and _IDENT.match(name) is not None


# ---- types -----------------------------------------------------------------------------------


def format_dim(d: Dim) -> str:
    if isinstance(d, Sym):
        return d.name if is_identifier(d.name) else json.dumps(d.name)
    return str(d)


def format_type(t: TensorType) -> str:
    """``f32[batch,768]``; a scalar is ``f32[]``."""
    return f"{t.dtype.value}[{','.join(format_dim(d) for d in t.shape)}]"


def format_types(types: Sequence[TensorType]) -> str:
    """A result list: bare for one type, parenthesised otherwise."""
    if len(types) == 1:
        return format_type(types[0])
    return "(" + ", ".join(format_type(t) for t in types) + ")"


# ---- literals --------------------------------------------------------------------------------


def format_scalar(x: Any, dtype: DType) -> str:
    """One array element in the text form of ``dtype``."""
    if dtype is DType.bool:
        return "true" if bool(x) else "false"
    if not dtype.is_float:
        return str(int(x))
    if dtype in (DType.f32, DType.f16):
        return str(dtype.np.type(x))  # shortest form that reads back in that dtype
    return repr(float(x))  # exact for f64, and for bf16 (every bf16 is a short f64)


def elements_to_array(flat: Sequence[Any], type_: TensorType) -> np.ndarray:
    """The array of ``type_`` holding the parsed elements ``flat`` (bools, ints, floats)."""
    dtype = type_.dtype
    if dtype.is_float:
        wide = np.array([float(v) for v in flat], dtype=np.float64)
        arr = wide.astype(dtype.np)
    else:
        arr = np.array([bool(v) if dtype is DType.bool else int(v) for v in flat],
                       dtype=dtype.np)
    return arr.reshape(tuple(int(d) for d in type_.shape))


def _nested(flat: list[str], shape: tuple[int, ...]) -> str:
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return "[" + ",".join(flat) + "]"
    step = math.prod(shape[1:])
    parts = [_nested(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
    return "[" + ",".join(parts) + "]"


def _literal_text(lit: Literal) -> str | None:
    """The nested-list form of ``lit``, or None when that form would not read back bit-exactly
    (NaN payloads, a shortest form that rounds differently through f64)."""
    dtype = lit.dtype
    flat_arr = lit.array.reshape(-1)
    flat = [format_scalar(x, dtype) for x in flat_arr]
    values = [_read_scalar(s) for s in flat]
    back = elements_to_array(values, lit.type)
    if back.tobytes() != lit.array.tobytes():
        if dtype not in (DType.f32, DType.f16):
            return None
        flat = [repr(float(x)) for x in flat_arr]
        back = elements_to_array([float(s) for s in flat], lit.type)
        if back.tobytes() != lit.array.tobytes():
            return None
    return _nested(flat, tuple(int(d) for d in lit.array.shape))


def _read_scalar(text: str) -> bool | int | float:
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return float(text)


def format_literal(lit: Literal, *, elide_constants_over: int | None = None) -> str:
    head = f"array<{format_type(lit.type)}>"
    size = lit.array.size
    if elide_constants_over is not None and size > elide_constants_over:
        return f'{head}elided("{lit.digest}")'
    text = _literal_text(lit) if size <= SMALL_LITERAL_ELEMENTS else None
    if text is not None:
        return head + text
    raw = lit.array.astype(lit.array.dtype.newbyteorder("<"), copy=False).tobytes()
    return f'{head}b64("{base64.b64encode(raw).decode("ascii")}")'


# ---- attributes ------------------------------------------------------------------------------


def format_attr_value(value: Any, *, elide_constants_over: int | None = None) -> str:
    """One attribute value. Values the text form cannot express print as ``<unprintable ...>``,
    which the parser rejects, so a round trip fails loudly instead of losing them."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        return json.dumps(str(value))
    if isinstance(value, DType):
        return value.value
    if isinstance(value, Sym):
        plain = is_identifier(value.name) and value.name not in RESERVED_WORDS
        return value.name if plain else f"sym({json.dumps(value.name)})"
    if isinstance(value, Literal):
        return format_literal(value, elide_constants_over=elide_constants_over)
    if isinstance(value, tuple):
        inner = ",".join(format_attr_value(v, elide_constants_over=elide_constants_over)
                         for v in value)
        return f"[{inner}]"
    return f"<unprintable {type(value).__name__}: {value!r}>".replace("\n", " ")


def format_attrs(attrs: Attrs, *, elide_constants_over: int | None = None) -> str:
    """`` {a=1, b="x"}`` (with the leading space), or the empty string for no attributes."""
    if not attrs:
        return ""
    body = ", ".join(f"{k}={format_attr_value(v, elide_constants_over=elide_constants_over)}"
                     for k, v in attrs.items())
    return " {" + body + "}"


# ---- source locations ------------------------------------------------------------------------


def parse_loc_comment(body: str) -> SourceLoc | None:
    """The SourceLoc a node's trailing comment (without the ``#``) names, if it names one."""
    body = body.strip()
    if body.startswith("loc ["):
        try:
            file, line, function = json.loads(body[4:])
        except (ValueError, TypeError):
            return None
        ok = isinstance(file, str) and isinstance(function, str) and type(line) is int
        return SourceLoc(file, line, function) if ok else None
    m = _LOC_PLAIN.match(body)
    if m is None:
        return None
    return SourceLoc(m["file"], int(m["line"]), m["fn"] or "")


def format_loc(loc: SourceLoc) -> str:
    """``model.py:12 in forward``, or a JSON form for names that would not read back."""
    plain = f"{loc.file}:{loc.line}" + (f" in {loc.function}" if loc.function else "")
    if plain.isprintable() and parse_loc_comment(plain) == loc:
        return plain
    return "loc " + json.dumps([loc.file, loc.line, loc.function])


# ---- graphs ----------------------------------------------------------------------------------


def input_names(inputs: Sequence[Value]) -> list[str]:
    """The printed names of graph inputs: their own when they are unique identifiers, else
    ``argN`` (N the position, with a suffix if that name is taken)."""
    counts: dict[str, int] = {}
    for v in inputs:
        if v.name is not None:
            counts[v.name] = counts.get(v.name, 0) + 1
    taken = {n for n, c in counts.items() if c == 1 and is_identifier(n)}
    names = []
    for i, v in enumerate(inputs):
        if v.name in taken:
            names.append(v.name)
            continue
        name, k = f"arg{i}", 0
        while name in taken:
            k += 1
            name = f"arg{i}_{k}"
        taken.add(name)
        names.append(name)
    return names


def graph_name(name: str) -> str:
    return name if is_identifier(name) else json.dumps(name)


def print_graph(graph: Graph, *, elide_constants_over: int | None = None,
                locations: bool = True) -> str:
    """The text form of ``graph``. Arrays over ``elide_constants_over`` elements print as their
    digest (not parseable); ``locations=False`` leaves out the source-location comments."""
    names: dict[Value, str] = {}
    params = []
    for value, name in zip(graph.inputs, input_names(graph.inputs)):
        names.setdefault(value, f"%{name}")
        params.append(f"%{name}: {format_type(value.type)}")
    undefined: dict[Value, str] = {}

    def ref(v: Value) -> str:
        if v in names:
            return names[v]
        return undefined.setdefault(v, f"%?{len(undefined)}")

    lines = []
    counter = 0
    for node in graph.nodes:
        for v in node.outputs:
            if v not in names:
                names[v] = f"%{counter}"
                counter += 1
        lhs = ", ".join(names[v] for v in node.outputs)
        args = ", ".join(ref(v) for v in node.inputs)
        attrs = format_attrs(node.attrs, elide_constants_over=elide_constants_over)
        types = ", ".join(format_type(v.type) for v in node.outputs) or "()"
        text = f"{node.op.name}({args}){attrs} : {types}"
        line = f"  {lhs} = {text}" if lhs else f"  {text}"
        if locations and node.loc is not None:
            line += f"  # {format_loc(node.loc)}"
        lines.append(line)
    results = format_types([v.type for v in graph.outputs])
    head = f"graph @{graph_name(graph.name)}({', '.join(params)}) -> {results} {{"
    ret = "  return" + ("" if not graph.outputs else " " + ", ".join(ref(v) for v in graph.outputs))
    return "\n".join([head, *lines, ret, "}"]) + "\n"
