"""Scans along one axis: cumsum and cumprod (NumPy's, per axis).

Result dtypes follow NumPy's sum and prod: bools and integers give i64, floats their own type;
f16/bf16 run in f32 and each output element is rounded once from the f32 running value. Each
is one native kernel of its own (:mod:`tilefuse.kernel.lower_scan`): a scan is sequential along
its axis, so it joins no fused group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tilefuse.dtypes import ALL_TYPES, DType
from tilefuse.graph.ir import Attrs
from tilefuse.graph.types import Shape, normalize_axis
from tilefuse.ops.registry import AttrType, OpDef, OpKind, attr
from tilefuse.ops.rules import as_dtype, dtype_of, quiet, work_dtype


def _scan_dtype(dtypes: tuple[DType, ...], attrs: Attrs) -> tuple[DType, ...]:
    t = dtypes[0]
    return (t if t.is_float else DType.i64,)


def _scan_rule(shapes: tuple[Shape, ...], attrs: Attrs) -> tuple[Shape, ...]:
    normalize_axis(attrs["axis"], len(shapes[0]))
    return (shapes[0],)


def _reference(np_fn: Callable[..., Any]) -> Callable[..., np.ndarray]:
    def reference(x: np.ndarray, axis: int) -> np.ndarray:
        (out,) = _scan_dtype((dtype_of(x),), {})
        return as_dtype(np_fn(x.astype(work_dtype(out), copy=False), axis=axis), out)

    reference.__name__ = np_fn.__name__
    return quiet(reference)


def _scan(name: str, np_fn: Callable[..., Any], doc: str) -> OpDef:
    return OpDef(name, OpKind.OPAQUE, 1, _scan_rule, _scan_dtype, _reference(np_fn),
                 attrs=(attr("axis", AttrType.INT),), accepts=ALL_TYPES, doc=doc)


CUMSUM = _scan("cumsum", np.cumsum, "running sum along axis (i64 for bools and integers)")
CUMPROD = _scan("cumprod", np.cumprod, "running product along axis (integers wrap)")

DEFINITIONS: tuple[OpDef, ...] = (CUMSUM, CUMPROD)
