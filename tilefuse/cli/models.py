"""What the command line's MODEL argument names, and the arrays fed to it.

A MODEL is one of:

- ``path/to/model.onnx``: loaded with :func:`tilefuse.onnx.load`;
- ``package.module:function``: a NumPy function, compiled with :func:`tilefuse.jit`;
- ``package.module:attr`` naming a ``torch.nn.Module`` (an instance, or a class built with no
  arguments), or ``package.module:factory()`` calling a function that returns one (e.g.
  ``tilefuse.zoo:bert_layer()``): compiled through the torch frontend.

Inputs come from ``--input NAME=FILE.npy`` (an array saved with ``np.save``) or
``--input NAME=2x768[:f32]`` (fresh random values of that shape and dtype). An ONNX input with
fixed dims that is not given gets random values; any other missing input is an error naming it.
Every mistake (a missing file, an unknown input name, a shape or dtype the model does not take)
is a :class:`~tilefuse.errors.TilefuseError` with a message saying what to write instead.
"""

from __future__ import annotations

import abc
import importlib
import inspect
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.dtypes import DType, from_numpy, parse_dtype
from tilefuse.errors import TilefuseError
from tilefuse.frontend.jit import Lowered
from tilefuse.testing import random_array


class CliError(TilefuseError):
    """A command-line mistake: a bad MODEL, ``--input`` or option."""


@dataclass(frozen=True)
class InputSpec:
    """A model input as declared: ``dims`` None when unknown (a NumPy or torch model), a dim
    None or a name when the model leaves it free; ``dtype`` None when undeclared."""

    name: str
    dims: tuple[int | str | None, ...] | None = None
    dtype: DType | None = None

    @property
    def static(self) -> bool:
        return self.dims is not None and all(isinstance(d, int) for d in self.dims)

    def describe(self) -> str:
        dims = "?" if self.dims is None else ",".join("?" if d is None else str(d)
                                                      for d in self.dims)
        return f"{self.name}: {self.dtype.value if self.dtype else '?'}[{dims}]"


class Model(abc.ABC):
    """A loaded MODEL: its inputs, a tilefuse build, and the graphs of one specialisation."""

    kind: str = ""

    def __init__(self, spec: str):
        self.spec = spec
        self.quantize: str | None = None   # ``--quantize``: passed to every build

    @abc.abstractmethod
    def inputs(self) -> list[InputSpec]:
        """The model's inputs in call order."""

    @abc.abstractmethod
    def compile(self, dump: Path | None = None) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        """tilefuse's build of the model: arrays in, arrays out (compiled on first call)."""

    @abc.abstractmethod
    def lower(self, arrays: list[np.ndarray], dump: Path | None = None) -> Lowered:
        """Captured and optimised graphs and the compiled executable for ``arrays``
        (writing every stage under ``dump`` when given)."""

    @abc.abstractmethod
    def tune_source(self, arrays: list[np.ndarray]) -> Any:
        """What :func:`tilefuse.tune.tune` takes for this model (called with ``arrays``)."""

    def graph(self, arrays: list[np.ndarray]) -> Any:
        """The captured graph for ``arrays`` (before the pipeline), for cross-compilation."""
        return self.lower(arrays).captured


# ---- ONNX ------------------------------------------------------------------------------------


class OnnxFile(Model):
    kind = "onnx"

    def __init__(self, spec: str):
        super().__init__(spec)
        from tilefuse.onnx.model import check_model, read_model

        self.path = Path(spec)
        if not self.path.is_file():
            raise CliError(f"no such ONNX file: {spec}")
        proto, folder = read_model(str(self.path))
        self.info = check_model(proto, folder)

    def inputs(self) -> list[InputSpec]:
        return [InputSpec(s.name, None if s.dims is None else tuple(s.dims), s.dtype)
                for s in self.info.inputs]

    def _load(self, dump: Path | None) -> Any:
        from tilefuse import onnx

        return onnx.load(str(self.path), dump=dump, quantize=self.quantize)

    def compile(self, dump: Path | None = None) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        model = self._load(dump)
        return lambda arrays: list(model.run(None, dict(zip(model.input_names, arrays))))

    def lower(self, arrays: list[np.ndarray], dump: Path | None = None) -> Lowered:
        return self._load(dump).lower(*arrays)

    def graph(self, arrays: list[np.ndarray]) -> Any:
        """The imported graph for these inputs (without building it), unless a converter
        needs an input's value (then through a build)."""
        from tilefuse.dtypes import from_numpy
        from tilefuse.graph.types import TensorType
        from tilefuse.onnx.context import InputValueNeeded
        from tilefuse.onnx.importer import import_graph

        types = [TensorType(tuple(a.shape), from_numpy(a.dtype)) for a in arrays]
        try:
            return import_graph(self.info, types)
        except InputValueNeeded:
            return super().graph(arrays)

    def tune_source(self, arrays: list[np.ndarray]) -> Any:
        return str(self.path)


