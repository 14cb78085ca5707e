"""Errors while tracing: each is a TilefuseError that names the op or function and the user's
line (this file's name and line number)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from jitcheck import arr, rng

from tilefuse.errors import DTypeError, ShapeError, TilefuseError, TraceError
from tilefuse.frontend import jit
from tilefuse.frontend.tracer import TraceContext, Tracer


def line_of(marker: str) -> int:
    """The line number in this file of the line that ends with ``marker``."""
    with open(__file__) as f:
        lines = [i for i, text in enumerate(f, start=1) if text.rstrip().endswith(marker)]
    assert len(lines) == 1, marker
    return lines[0]


def assert_names_line(err: TilefuseError, marker: str) -> None:
    line = line_of(marker)
    text = str(err)
    assert os.path.basename(__file__) in text and f":{line}" in text, text
    assert err.loc is not None and (err.loc.file, err.loc.line) == (__file__, line)


def branchy(x):
    if x.sum() > 0:  # <data-dependent-if>
        return x
    return -x


def test_data_dependent_if_names_this_file_and_line():
    # fullgraph=True: a data-dependent branch is an error (without it, a graph break)
    with pytest.raises(TraceError) as info:
        jit(branchy, fullgraph=True)(arr(rng("if"), (3, 4)))
    assert "data-dependent" in str(info.value)
    assert_names_line(info.value, "# <data-dependent-if>")


def to_int(x):
    return x * int(x[0])  # <int>


def to_float(x):
    return x * float(x.max())  # <float>


def to_item(x):
    return x * x[0].item()  # <item>


def to_numpy(x):
    return np.asarray(x) + 1  # <asarray>


def loop_bound(x):
    return [x[i] for i in range(x[0])]  # <range>


def while_loop(x):
    while x.min() < 5:  # <while>
        x = x + 1
    return x


@pytest.mark.parametrize("fn,marker", [
    (to_int, "# <int>"), (to_float, "# <float>"), (to_item, "# <item>"),
    (to_numpy, "# <asarray>"), (loop_bound, "# <range>"), (while_loop, "# <while>"),
], ids=["int", "float", "item", "asarray", "range", "while"])
def test_every_concrete_value_request_is_data_dependent(fn, marker):
    x = arr(rng("concrete", marker), (4,))
    if fn is loop_bound:
        x = x.astype(np.int64)
    with pytest.raises(TraceError, match="data-dependent") as info:
        jit(fn, fullgraph=True)(x)
    assert_names_line(info.value, marker)


def svd(x):
    return np.linalg.svd(x)  # <svd>


def sort(x):
    return np.sort(x, axis=0)  # <sort>


def arccos(x):
    return np.arccos(x)  # <arccos>


def accumulate(x):
    return np.add.accumulate(x)  # <accumulate>


def out_keyword(x):
    return np.add(x, 1.0, out=np.empty(x.shape, x.dtype))  # <out>


def where_keyword(x):
    return np.sum(x, where=np.ones(x.shape, bool))  # <where>


@pytest.mark.parametrize("fn,marker,name", [
    (svd, "# <svd>", "np.linalg.svd is not supported"),
    (sort, "# <sort>", "np.sort is not supported"),
    (arccos, "# <arccos>", "np.arccos is not supported"),
    (accumulate, "# <accumulate>", "np.add.accumulate is not supported"),
    (out_keyword, "# <out>", "np.add(..., out=...) is not supported"),
    (where_keyword, "# <where>", "np.sum(..., where=...) is not supported"),
], ids=["svd", "sort", "arccos", "accumulate", "out", "where"])
def test_unsupported_numpy_functions_are_named(fn, marker, name):
    with pytest.raises(TraceError) as info:   # fullgraph: no graph break, today's error
        jit(fn, fullgraph=True)(arr(rng("unsupported", marker), (3, 3)))
    assert name in str(info.value)
    assert_names_line(info.value, marker)


def mismatched_matmul(x, y):
    h = x + 1.0
    return h @ y  # <matmul>


def mismatched_add(x, y):
    return x + y  # <add>


def bad_reshape(x):
    return x.reshape(5, -1)  # <reshape>


def bad_axis(x):
    return x.sum(axis=2)  # <axis>


@pytest.mark.parametrize("fn,marker,op,inputs", [
    (mismatched_matmul, "# <matmul>", "matmul", "f32[3,4], f32[5,2]"),
    (mismatched_add, "# <add>", "add", "f32[3,4], f32[5,2]"),
    (bad_reshape, "# <reshape>", "reshape", "f32[3,4]"),
    (bad_axis, "# <axis>", "np.sum", "f32[3,4]"),
], ids=["matmul", "add", "reshape", "axis"])
def test_shape_errors_name_the_op_the_inputs_and_the_line(fn, marker, op, inputs):
    g = rng("shape-error", marker)
    args = (arr(g, (3, 4)), arr(g, (5, 2)))[:fn.__code__.co_argcount]
    with pytest.raises(ShapeError) as info:
        jit(fn)(*args)
    assert str(info.value).startswith(f"{op}: ")
    assert f"(inputs {inputs})" in str(info.value)
    assert_names_line(info.value, marker)


def int8_overflow(x):
    return x + 1000  # <overflow>


def test_out_of_range_python_int_is_a_dtype_error():
    with pytest.raises(DTypeError, match="1000 is out of bounds for i8") as info:
        jit(int8_overflow)(np.arange(1, 4, dtype=np.int8))
    assert_names_line(info.value, "# <overflow>")


def test_unsupported_argument_dtype_names_the_argument():
    with pytest.raises(DTypeError, match=r"arg 0 \(x\): unsupported dtype complex128"):
        jit(lambda x: x)(np.arange(1, 3) + 1j)


def test_mixing_tracers_of_two_traces():
    def outer(x):
        inner = jit(lambda y: y + x)  # <mixing>
        return inner(np.arange(1.0, 4.0, dtype=np.float32))  # a new trace, using outer's x

    with pytest.raises(TraceError, match="mixing tracers of two different traces") as info:
        jit(outer)(arr(rng("mixing"), (3,)))
    assert_names_line(info.value, "# <mixing>")


def test_a_tracer_used_after_its_trace_ended():
    leaked = []

    def keep(x):
        leaked.append(x)
        return x + 1.0

    def use(y):
        return y * leaked[0]

    jit(keep)(arr(rng("leak"), (3,)))
    with pytest.raises(TraceError, match="after its trace ended"):
        jit(use)(arr(rng("leak2"), (3,)))


def test_tracer_operands_of_a_different_context_are_rejected_directly():
    from tilefuse.dtypes import DType
    from tilefuse.graph.builder import GraphBuilder
    from tilefuse.graph.types import TensorType

    a = TraceContext(GraphBuilder("a"), "a").input(TensorType((2,), DType.f32), "x")
    b = TraceContext(GraphBuilder("b"), "b").input(TensorType((2,), DType.f32), "y")
    assert isinstance(a, Tracer)
    with pytest.raises(TraceError, match="mixing"):
        _ = a + b
