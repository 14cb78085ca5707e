"""Arguments of a jitted function: which are traced, which are static, and the cache key.

An argument is *traced* when it is an ``np.ndarray`` (any rank) or a NumPy scalar (a 0-d
array); its part of the key is ``(shape, dtype)``. It is *static* when it is a Python scalar,
string, None, a dtype, or a tuple of those, or when its parameter is named in
``static_argnames``; its part of the key is ``("static", value key)``. Lists are rejected (pass
``np.asarray(...)`` for an array or a tuple for a static value); so is anything else.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np

from tilefuse.dtypes import DType, from_numpy
from tilefuse.errors import DTypeError, TraceError
from tilefuse.frontend.tracer import Tracer
from tilefuse.graph.types import Sym, TensorType

STATIC = "static"

ArrayPart = tuple[tuple[int, ...], np.dtype]
KeyPart = Hashable


class InlineCall(Exception):
    """Raised while computing a key when an argument is a tracer: the jitted function is being
    called from inside another trace and is inlined into it."""


def is_array_part(part: KeyPart) -> bool:
    return type(part[0]) is tuple  # type: ignore[index]


def array_part(value: Any) -> ArrayPart:
    return (value.shape, value.dtype)


def key_part(value: Any, static: bool) -> KeyPart:
    """The key part of one argument (the slow path: the fast path handles plain ndarrays)."""
    if isinstance(value, Tracer):
        raise InlineCall
    if static:
        return (STATIC, static_key(value, named=True))
    if isinstance(value, np.ndarray):
        if isinstance(value, (np.matrix, np.ma.MaskedArray)):
            raise TraceError(f"{type(value).__name__} arguments are not supported; pass "
                             "np.asarray(...)")
        return array_part(value)
    if isinstance(value, np.generic):
        return ((), value.dtype)
    if isinstance(value, list):
        raise TraceError("a list is not accepted as an argument of a jitted function: pass "
                         "np.asarray(...) for an array, or a tuple for a static value")
    return (STATIC, static_key(value, named=False))


def static_key(value: Any, *, named: bool) -> Hashable:
    """A hashable key that tells static values apart by type (1, 1.0 and True differ) and by
    value (-0.0 and 0.0 differ; nan equals nan)."""
    if isinstance(value, float) and type(value) is float:
        return (float, repr(value))
    if value is None or isinstance(value, (bool, int, str, bytes, type, np.dtype, DType,
                                           enum.Enum)):
        return (type(value), value)
    if isinstance(value, tuple):
        return (tuple, tuple(static_key(v, named=named) for v in value))
    if not named:
        what = "an array inside a tuple" if isinstance(value, np.ndarray) else \
            f"a {type(value).__name__}"
        raise TraceError(f"cannot pass {what} to a jitted function: arrays are traced, Python "
                         "scalars, strings, None and tuples of those are static; name other "
                         "hashable arguments in static_argnames")
    try:
        hash(value)
    except TypeError:
        raise TraceError(f"static argument of type {type(value).__name__} is not hashable, so "
                         "it cannot be part of the cache key") from None
    return (type(value), value)


def tensor_type(part: ArrayPart, label: str) -> TensorType:
    shape, dtype = part
    try:
        return TensorType(tuple(d if isinstance(d, Sym) else int(d) for d in shape),
                          from_numpy(dtype))
    except DTypeError as err:
        raise DTypeError(f"{label}: {err.message}") from None


def describe_part(part: KeyPart) -> str:
    """``f32[4,8]`` for arrays, ``static 3`` for static values."""
    if is_array_part(part):
        shape, dtype = part  # type: ignore[misc]
        try:
            name = from_numpy(dtype).value
        except DTypeError:
            name = str(dtype)
        return f"{name}[{','.join(str(d) for d in shape)}]"
    return f"static {_show_static(part[1])}"  # type: ignore[index]


def _show_static(key: Any) -> str:
    kind, payload = key
    if kind is tuple:
        items = [_show_static(k) for k in payload]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if kind is float:
        return str(payload)
    return repr(payload)


class ArgumentNames:
    """Names for a function's arguments (``arg 0 (x)``, graph input ``x``), and which
    parameters are static. Built once per jitted function."""

    def __init__(self, fn: Callable[..., Any], static_argnames: Iterable[str]):
        self.static_names = frozenset(static_argnames)
        self.positional: tuple[str, ...] = ()
        self.varargs: str | None = None
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):  # builtins without a signature
            params = []
        kinds = inspect.Parameter
        self.positional = tuple(p.name for p in params
                                if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD))
        self.varargs = next((p.name for p in params if p.kind is kinds.VAR_POSITIONAL), None)
        accepts_any = any(p.kind is kinds.VAR_KEYWORD for p in params) or not params
        known = {p.name for p in params}
        unknown = sorted(n for n in self.static_names if n not in known)
        if unknown and not accepts_any:
            raise TraceError(f"static_argnames names {', '.join(unknown)}: not a parameter "
                             f"of {getattr(fn, '__name__', fn)}")
        self.static_positions = frozenset(i for i, n in enumerate(self.positional)
                                          if n in self.static_names)

    def name(self, slot: int | str) -> str:
        """The parameter's name: ``x``, or ``args_2`` for the third of ``*args``."""
        if isinstance(slot, str):
            return slot
        if slot < len(self.positional):
            return self.positional[slot]
        return f"{self.varargs or 'arg'}_{slot - len(self.positional)}"

    def label(self, slot: int | str) -> str:
        """How logs and errors name an argument: ``arg 0 (x)`` or ``arg y`` for keywords."""
        return f"arg {slot}" if isinstance(slot, str) else f"arg {slot} ({self.name(slot)})"
