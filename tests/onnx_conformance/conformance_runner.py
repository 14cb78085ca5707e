"""Runs one backend test case through ``tilefuse.onnx.load`` and puts it in one bucket, as
onnxruntime's backend-test reports do.

Buckets: ``pass``; ``not_implemented`` (an :class:`OnnxError` saying tilefuse does not support an
op, element type, domain, opset, attribute value or non-tensor value); ``load_error`` (anything
else raised by ``load``); ``run_error`` (raised while running a data set); ``mismatch`` (an output
differs). Outputs compare with rtol 1e-3, atol 1e-5 for floats, NaN in the same places, the dtype
and shape exactly; ints and bools compare exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from conformance_cases import Case, DataSet

import tilefuse.onnx

RTOL = 1e-3
ATOL = 1e-5

PASS = "pass"
NOT_IMPLEMENTED = "not_implemented"
LOAD_ERROR = "load_error"
RUN_ERROR = "run_error"
MISMATCH = "mismatch"
BUCKETS = (PASS, NOT_IMPLEMENTED, LOAD_ERROR, RUN_ERROR, MISMATCH)

# what an OnnxError says when tilefuse lacks a feature (rather than failing at one it has)
_UNSUPPORTED = re.compile(r"unsupported ONNX op|not supported|does not support|does not import|"
                          r"only .* (is|are) supported|outside what tilefuse imports")


@dataclass(frozen=True)
class Outcome:
    bucket: str
    detail: str = ""


def is_not_implemented(err: BaseException) -> bool:
    return isinstance(err, tilefuse.onnx.OnnxError) and bool(_UNSUPPORTED.search(str(err)))


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def compare(got: Any, want: Any, what: str) -> str | None:
    """None when ``got`` matches ``want``; otherwise why not."""
    if isinstance(want, np.generic):
        want = np.asarray(want)
    if not isinstance(want, np.ndarray):
        return f"{what}: expected a {type(want).__name__}, which tilefuse does not produce"
    if not isinstance(got, np.ndarray):
        return f"{what}: got {type(got).__name__}, expected an array"
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{what}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
    if not _is_float(want.dtype):
        if np.array_equal(got, want):
            return None
        bad = int(np.count_nonzero(got != want))
        return f"{what}: {bad} of {want.size} elements differ"
    g, w = got.astype(np.float64), want.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(w)):
        return f"{what}: NaN in different places"
    ok = np.isclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True)
    if ok.all():
        return None
    err = np.abs(g - w)[~ok]
    return (f"{what}: {int((~ok).sum())} of {want.size} elements differ beyond rtol {RTOL}, "
            f"atol {ATOL} (max abs error {float(np.nanmax(err)):.3g})")


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind in "fc" or dtype.name == "bfloat16"


def run_data_set(model: tilefuse.onnx.OnnxModel, data: DataSet, index: int) -> str | None:
    inputs, expected = data
    got = model.run(None, dict(zip(model.input_names, inputs)))
    if len(got) != len(expected):
        return f"data set {index}: {len(got)} outputs, expected {len(expected)}"
    for i, (g, w) in enumerate(zip(got, expected)):
        why = compare(g, w, f"data set {index} output {i}")
        if why is not None:
            return why
    return None


SHARED_GRAPH_NAME = "conformance"
"""The graph name generated (node) models load under. A kernel's disk-cache key holds its loop
IR, schedule and target, and ``<graph>/<kernel>`` as its label: under one name, the many node
tests that build the same kernel as another (``test_x`` and ``test_x_expanded``, one op's cases
on the same shapes; ~40% of the directory's compiles) load it from the session's cache, which
the pytest-xdist workers share, instead of compiling it again."""


def _under_shared_name(model: onnx.ModelProto) -> onnx.ModelProto:
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    renamed.graph.name = SHARED_GRAPH_NAME
    return renamed


def run_case(case: Case, max_sets: int | None = None) -> Outcome:
    """Loads the case's model and runs its data sets (the first ``max_sets``; None: all)."""
    source = case.source
    if isinstance(source, onnx.ModelProto):
        source = _under_shared_name(source)
    try:
        model = tilefuse.onnx.load(source)
    except Exception as err:
        return Outcome(NOT_IMPLEMENTED if is_not_implemented(err) else LOAD_ERROR,
                       _describe(err))
    sets = case.data_sets()
    for index, data in enumerate(sets[:max_sets]):
        try:
            why = run_data_set(model, data, index)
        except Exception as err:
            bucket = NOT_IMPLEMENTED if is_not_implemented(err) else RUN_ERROR
            return Outcome(bucket, f"data set {index}: {_describe(err)}")
        if why is not None:
            return Outcome(MISMATCH, why)
    return Outcome(PASS)