# ---- NumPy functions -------------------------------------------------------------------------


def _as_list(out: Any) -> list[np.ndarray]:
    if isinstance(out, tuple | list):
        return [np.asarray(o) for o in out]
    return [np.asarray(out)]


class NumpyFunction(Model):
    kind = "numpy"

    def __init__(self, spec: str, fn: Callable[..., Any]):
        super().__init__(spec)
        self.fn = fn

    def inputs(self) -> list[InputSpec]:
        try:
            params = inspect.signature(self.fn).parameters.values()
        except (TypeError, ValueError):
            raise CliError(f"cannot read the parameters of {self.spec}") from None
        return [InputSpec(p.name) for p in params
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]

    def compile(self, dump: Path | None = None) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        from tilefuse.frontend.jit import jit

        jitted = jit(self.fn, dump=dump, quantize=self.quantize)
        return lambda arrays: _as_list(jitted(*arrays))

    def lower(self, arrays: list[np.ndarray], dump: Path | None = None) -> Lowered:
        from tilefuse.frontend.jit import jit

        jitted = jit(self.fn, dump=dump, quantize=self.quantize)
        jitted(*arrays)  # compiles (lower alone traces but does not build)
        return jitted.lower(*arrays)

    def tune_source(self, arrays: list[np.ndarray]) -> Any:
        return self.fn

    def graph(self, arrays: list[np.ndarray]) -> Any:
        from tilefuse.frontend.jit import jit

        return jit(self.fn).lower(*arrays).captured


# ---- torch modules ---------------------------------------------------------------------------


class TorchModule(Model):
    kind = "torch"

    def __init__(self, spec: str, module: Any):
        super().__init__(spec)
        self.module = module.eval()

    def inputs(self) -> list[InputSpec]:
        params = inspect.signature(self.module.forward).parameters.values()
        return [InputSpec(p.name) for p in params
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]

    def compile(self, dump: Path | None = None) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
        import torch

        import tilefuse.torch

        options: dict[str, Any] = {"dump": str(dump)} if dump is not None else {}
        if self.quantize:
            options["quantize"] = self.quantize
        compiled = torch.compile(self.module, backend=tilefuse.torch.backend, options=options)

        def call(arrays: list[np.ndarray]) -> list[np.ndarray]:
            with torch.no_grad():
                out = compiled(*(torch.from_numpy(a) for a in arrays))
            return [t.numpy() for t in (out if isinstance(out, tuple | list) else [out])]
        return call

    def _pipeline(self) -> Any:
        from tilefuse.passes.quantize import parse_quantize, pipeline_for

        return pipeline_for(parse_quantize(self.quantize))

    def lower(self, arrays: list[np.ndarray], dump: Path | None = None) -> Lowered:
        """The whole module as one tilefuse graph (every ATen op must convert; ``run`` and
        ``bench`` go through ``torch.compile``, which can leave unsupported ops to torch)."""
        from tilefuse.driver import CompileOptions, compile_graph

        compiled = compile_graph(self.graph(arrays), "cpu",
                                 CompileOptions(dump_dir=dump, pipeline=self._pipeline()))
        return Lowered(compiled.graph, compiled.optimized, compiled.report, compiled.executable)

    def tune_source(self, arrays: list[np.ndarray]) -> Any:
        from tilefuse.driver import CompileOptions, optimize

        return optimize(self.graph(arrays), CompileOptions(pipeline=self._pipeline()))[0]

    def graph(self, arrays: list[np.ndarray]) -> Any:
        from tilefuse.zoo import torch_graph

        return torch_graph(self.module, arrays, name=_identifier(self.spec))


def _identifier(text: str) -> str:
    return re.sub(r"\W", "_", text.split(":")[-1].removesuffix("()")) or "model"


# ---- loading ---------------------------------------------------------------------------------


def _is_torch_module(obj: Any) -> bool:
    torch = _torch_if_loaded()
    return torch is not None and isinstance(obj, torch.nn.Module)


def _torch_if_loaded() -> Any:
    import sys

    return sys.modules.get("torch")


def _importable_from_cwd() -> None:
    """``module:function`` finds ``module.py`` in the current directory, as ``python -m`` does
    (the ``tilefuse`` script's own directory is on ``sys.path`` instead)."""
    import sys

    cwd = os.getcwd()
    if not any(os.path.abspath(p or ".") == cwd for p in sys.path):
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()


