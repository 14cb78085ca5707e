"""Helpers for the op tests: run one op as a one-node graph through the reference interpreter, and
compute NumPy expectations for low-precision dtypes in f64."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tilefuse.dtypes import DType, from_numpy
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Graph
from tilefuse.graph.types import Shape, TensorType
from tilefuse.testing import random_array

FLOATS = (DType.f32, DType.f64, DType.f16, DType.bf16)
LOW = (DType.f16, DType.bf16)
INTS = (DType.i8, DType.i32, DType.i64, DType.u8)
ODD_SHAPES: tuple[tuple[int, ...], ...] = ((1,), (7,), (513,), (7, 1, 3))


def rng(*key: object) -> np.random.Generator:
    """A generator seeded from ``key`` (stable across runs, different per test case)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def one_node_graph(op: str, types: Sequence[TensorType], attrs: dict[str, Any] | None = None
                   ) -> Graph:
    b = GraphBuilder(f"one_{op}")
    ins = [b.input(t, f"x{i}") for i, t in enumerate(types)]
    return b.build(b.add(op, ins, attrs))


def type_of(a: np.ndarray) -> TensorType:
    return TensorType(tuple(int(d) for d in a.shape), from_numpy(a.dtype))


def run_op(op: str, arrays: Sequence[np.ndarray], attrs: dict[str, Any] | None = None
           ) -> list[np.ndarray]:
    """Builds ``op(arrays) {attrs}`` as a one-node graph and runs it with the interpreter."""
    graph = one_node_graph(op, [type_of(a) for a in arrays], attrs)
    return interpret(graph, *arrays)


def run1(op: str, arrays: Sequence[np.ndarray], attrs: dict[str, Any] | None = None
         ) -> np.ndarray:
    (out,) = run_op(op, arrays, attrs)
    return out


def infer(op: str, types: Sequence[TensorType], attrs: dict[str, Any] | None = None
          ) -> tuple[TensorType, ...]:
    """The output types of ``op`` on ``types`` (through the builder, as a graph would get them)."""
    graph = one_node_graph(op, types, attrs)
    return tuple(v.type for v in graph.outputs)


def noncontiguous(a: np.ndarray) -> np.ndarray:
    """A strided view with the same values as ``a`` (every other element of a larger buffer)."""
    if a.ndim == 0:
        return a
    big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), dtype=a.dtype)
    big[..., ::2] = a
    view = big[..., ::2]
    assert not view.flags.c_contiguous or view.size <= 1
    return view


def in_f64(fn: Callable[..., Any], *arrays: np.ndarray, out: DType) -> np.ndarray:
    """fn computed on f64 copies of the arrays, rounded to ``out``: the expectation for dtypes
    whose NumPy arithmetic is not the contract's (f16/bf16 round once from exact math)."""
    with np.errstate(all="ignore"):
        result = fn(*(a.astype(np.float64) for a in arrays))
    return np.asarray(result).astype(out.np)


def array(r: np.random.Generator, shape: Shape, dtype: DType, low: float = -2.0,
          high: float = 2.0) -> np.ndarray:
    return random_array(r, tuple(int(d) for d in shape), dtype, low, high)


seeds = st.integers(min_value=0, max_value=2**32 - 1)
