"""A loaded ONNX model: compiled once for its symbolic dims or per input signature, callable
like a function or through onnxruntime's ``run(output_names, input_feed)``.

Dims the model fixes are checked on every call. Dims it names (``dim_param``, "batch_size") or
leaves unknown are symbols: the model is imported and optimised once with them and built as one
:class:`~tilefuse.runtime.dynamic.DynamicExecutable` (on "cpu" one native build for every size,
guarded per call). When the import needs numbers for them (a shape computation the graph IR
cannot fold symbolically, an input used as a shape), that is logged on ``recompiles`` with the
reason and each new signature compiles once instead (cached by shapes, like
:func:`tilefuse.jit`). A call with the wrong number of inputs, or an input of the wrong
dtype, rank or static size, or two sizes for one ``dim_param``, is a :class:`GuardError` naming
the input.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.driver import CompileOptions, compile_graph
from tilefuse.dump import resolve_dump_dir
from tilefuse.errors import GuardError, TilefuseError
from tilefuse.frontend.jit import Lowered
from tilefuse.graph.ir import Graph
from tilefuse.graph.types import Sym, TensorType
from tilefuse.log import get_logger
from tilefuse.onnx.context import InputValueNeeded
from tilefuse.onnx.converters_quant import qdq_default
from tilefuse.onnx.importer import import_graph
from tilefuse.onnx.model import ModelInfo, TensorSpec
from tilefuse.onnx.tensors import OnnxError
from tilefuse.passes.quantize import parse_quantize, pipeline_for
from tilefuse.runtime.executable import select_outputs
from tilefuse.target import Target

# input shapes, then the bytes of the inputs compiled per value (see InputValueNeeded)
Key = tuple[tuple[tuple[int, ...], ...], tuple[bytes, ...]]


def _check_input(spec: TensorSpec, array: Any, sizes: dict[str, int]) -> np.ndarray:
    """The array, C-contiguous, after checking it against the declared input."""
    if not isinstance(array, (np.ndarray, np.generic)):
        raise GuardError(f"input {spec.name!r} must be a NumPy array, got {type(array).__name__}")
    arr = np.asarray(array)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    assert spec.dtype is not None
    if arr.dtype != spec.dtype.np:
        raise GuardError(f"input {spec.name!r} expects element type {spec.dtype.value}, got "
                         f"{arr.dtype}")
    if spec.dims is None:
        return arr
    if arr.ndim != len(spec.dims):
        raise GuardError(f"input {spec.name!r} expects rank {len(spec.dims)} "
                         f"({_shown(spec)}), got shape {list(arr.shape)}")
    for i, (want, got) in enumerate(zip(spec.dims, arr.shape)):
        if isinstance(want, int) and want != got:
            raise GuardError(f"input {spec.name!r} expects dim {i} = {want} ({_shown(spec)}), "
                             f"got shape {list(arr.shape)}")
        if isinstance(want, str) and sizes.setdefault(want, got) != got:
            raise GuardError(f"input {spec.name!r}: dim {i} ({want}) is {got}, but another "
                             f"input gave {want} = {sizes[want]}")
    return arr


def symbolic_input_types(specs: Sequence[TensorSpec]) -> list[TensorType]:
    """The inputs' types with each dim_param as a symbol (its name made an identifier; one
    name, one symbol) and each unknown dim as a symbol of its own (``<input>_<axis>``)."""
    names: dict[str, Sym] = {}
    taken: set[str] = set()

    def symbol(base: str) -> Sym:
        name = re.sub(r"\W", "_", base) or "dim"
        name = name if name[0].isalpha() or name[0] == "_" else "d_" + name
        while name in taken:
            name += "_"
        taken.add(name)
        return Sym(name)
    types = []
    for spec in specs:
        assert spec.dtype is not None and spec.dims is not None
        dims: list[int | Sym] = []
        for axis, d in enumerate(spec.dims):
            if isinstance(d, str):
                dims.append(names[d] if d in names else names.setdefault(d, symbol(d)))
            else:
                dims.append(symbol(f"{spec.name}_{axis}") if d is None else d)
        types.append(TensorType(tuple(dims), spec.dtype))
    return types


def _shown(spec: TensorSpec) -> str:
    dims = ",".join("?" if d is None else str(d) for d in spec.dims or ())
    return f"{spec.dtype.value if spec.dtype else '?'}[{dims}]"


_ORT_TYPES = {"f64": "double", "f32": "float", "f16": "float16", "bf16": "bfloat16",
              "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8",
              "bool": "bool"}


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime's ``get_inputs()`` describes it: ``name``, ``shape``
    (ints, dim_param names, None for unknown dims) and ``type`` (``"tensor(float)"``), so code
    written against onnxruntime finds the names and shapes where it looks for them."""

    name: str
    shape: list[int | str | None]
    type: str

    @classmethod
    def of(cls, spec: TensorSpec) -> NodeArg:
        dtype = _ORT_TYPES.get(str(spec.dtype), "undefined") if spec.dtype else "undefined"
        return cls(spec.name, list(spec.dims) if spec.dims is not None else [],
                   f"tensor({dtype})")


