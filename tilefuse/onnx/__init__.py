"""``tilefuse.onnx.load``: import an ONNX model and compile it.

    model = tilefuse.onnx.load("model.onnx")
    y = model(x)                          # one output: the array; several: a list
    ys = model.run(None, {"x": x})        # onnxruntime's signature

The model file is parsed without onnx's external-data loader; external tensors are read by
tilefuse, only from inside the model's folder. One converter per (op type, opset version) maps
ONNX nodes onto tilefuse ops; shape computations fold at import time. See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tilefuse.onnx.compiled import OnnxModel
from tilefuse.onnx.converters import supported_ops
from tilefuse.onnx.importer import check_supported
from tilefuse.onnx.model import check_model, read_model
from tilefuse.onnx.tensors import OnnxError
from tilefuse.runtime.executable import check_target


def load(source: Any, *, target: str = "cpu", dump: str | Path | None = None,
         base_dir: str | os.PathLike[str] | None = None, quantize: Any = None) -> OnnxModel:
    """Loads an ONNX model (a path, the file's bytes, or an ``onnx.ModelProto``) and compiles it.

    A model whose input shapes are all fixed compiles here; one with ``dim_param`` or unknown
    dims compiles here once with them as symbols, serving every size (or, when its import
    needs their sizes, logged, on the first call of each new shape). ``base_dir`` is where
    external data is read from when ``source`` is not a path. ``quantize`` ("int8", "int4",
    ...) quantizes the constant weights of matrix products (:mod:`tilefuse.passes.quantize`).
    Every failure is a :class:`OnnxError`.
    """
    check_target(target)
    proto, folder = read_model(source, base_dir)
    info = check_model(proto, folder)
    check_supported(info)
    model = OnnxModel(info, target=target, dump=dump, quantize=quantize)
    if model.is_static():
        model.compile_static()
    elif all(s.dims is not None for s in info.inputs):
        model.compile_symbolic()
    return model


__all__ = ["OnnxError", "OnnxModel", "load", "supported_ops"]
