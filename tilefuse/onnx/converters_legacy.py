"""Converters for the forms ops had before opset 7 (opsets 1 to 6), where they differ from the
later ones (``onnx.defs.get_schema(op, version)`` holds each version's text):

- binary arithmetic, comparison and logic ops and ``Pow``, ``Gemm``: no NumPy broadcasting.
  Operands must have equal shapes unless ``broadcast=1``; then B (the smaller) is broadcast to
  A, its dims lined up with A's starting at ``axis`` (default: A's trailing dims);
- ``PRelu``: a 1-D slope of one entry per channel applies along axis 1;
- ``BatchNormalization`` and ``Dropout``: ``is_test`` (default 0: training, not supported);
- ``Reshape``: the shape is the ``shape`` attribute; ``Concat``: ``axis`` defaults to 1;
- ``Pad``: ``paddings`` instead of ``pads``; ``Split``: sizes from input 1 or ``split``;
- ``Tile``: inputs ``tiles`` and ``axis`` (one axis tiled); ``Cast``: ``to`` a type name.

The ``consumed_inputs`` attribute of opset-1 ops is an in-place hint and has no effect.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.onnx import converters_math, converters_nn, converters_shape
from tilefuse.onnx.context import NodeContext, Tensor

Converter = Callable[[NodeContext], list[Tensor]]


def legacy_operands(ctx: NodeContext) -> tuple[Tensor, Tensor]:
    """A and B of a binary op before opset 7, B reshaped so NumPy broadcasting means the old
    ``broadcast``/``axis`` rule (see the module docstring)."""
    a, b = ctx.input(0), ctx.input(1)
    if a.dtype is not b.dtype:
        raise ctx.error(f"inputs have different element types ({a.dtype}, {b.dtype})")
    if not ctx.attr("broadcast", 0):
        if a.shape != b.shape:
            raise ctx.error(f"shapes {list(a.shape)} and {list(b.shape)} differ and "
                            "broadcast=0 (before opset 7 operands broadcast only when asked)")
        return a, b
    if b.rank > a.rank:
        raise ctx.error(f"B (rank {b.rank}) cannot broadcast to A (rank {a.rank})")
    axis = ctx.attr("axis")
    start = a.rank - b.rank if axis is None else ctx.axis(int(axis), a.rank) if a.rank else 0
    if start + b.rank > a.rank:
        raise ctx.error(f"B {list(b.shape)} does not fit A {list(a.shape)} at axis {start}")
    for i, d in enumerate(b.shape):
        if d not in (1, a.shape[start + i]):
            raise ctx.error(f"B {list(b.shape)} does not broadcast to A {list(a.shape)} "
                            f"at axis {start}")
    trailing = a.rank - start - b.rank
    if trailing and b.rank:
        b = ctx.op("reshape", b, shape=b.shape + (1,) * trailing)
    return a, b


def _binary(name: str, integer_div: bool = False) -> Converter:
    def convert(ctx: NodeContext) -> list[Tensor]:
        a, b = legacy_operands(ctx)
        y = ctx.op(name, a, b)
        if integer_div and not a.dtype.is_float:
            y = ctx.cast(y, a.dtype)  # integers truncate, as in C
        return [y]
    return convert


def _pow(ctx: NodeContext) -> list[Tensor]:
    a, b = legacy_operands(ctx)
    return [ctx.op("pow", a, b)]


def _gemm(ctx: NodeContext) -> list[Tensor]:
    c = ctx.optional(2)
    if c is not None and not ctx.attr("broadcast", 0) and ctx.attr("beta", 1.0) != 0.0:
        m = ctx.input(0).shape[1 if ctx.attr("transA", 0) else 0]
        n = ctx.input(1).shape[0 if ctx.attr("transB", 0) else 1]
        if c.shape != (m, n):
            raise ctx.error(f"C {list(c.shape)} is not [{m}, {n}] and broadcast=0")
    return converters_math.CONVERTER_GEMM(ctx)


def _prelu(ctx: NodeContext) -> list[Tensor]:
    x, slope = ctx.input(0), ctx.input(1)
    if slope.dtype is not x.dtype:
        raise ctx.error(f"inputs have different element types ({x.dtype}, {slope.dtype})")
    if slope.rank == 1 and x.rank >= 2 and slope.shape[0] == x.shape[1] != 1:
        slope = ctx.op("reshape", slope, shape=(x.shape[1],) + (1,) * (x.rank - 2))
    neg = ctx.op("mul", x, slope)
    return [ctx.op("where", ctx.op("lt", x, ctx.scalar(0, x.dtype)), neg, x)]


def _require_test_mode(ctx: NodeContext) -> None:
    if not ctx.attr("is_test", 0):
        raise ctx.error("is_test=0 (training mode) is not supported; export the model for "
                        "inference")


def _batch_norm(ctx: NodeContext) -> list[Tensor]:
    _require_test_mode(ctx)
    return converters_nn.CONVERTER_BATCH_NORM(ctx)


def _dropout(ctx: NodeContext) -> list[Tensor]:
    _require_test_mode(ctx)
    outs = [ctx.input(0)]
    if ctx.outputs_wanted() > 1 and ctx.spec.outputs[1]:
        raise ctx.error("the mask output exists only in training mode")
    return outs


def _reshape(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    spec = ctx.attr("shape")
    if spec is None:
        raise ctx.error("attribute 'shape' is required")
    target = converters_shape.reshape_target(ctx, x.shape, tuple(int(d) for d in spec), False)
    return [x if target == x.shape else ctx.op("reshape", x, shape=target)]


def _concat(ctx: NodeContext) -> list[Tensor]:
    args = [t for t in ctx.inputs if t is not None]
    if not args or any(t.dtype is not args[0].dtype for t in args):
        raise ctx.error("needs inputs of one element type")
    axis = ctx.axis(int(ctx.attr("axis", 1)), args[0].rank)
    return [args[0] if len(args) == 1 else ctx.op("concat", *args, axis=axis)]


def _pad(ctx: NodeContext) -> list[Tensor]:
    pads = ctx.attr("paddings")
    if pads is None:
        raise ctx.error("attribute 'paddings' is required")
    return converters_shape.pad_with(ctx, tuple(int(p) for p in pads),
                                     ctx.attr("mode", "constant"),
                                     float(ctx.attr("value", 0.0)), None)


def _split(ctx: NodeContext) -> list[Tensor]:
    sizes = ctx.ints_input(1, "split")
    if sizes is None and ctx.attr("split") is not None:
        sizes = tuple(int(s) for s in ctx.attr("split"))
    return converters_shape.split_with(ctx, sizes)


def _tile(ctx: NodeContext) -> list[Tensor]:
    x = ctx.input(0)
    tiles, axis = ctx.ints_input(1, "tiles"), ctx.ints_input(2, "axis")
    if tiles is None or axis is None or len(tiles) != 1 or len(axis) != 1 or tiles[0] < 0:
        raise ctx.error("tiles and axis must be one non-negative count and one axis")
    a = ctx.axis(axis[0], x.rank)
    if tiles[0] == 0:
        return [ctx.const(np.zeros((*x.shape[:a], 0, *x.shape[a + 1:]), x.dtype.np))]
    return [x if tiles[0] == 1 else ctx.op("concat", *([x] * tiles[0]), axis=a)]


_TYPE_NAMES = {"FLOAT": DType.f32, "DOUBLE": DType.f64, "FLOAT16": DType.f16,
               "BFLOAT16": DType.bf16, "INT64": DType.i64, "INT32": DType.i32,
               "INT16": DType.i16, "INT8": DType.i8, "UINT8": DType.u8, "BOOL": DType.bool}


def _cast(ctx: NodeContext) -> list[Tensor]:
    to = ctx.attr("to")
    if isinstance(to, bytes):
        to = to.decode("utf-8", "replace")
    if not isinstance(to, str) or to.upper() not in _TYPE_NAMES:
        raise ctx.error(f"'to' {to!r} is not a supported type name "
                        f"({', '.join(_TYPE_NAMES)})")
    return [ctx.cast(ctx.input(0), _TYPE_NAMES[to.upper()])]


def _table() -> tuple[tuple[str, int, Converter], ...]:
    rows: list[tuple[str, int, Converter]] = [
        ("Add", 1, _binary("add")), ("Sub", 1, _binary("sub")), ("Mul", 1, _binary("mul")),
        ("Div", 1, _binary("div", integer_div=True)), ("Equal", 1, _binary("eq")),
        ("Less", 1, _binary("lt")), ("Greater", 1, _binary("gt")),
        ("And", 1, _binary("logical_and")), ("Or", 1, _binary("logical_or")),
        ("Xor", 1, _binary("logical_xor")), ("Pow", 1, _pow), ("Gemm", 1, _gemm),
        ("PRelu", 1, _prelu), ("BatchNormalization", 1, _batch_norm), ("Dropout", 1, _dropout),
        ("Reshape", 1, _reshape), ("Concat", 1, _concat), ("Pad", 1, _pad),
        ("Split", 1, _split), ("Tile", 1, _tile), ("Cast", 1, _cast),
    ]
    return tuple(rows)


CONVERTERS: tuple[tuple[str, int, Converter], ...] = _table()
