"""ONNX element types, TensorProtos and attributes as tilefuse / NumPy values, checked.

Every failure is an :class:`OnnxError` (a TilefuseError): an unsupported element type, a tensor
whose payload does not hold the number of elements its dims promise, a negative or huge dim.
Nothing here reads external data; :mod:`tilefuse.onnx.external_data` does that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from tilefuse.dtypes import DType
from tilefuse.errors import TilefuseError

MAX_DIM = 2**40          # a dim above this is rejected as corrupt
MAX_ELEMENTS = 2**40     # so is a tensor with more elements than this

_DTYPES = MappingProxyType({
    TensorProto.FLOAT: DType.f32, TensorProto.DOUBLE: DType.f64, TensorProto.FLOAT16: DType.f16,
    TensorProto.BFLOAT16: DType.bf16, TensorProto.INT64: DType.i64, TensorProto.INT32: DType.i32,
    TensorProto.INT16: DType.i16, TensorProto.INT8: DType.i8, TensorProto.UINT8: DType.u8,
    TensorProto.BOOL: DType.bool,
})


class OnnxError(TilefuseError):
    """A model tilefuse cannot import: malformed, unsafe, or using what tilefuse lacks."""


class NeedsReference(OnnxError):
    """A node whose op tilefuse converts, but not with these attribute values or outputs
    (MaxPool's Indices, a dilated AveragePool, Pad's wrap mode, ...): the importer runs it in
    onnx's reference instead where that has the op (:mod:`tilefuse.onnx.fallback`), else this
    is the import's error."""


def elem_type_name(code: int) -> str:
    try:
        return TensorProto.DataType.Name(code)
    except ValueError:
        return f"<unknown element type {code}>"


def elem_type_of(dtype: DType) -> int:
    """The ONNX element type code of a tilefuse dtype."""
    for code, dt in _DTYPES.items():
        if dt is dtype:
            return code
    raise OnnxError(f"dtype {dtype.value} has no ONNX element type")


def to_dtype(code: int, what: str) -> DType:
    """The tilefuse dtype of an ONNX element type code; OnnxError naming ``what`` if none."""
    dtype = _DTYPES.get(code)
    if dtype is None:
        supported = ", ".join(elem_type_name(c) for c in _DTYPES)
        raise OnnxError(f"{what} has element type {elem_type_name(code)}, which tilefuse does "
                        f"not support (supported: {supported})")
    return dtype


def check_dims(dims: Sequence[int], what: str) -> tuple[int, ...]:
    """Dims as ints; OnnxError for a negative or huge dim, or a huge element count."""
    out = tuple(int(d) for d in dims)
    for d in out:
        if d < 0 or d > MAX_DIM:
            raise OnnxError(f"{what} has dims {list(out)}: dim {d} is "
                            f"{'negative' if d < 0 else 'too large'}")
    if math.prod(out) > MAX_ELEMENTS:
        raise OnnxError(f"{what} has dims {list(out)}: too many elements")
    return out


_TYPED_FIELDS = ("float_data", "double_data", "int32_data", "int64_data", "uint64_data")


def _payload_count(t: TensorProto, dtype: DType) -> tuple[str, int]:
    """Which field holds the data and how many elements it holds."""
    if t.HasField("raw_data"):
        size = len(t.raw_data)
        if size % dtype.itemsize:
            return "raw_data", -1
        return "raw_data", size // dtype.itemsize
    for name in _TYPED_FIELDS:
        n = len(getattr(t, name))
        if n:
            return name, n
    return "none", 0


def tensor_to_array(t: TensorProto, what: str) -> np.ndarray:
    """The array of an in-memory TensorProto (external data must have been resolved into
    raw_data first), with its size checked against its dims before anything is decoded."""
    dtype = to_dtype(t.data_type, what)
    dims = check_dims(t.dims, what)
    if t.data_location == TensorProto.EXTERNAL:
        raise OnnxError(f"{what} keeps its data in an external file that was not resolved")
    if t.segment.begin or t.segment.end:
        raise OnnxError(f"{what} is a segmented tensor, which tilefuse does not read")
    count = math.prod(dims)
    field, have = _payload_count(t, dtype)
    if have != count:
        shown = "a size that is not a multiple of the element size" if have < 0 else have
        raise OnnxError(f"{what} ({elem_type_name(t.data_type)}{list(dims)}) needs {count} "
                        f"elements but its {field} holds {shown}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as err:  # onnx raises assorted errors on corrupt payloads
        raise OnnxError(f"{what} cannot be decoded: {type(err).__name__}: {err}") from None
    arr = np.asarray(arr)
    if arr.dtype != dtype.np:
        arr = arr.astype(dtype.np)
    return np.asarray(arr.reshape(dims), order="C")


def attribute_values(attrs: Sequence[AttributeProto], what: str) -> dict[str, Any]:
    """Node attributes by name: ints, floats, strings (decoded), lists, TensorProtos."""
    out: dict[str, Any] = {}
    for a in attrs:
        if a.name in out:
            raise OnnxError(f"{what} has attribute {a.name!r} twice")
        if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
            raise OnnxError(f"{what} has a subgraph attribute {a.name!r}; tilefuse does not "
                            "import control flow")
        try:
            value = helper.get_attribute_value(a)
        except Exception as err:
            raise OnnxError(f"{what} has an unreadable attribute {a.name!r}: {err}") from None
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", errors="replace") for v in value]
        out[a.name] = value
    return out
