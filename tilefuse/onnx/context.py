"""What a converter works with: tensors that are graph values or known constants, and the
context of the ONNX node being converted.

Conversion happens per input signature, or once for a model's ``dim_param`` dims as symbols
(``Sym("batch_size")``). A :class:`Tensor` is either a graph :class:`Value` or a constant array
(an initializer, a Constant node, or the folded result of an op whose inputs are all constant).
A shape value computed from symbolic dims (``Shape`` of ``f32[batch_size,16]``) is a constant
too: an object array of ints and symbols, which folds through Gather, Concat, Unsqueeze,
Slice... like any constant and is read by Reshape; used as data, or by an op whose NumPy
reference cannot take symbols, it is an :class:`SymbolicShapeValue` error (and the model is
compiled per shape instead). :meth:`Emitter.op` builds every node through
:class:`GraphBuilder` (attributes validated, types inferred) and folds it with the op's NumPy
reference instead when all its inputs are constant and the result is small, so shape
computations (Shape, Gather, Concat, ... feeding a Reshape) end up as constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tilefuse.dtypes import DType, from_numpy
from tilefuse.errors import SourceLoc, TilefuseError
from tilefuse.graph.builder import GraphBuilder, infer_types, resolve_op
from tilefuse.graph.ir import Literal, Node, Value
from tilefuse.graph.types import Dim, Sym, SymProduct, TensorType, format_shape, is_static
from tilefuse.onnx.model import NodeSpec
from tilefuse.onnx.tensors import NeedsReference, OnnxError

FOLD_LIMIT = 1 << 16   # fold an all-constant op only when its result has at most this many elements
VALUE_LIMIT = 1 << 12  # a graph input needed as a constant is specialised on up to this size


class InputValueNeeded(OnnxError):
    """A converter needs the value of graph input ``input`` (a shape, axes, pads, ...) at
    import time; :class:`~tilefuse.onnx.compiled.OnnxModel` then compiles per value of it."""

    def __init__(self, message: str, *, input: str, op: str | None = None,
                 inputs: tuple[str, ...] | None = None):
        super().__init__(message, op=op, inputs=inputs)
        self.input = input


class SymbolicShapeValue(OnnxError):
    """A shape value holding symbols is used where only numbers will do (as data, in
    arithmetic): the import needs static shapes."""


def shape_value(dims: Sequence[Dim]) -> np.ndarray:
    """A shape as an int64 array, or an object array of ints and symbols when it has any."""
    if is_static(tuple(dims)):
        return np.asarray(dims, dtype=np.int64)
    arr = np.empty(len(dims), dtype=object)
    arr[:] = list(dims)
    return arr


def is_symbolic_value(arr: np.ndarray | None) -> bool:
    return arr is not None and arr.dtype == object


def symbolic_reshape_target(ctx: NodeContext, src: Sequence[Dim], spec: Sequence[Dim],
                            allowzero: bool) -> tuple[Dim, ...]:
    """ONNX Reshape's target when the input or the shape holds symbols: 0 copies the input
    dim, a -1 is inferred when the element counts divide to one dim (``768*batch*seq /
    (768*batch)`` is ``seq``); an error otherwise."""
    dims = [src[i] if isinstance(d, int) and d == 0 and not allowzero and i < len(src) else d
            for i, d in enumerate(spec)]
    if any(isinstance(d, int) and d < -1 for d in dims) or dims.count(-1) > 1:
        raise ctx.error(f"shape {list(spec)} is not a valid reshape target")
    total = SymProduct.of(tuple(src))
    if -1 in dims:
        rest = total.divide(SymProduct.of(tuple(d for d in dims if d != -1)))
        inferred = None if rest is None else rest.as_dim()
        if inferred is None:
            raise ctx.error(f"cannot infer the -1 in {list(spec)} from {list(src)} as one dim")
        dims[dims.index(-1)] = inferred
    if SymProduct.of(tuple(dims)) != total:
        raise ctx.error(f"cannot reshape {list(src)} to {list(spec)}")
    return tuple(dims)


class Tensor:
    """An ONNX value during conversion: a graph value, a constant, or both (a constant that a
    node has used gets one ``constant`` node, shared by later uses)."""

    __slots__ = ("const", "input_name", "type", "value")

    def __init__(self, type_: TensorType, value: Value | None = None,
                 const: np.ndarray | None = None, input_name: str | None = None):
        self.type = type_
        self.value = value
        self.const = const
        self.input_name = input_name  # the graph input this tensor is, if it is one

    @staticmethod
    def constant(array: np.ndarray) -> Tensor:
        arr = np.asarray(array)
        dtype = DType.i64 if is_symbolic_value(arr) else from_numpy(arr.dtype)
        return Tensor(TensorType(tuple(int(d) for d in arr.shape), dtype), const=arr)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape  # type: ignore[return-value]  # static during conversion

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    def __repr__(self) -> str:
        return f"Tensor({self.type}{', const' if self.const is not None else ''})"


class Emitter:
    """Builds the graph of one conversion; ``loc`` names the ONNX node being converted."""

    def __init__(self, builder: GraphBuilder):
        self.builder = builder
        self.loc: SourceLoc | None = None

    def value(self, t: Tensor) -> Value:
        if t.value is None:
            assert t.const is not None
            if is_symbolic_value(t.const):
                raise SymbolicShapeValue(f"the shape value {list(t.const.reshape(-1))} (from "
                                         "symbolic dims) is used as tensor data")
            t.value = self.builder.add1("constant", [], {"value": Literal(t.const)}, self.loc)
        return t.value

    def ops(self, name: str, inputs: Sequence[Tensor], attrs: dict[str, Any]) -> list[Tensor]:
        opdef = resolve_op(name)
        checked = opdef.validate_attrs(attrs)
        types = infer_types(opdef, [t.type for t in inputs], checked, self.loc)
        if all(t.const is not None for t in inputs) and all(
                is_static(t.shape) and math.prod(t.shape) <= FOLD_LIMIT for t in types):
            return self._fold(opdef, inputs, checked, types)
        values = self.builder.add(opdef, [self.value(t) for t in inputs], attrs, self.loc)
        return [Tensor(v.type, value=v) for v in values]


    def _fold(self, opdef: Any, inputs: Sequence[Tensor], attrs: Any,
              types: Sequence[TensorType]) -> list[Tensor]:
        """The op's NumPy reference on constant inputs. Shape values with symbols fold only
        through ops that move elements (each symbol is a sentinel int64 meanwhile)."""
        consts = [t.const for t in inputs]
        symbols: dict[int, Sym] = {}
        if any(is_symbolic_value(c) for c in consts):
            if opdef.name not in _MOVES or any(t.dtype is not DType.i64 for t in types):
                raise SymbolicShapeValue(f"{opdef.name} cannot compute on shape values with "
                                         f"symbolic dims {_shown(consts)}")
            consts = [_encode(c, symbols) for c in consts]
        result = opdef.reference(*consts, **dict(attrs))
        outs = result if isinstance(result, tuple) else (result,)
        return [Tensor(ty, const=_decode(np.asarray(o).astype(ty.dtype.np, copy=False),
                                         symbols)) for ty, o in zip(types, outs)]


_MOVES = frozenset({"take", "concat", "stack", "split", "expand_dims", "squeeze", "slice",
                    "reshape", "broadcast_to", "transpose", "cast", "identity"})
_SENTINEL = -(1 << 62)


def _encode(arr: np.ndarray | None, symbols: dict[int, Sym]) -> np.ndarray | None:
    """An object shape value as int64, each symbol a distinct sentinel (far below any size)."""
    if not is_symbolic_value(arr):
        return arr
    assert arr is not None
    codes = {s: k for k, s in symbols.items()}
    out = np.empty(arr.shape, dtype=np.int64)
    for index, v in np.ndenumerate(arr):
        if isinstance(v, Sym):
            code = codes.get(v)
            if code is None:
                code = codes[v] = _SENTINEL + len(symbols)
                symbols[code] = v
            out[index] = code
        else:
            out[index] = int(v)
    return out


def _decode(arr: np.ndarray, symbols: dict[int, Sym]) -> np.ndarray:
    if not symbols or arr.dtype != np.int64 or not (arr < _SENTINEL + len(symbols)).any():
        return arr
    out = arr.astype(object)
    for index, v in np.ndenumerate(arr):
        if int(v) in symbols:
            out[index] = symbols[int(v)]
    return out


def _shown(consts: Sequence[np.ndarray | None]) -> str:
    return ", ".join(str(list(c.reshape(-1))) for c in consts if is_symbolic_value(c))


Reconvert = Callable[[str, dict[str, Tensor]], tuple[Tensor, tuple[Node, ...]]]


class NodeContext:
    """One ONNX node being converted: its inputs (None where omitted), attributes and opset."""

    def __init__(self, spec: NodeSpec, opset: int, inputs: list[Tensor | None], em: Emitter,
                 reconvert: Reconvert | None = None):
        self.spec = spec
        self.opset = opset
        self.inputs = inputs
        self.em = em
        self._reconvert = reconvert

    def reconvert(self, target: str,
                  bindings: dict[str, Tensor]) -> tuple[Tensor, tuple[Node, ...]]:
        """The model's value ``target`` computed again from the tensors in ``bindings`` (by
        name) as graph values, with the graph nodes that compute it (see the importer)."""
        if self._reconvert is None:
            raise self.error("this node needs the model's graph, which this conversion lacks")
        return self._reconvert(target, bindings)

    # ---- errors ---------------------------------------------------------------------------

    @property
    def label(self) -> str:
        domain = self.spec.domain or "ai.onnx"
        return f"ONNX {self.spec.op_type} node {self.spec.name!r} ({domain} opset {self.opset})"

    def shapes(self) -> tuple[str, ...]:
        return tuple("none" if t is None else str(t.type) for t in self.inputs)

    def error(self, message: str) -> OnnxError:
        return OnnxError(message, op=self.label, inputs=self.shapes())

    def not_compiled(self, message: str) -> NeedsReference:
        """The error for attribute values or outputs the converter does not compile: the node
        then runs in onnx's reference where that has the op."""
        return NeedsReference(message, op=self.label, inputs=self.shapes())

    # ---- inputs and attributes ------------------------------------------------------------

    def input(self, i: int) -> Tensor:
        t = self.inputs[i] if i < len(self.inputs) else None
        if t is None:
            raise self.error(f"input {i} is required")
        return t

    def optional(self, i: int) -> Tensor | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def const_input(self, i: int, what: str) -> np.ndarray | None:
        """The constant value of optional input ``i``; an error if it is computed at run time."""
        t = self.optional(i)
        if t is None:
            return None
        if t.const is None:
            message = (f"{what} (input {i}) must be a constant or computable from shapes at "
                       "import time; tilefuse compiles static shapes")
            if t.input_name is not None and is_static(t.shape) \
                    and math.prod(t.shape) <= VALUE_LIMIT:  # type: ignore[arg-type]
                raise InputValueNeeded(message, input=t.input_name, op=self.label,
                                       inputs=self.shapes())
            raise self.error(message)
        return t.const

    def ints_input(self, i: int, what: str) -> tuple[int, ...] | None:
        """A 1-D integer constant input as ints (and symbols, for a shape computed from
        symbolic dims)."""
        arr = self.const_input(i, what)
        if arr is None:
            return None
        if arr.dtype.kind not in "iuO" or arr.ndim > 1:
            raise self.error(f"{what} must be a 1-D integer tensor, got {arr.dtype}"
                             f"{format_shape(arr.shape)}")
        return tuple(v if isinstance(v, Sym) else int(v)  # type: ignore[misc]
                     for v in arr.reshape(-1))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.spec.attrs.get(name, default)

    def outputs_wanted(self) -> int:
        return len(self.spec.outputs)

    # ---- building -------------------------------------------------------------------------

    def op(self, name: str, *inputs: Tensor, **attrs: Any) -> Tensor:
        outs = self.em.ops(name, inputs, attrs)
        if len(outs) != 1:
            raise TilefuseError(f"has {len(outs)} outputs", op=name)
        return outs[0]

    def ops(self, name: str, *inputs: Tensor, **attrs: Any) -> list[Tensor]:
        return self.em.ops(name, inputs, attrs)

    def const(self, array: Any, dtype: DType | None = None) -> Tensor:
        return Tensor.constant(np.asarray(array, dtype=None if dtype is None else dtype.np))

    def scalar(self, value: float | int | bool, dtype: DType) -> Tensor:
        return self.const(np.asarray(value).astype(dtype.np))

    def const_zeros(self, shape: tuple[int, ...], dtype: DType) -> Tensor:
        return self.const(np.zeros(shape, dtype=dtype.np))

    def slice_axis(self, t: Tensor, axis: int, start: int, stop: int, step: int = 1) -> Tensor:
        """``t[start:stop:step]`` along ``axis`` (NumPy semantics), the other axes whole."""
        axis = self.axis(axis, t.rank)
        starts, stops, steps = [0] * t.rank, list(t.shape), [1] * t.rank
        starts[axis], stops[axis], steps[axis] = start, stop, step
        return self.op("slice", t, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))

    def cast(self, t: Tensor, dtype: DType) -> Tensor:
        return t if t.dtype is dtype else self.op("cast", t, dtype=dtype)

    def axis(self, axis: int, rank: int) -> int:
        if not -rank <= axis < rank:
            raise self.error(f"axis {axis} is out of range for rank {rank}")
        return axis % rank