class OnnxModel:
    """A model from :func:`tilefuse.onnx.load`. ``model(*arrays)`` returns the single output
    or a list of outputs; ``model.run(None, {"x": x})`` returns a list, as onnxruntime does."""

    def __init__(self, info: ModelInfo, *, target: str | Target = "cpu",
                 dump: str | Path | None = None, quantize: Any = None):
        self.info = info
        self._target = Target.parse(target)  # TargetError (a CompileError) naming it
        self._pipeline = pipeline_for(parse_quantize(quantize) if quantize is not None
                                      else qdq_default(info, self._target))
        self._dump = dump
        self._cache: dict[Key, Lowered] = {}
        self._by_value: list[int] = []   # indices of inputs compiled per value, in order
        self._lock = threading.Lock()
        self._log = get_logger("recompiles")
        self.symbolic: Lowered | None = None
        """The one build for every size of the dim_params (None: compiled per shape)."""

    def __repr__(self) -> str:
        return (f"<tilefuse.onnx model {self.info.name!r} (opset {self.info.opset}, target "
                f"{str(self._target)!r}, {len(self._cache)} compiled signatures)>")

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.info.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.info.outputs]

    def get_inputs(self) -> list[NodeArg]:
        """onnxruntime's ``InferenceSession.get_inputs()``: name, shape and type per input."""
        return [NodeArg.of(s) for s in self.info.inputs]

    def get_outputs(self) -> list[NodeArg]:
        """onnxruntime's ``InferenceSession.get_outputs()``."""
        return [NodeArg.of(s) for s in self.info.outputs]

    def is_static(self) -> bool:
        return all(s.dims is not None and all(isinstance(d, int) for d in s.dims)
                   for s in self.info.inputs)

    # ---- calls -----------------------------------------------------------------------------

    def __call__(self, *arrays: Any) -> Any:
        outs = self._run(arrays)
        return outs[0] if len(outs) == 1 else outs

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[np.ndarray]:
        """onnxruntime's ``InferenceSession.run``: outputs named (None: all) from inputs by
        name."""
        if not isinstance(input_feed, Mapping):
            raise GuardError(f"input_feed must be a dict of name -> array, got "
                             f"{type(input_feed).__name__}")
        names = self.input_names
        unknown = sorted(set(input_feed) - set(names))
        missing = [n for n in names if n not in input_feed]
        if unknown or missing:
            raise GuardError(f"input_feed names unknown inputs {unknown} and lacks {missing} "
                             f"(the model's inputs: {names})")
        outs = self._run(tuple(input_feed[n] for n in names))
        return select_outputs(outs, self.output_names, output_names)

    def lower(self, *arrays: Any) -> Lowered:
        """The imported and optimised graphs (and executable) for these inputs, compiling them
        if needed; ``str(model.lower(x).captured)`` is the imported graph as text."""
        if self.symbolic is not None:
            self._check(arrays)
            return self.symbolic
        key, checked = self._guard(arrays)
        return self._entry(key, checked)

    def _run(self, arrays: tuple[Any, ...]) -> list[np.ndarray]:
        if self.symbolic is not None:
            checked = self._check(arrays)
            return self.symbolic.executable.run_trusted(checked)  # type: ignore[union-attr]
        key, checked = self._guard(arrays)
        entry = self._cache.get(key) or self._entry(key, checked)
        assert entry.executable is not None
        return entry.executable.run_trusted(checked)  # the guard checked dtypes and shapes

    def _guard(self, arrays: tuple[Any, ...]) -> tuple[Key, list[np.ndarray]]:
        checked = self._check(arrays)
        return self._key(checked), checked

    def _check(self, arrays: tuple[Any, ...]) -> list[np.ndarray]:
        specs = self.info.inputs
        if len(arrays) != len(specs):
            raise GuardError(f"the model takes {len(specs)} inputs "
                             f"({', '.join(self.input_names) or 'none'}), got {len(arrays)}")
        sizes: dict[str, int] = {}
        return [_check_input(s, a, sizes) for s, a in zip(specs, arrays)]

    def _key(self, arrays: Sequence[np.ndarray]) -> Key:
        return (tuple(a.shape for a in arrays),
                tuple(arrays[i].tobytes() for i in self._by_value))

    # ---- compiling -------------------------------------------------------------------------

    def compile_symbolic(self) -> bool:
        """Imports and builds the model once with its dim_params (and unknown dims) as symbols;
        False, logged with the reason, when the import needs their sizes (then each new
        signature compiles on its first call)."""
        types = symbolic_input_types(self.info.inputs)
        try:
            graph = import_graph(self.info, types)
            self.symbolic = self._build(graph)  # symbolic dims: a DynamicExecutable
        except Exception as err:  # a bug in a symbolic build must not stop the load either
            named = sorted({str(d) for t in types for d in t.shape if not isinstance(d, int)})
            level = logging.INFO if isinstance(err, (OnnxError, TilefuseError)) \
                else logging.WARNING
            self._log.log(level, "onnx model %s: dims %s stay per shape (each new input shape "
                          "is compiled on its own): %s: %s", self.info.name, ", ".join(named),
                          type(err).__name__, err)
            return False
        return True

    def _build(self, graph: Graph) -> Lowered:
        dump_dir = resolve_dump_dir(self._dump)
        # The compile driver (a graph with symbolic dims: a DynamicExecutable).
        compiled = compile_graph(graph, self._target,
                                 CompileOptions(dump_dir=dump_dir, pipeline=self._pipeline))
        return Lowered(graph, compiled.optimized, compiled.report, compiled.executable)

    def compile_static(self) -> None:
        """Compiles the one signature of a model whose input shapes are all fixed, unless a
        converter needs an input's value (a shape or axes fed as an input): then the first
        call compiles, per value of that input."""
        shapes = tuple(tuple(s.dims or ()) for s in self.info.inputs)
        try:
            self._entry((shapes, ()), None)  # type: ignore[arg-type]
        except InputValueNeeded as err:
            self._by_value.append(self.input_names.index(err.input))

    def _import(self, key: Key, arrays: Sequence[np.ndarray] | None) -> Graph:
        """The imported graph; an input whose value a converter needs joins ``_by_value``
        (and the import retries) when the call's ``arrays`` are at hand."""
        types = [TensorType(shape, spec.dtype)  # type: ignore[arg-type]
                 for shape, spec in zip(key[0], self.info.inputs)]
        while True:
            values = {} if arrays is None else {self.input_names[i]: arrays[i]
                                                for i in self._by_value}
            try:
                return import_graph(self.info, types, values)
            except InputValueNeeded as err:
                index = self.input_names.index(err.input)
                if arrays is None or index in self._by_value:
                    raise
                self._by_value.append(index)

    def _entry(self, key: Key, arrays: Sequence[np.ndarray] | None) -> Lowered:
        with self._lock:
            entry = self._cache.get(key)
            if entry is not None:
                return entry
            if self._cache:
                self._log.debug("onnx model %s: compiling for input shapes %s",
                                self.info.name, [list(s) for s in key[0]])
            graph = self._import(key, arrays)
            key = self._key(arrays) if arrays is not None else key
            entry = self._build(graph)
            self._cache[key] = entry
            return entry
