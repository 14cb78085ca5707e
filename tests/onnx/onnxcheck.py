"""Helpers for the ONNX importer tests: building small models with onnx.helper and comparing
tilefuse with onnxruntime (CPUExecutionProvider) on fresh random inputs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")          # the "onnx" extra; without it these tests are skipped
pytest.importorskip("onnxruntime")

import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import tilefuse.onnx
from tilefuse.dtypes import from_numpy
from tilefuse.testing import assert_close, random_array

F32 = TensorProto.FLOAT
I64 = TensorProto.INT64
I32 = TensorProto.INT32
BOOL = TensorProto.BOOL

rng = np.random.default_rng(20240611)


def arr(shape: Sequence[int], dtype: Any = np.float32, low: float = -2.0,
        high: float = 2.0) -> np.ndarray:
    return random_array(rng, tuple(shape), from_numpy(np.dtype(dtype)), low, high)


def init(name: str, value: Any) -> TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[tuple[str, int, Any]],
               outputs: Sequence[tuple[str, int]], *, initializers: Sequence[TensorProto] = (),
               opset: int = 17, name: str = "test") -> onnx.ModelProto:
    """A model; inputs are (name, elem type, shape with ints / strings / None), outputs
    (name, elem type) with the shape left undeclared."""
    graph = helper.make_graph(
        list(nodes), name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 21 else 10
    return model


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime's outputs, from a one-thread session: these models are small, and a session
    with its default thread pool cost ~10x the CPU to make and run (~3 ms against 0.3 ms)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def spec_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The ONNX package's own reference evaluator (the spec's NumPy implementation of each op)."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


ORACLES = {"ort": ort_run, "spec": spec_run}
"""What a check compares tilefuse with: onnxruntime, or the ONNX spec's reference evaluator
where onnxruntime's kernels are known not to be exact on some hosts."""


def compare(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, reduction: bool = False,
            target: str = "cpu", oracle: str = "ort") -> tilefuse.onnx.OnnxModel:
    """Loads the model with tilefuse, runs it and the ``oracle`` (:data:`ORACLES`) and checks
    every output; returns the model."""
    expected = ORACLES[oracle](model, feeds)
    compiled = tilefuse.onnx.load(model, target=target)
    got = compiled.run(None, feeds)
    assert len(got) == len(expected)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_close(g, e, reduction=reduction, msg=f"output {i}")
    return compiled


def single(op_type: str, inputs: dict[str, np.ndarray], n_out: int = 1, *, opset: int = 17,
           consts: dict[str, np.ndarray] | None = None, reduction: bool = False,
           out_type: int | None = None, oracle: str = "ort",
           **attrs: Any) -> tilefuse.onnx.OnnxModel:
    """One node of ``op_type`` over graph inputs ``inputs`` then initializers ``consts``
    (an empty-string key placeholder is passed as an omitted input), compared with ORT."""
    consts = consts or {}
    names = list(inputs) + list(consts)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, name=f"{op_type.lower()}0", **attrs)
    elem = {n: helper.np_dtype_to_tensor_dtype(a.dtype) for n, a in inputs.items()}
    model = make_model([node], [(n, elem[n], list(a.shape)) for n, a in inputs.items()],
                       [(o, out_type or 0) for o in outs],
                       initializers=[init(n, v) for n, v in consts.items() if n],
                       opset=opset)
    _fix_output_types(model, inputs)
    return compare(model, inputs, reduction=reduction, oracle=oracle)


def _fix_output_types(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> None:
    """Fills in undeclared output element types with ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model)
    for out, inf in zip(model.graph.output, inferred.graph.output):
        if not out.type.tensor_type.elem_type:
            out.type.tensor_type.elem_type = inf.type.tensor_type.elem_type