def load_model(spec: str, quantize: str | None = None) -> Model:
    """The MODEL named by ``spec`` (module docstring), built with ``quantize`` when given."""
    model = _load_model(spec)
    if quantize:
        from tilefuse.passes.quantize import parse_quantize

        parse_quantize(quantize)   # a bad value fails here, before any build
        model.quantize = quantize
    return model


def _load_model(spec: str) -> Model:
    if spec.endswith(".tilefuse"):  # a compiled artifact (tilefuse compile)
        from tilefuse.cli.compile import ArtifactFile

        return ArtifactFile(spec)
    if spec.endswith(".onnx") or (os.path.sep in spec and ":" not in spec):
        return OnnxFile(spec)
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise CliError(f"MODEL must be a .onnx file or module:function, got {spec!r}")
    call = attr.endswith("()")
    attr = attr.removesuffix("()")
    _importable_from_cwd()
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise CliError(f"cannot import {module_name!r} for MODEL {spec}: {err}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise CliError(f"module {module_name!r} has no attribute {attr!r}") from None
    if call:
        obj = obj()
    torch = _torch_if_loaded()
    if torch is not None and isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        obj = obj()
    if _is_torch_module(obj):
        return TorchModule(spec, obj)
    if callable(obj):
        return NumpyFunction(spec, obj)
    raise CliError(f"{spec} is a {type(obj).__name__}, not a function or torch module")


# ---- inputs ----------------------------------------------------------------------------------

_SHAPE = re.compile(r"(\d+(?:x\d+)*)?(?::(\w+))?")


def _random_spec(text: str, rng: np.random.Generator) -> np.ndarray | None:
    """Random values for ``2x768[:f32]`` (``:f32`` alone: a scalar), None if ``text`` is not
    of that form."""
    match = _SHAPE.fullmatch(text)
    if match is None or not text:
        return None
    dims, dtype_name = match.groups()
    shape = tuple(int(d) for d in dims.split("x")) if dims else ()
    try:
        dtype = parse_dtype(dtype_name or "f32")
    except TilefuseError:
        raise CliError(f"unknown dtype {dtype_name!r} in --input value {text!r}") from None
    return random_array(rng, shape, dtype)


def _read_array(path: str) -> np.ndarray:
    if not os.path.isfile(path):
        raise CliError(f"no such input file: {path} (give NAME=FILE.npy or NAME=2x768:f32)")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise CliError(f"cannot read {path} as a .npy array: {err}") from None


def _check_against(spec: InputSpec, array: np.ndarray) -> None:
    if spec.dtype is not None and from_numpy(array.dtype) is not spec.dtype:
        raise CliError(f"input {spec.name!r} must be {spec.dtype.value}, got "
                       f"{array.dtype} (the model's inputs: {spec.describe()})")
    if spec.dims is None:
        return
    fixed = len(spec.dims) == array.ndim and all(
        not isinstance(d, int) or d == n for d, n in zip(spec.dims, array.shape))
    if not fixed:
        raise CliError(f"input {spec.name!r} has shape {list(array.shape)}, the model takes "
                       f"{spec.describe()}")


def parse_inputs(model: Model, given: Sequence[str], seed: int = 0) -> list[np.ndarray]:
    """The model's input arrays in call order from ``--input`` values (module docstring)."""
    specs = model.inputs()
    by_name = {s.name: s for s in specs}
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for item in given:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise CliError(f"--input must be NAME=FILE.npy or NAME=SHAPE[:dtype], got {item!r}")
        if name not in by_name:
            known = ", ".join(s.name for s in specs) or "none"
            raise CliError(f"--input names {name!r}, which is not an input of {model.spec} "
                           f"(its inputs: {known})")
        if name in arrays:
            raise CliError(f"--input {name} given twice")
        array = _random_spec(value, rng) if not value.endswith(".npy") else None
        if array is None:
            array = _read_array(value)
        spec = by_name[name]
        if spec.dtype is not None and _SHAPE.fullmatch(value) and ":" not in value:
            array = array.astype(spec.dtype.np)  # a bare shape takes the declared dtype
        _check_against(spec, array)
        arrays[name] = np.ascontiguousarray(array)
    for spec in specs:
        if spec.name not in arrays:
            if not spec.static or spec.dtype is None:
                raise CliError(f"input {spec.name!r} ({spec.describe()}) needs a value: "
                               f"--input {spec.name}=FILE.npy or --input {spec.name}=2x3:f32")
            arrays[spec.name] = random_array(rng, tuple(spec.dims), spec.dtype)  # type: ignore
    return [arrays[s.name] for s in specs]


def quiet_torch_warnings() -> None:
    """torch's export and compile warnings are noise on a command line."""
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")


__all__ = ["CliError", "InputSpec", "Model", "NumpyFunction", "OnnxFile", "TorchModule",
           "load_model", "parse_inputs", "quiet_torch_warnings"]
