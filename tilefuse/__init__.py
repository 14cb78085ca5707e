"""tilefuse: an ML compiler written in Python.

Entry points: :func:`tilefuse.jit` for NumPy functions, :func:`tilefuse.grad` and
:func:`tilefuse.value_and_grad` for their compiled gradients. Every stage can be dumped as text; see
docs/ARCHITECTURE.md.
"""

from tilefuse.dtypes import DType
from tilefuse.errors import (
    AttrError,
    CompileError,
    DTypeError,
    GradientError,
    GuardError,
    ParseError,
    ShapeError,
    SourceLoc,
    TilefuseError,
    TraceError,
    UnknownOpError,
    VerifyError,
)
from tilefuse.graph.types import Sym, TensorType
from tilefuse.log import configure_from_env

__version__ = "0.1.0"

__all__ = [
    "AttrError", "CompileError", "DType", "DTypeError", "GradientError", "GuardError",
    "ParseError", "ShapeError", "SourceLoc", "Sym", "Target", "TensorType", "TilefuseError",
    "TraceError", "UnknownOpError", "VerifyError", "__version__", "compile", "grad", "jit",
    "value_and_grad",
]

configure_from_env()  # TILEFUSE_LOG=topics turns on logging; idempotent


def __getattr__(name: str) -> object:
    """``tilefuse.jit``, ``tilefuse.grad``, ``tilefuse.value_and_grad``: the frontend, imported
    on first use (loading an artifact needs none of it);
    ``tilefuse.autotune``: :func:`tilefuse.tune.tune`, imported on first use (the tuner
    is not loaded by ``import tilefuse``; ``tilefuse.tune`` is the package);
    ``tilefuse.compile``: the compile driver (:func:`tilefuse.driver.compile`);
    ``tilefuse.Target``: :class:`tilefuse.target.Target`."""
    if name == "jit":  # the frontend (tracer, ops, graph passes): imported on first use
        from tilefuse.frontend.jit import jit

        return jit
    if name in ("grad", "value_and_grad"):
        import importlib

        return getattr(importlib.import_module("tilefuse.frontend.grad"), name)
    if name == "autotune":
        from tilefuse.tune.api import tune

        return tune
    if name == "compile":
        from tilefuse.driver import compile

        return compile
    if name == "Target":
        from tilefuse.target import Target

        return Target
    if name in ("save", "load"):  # tilefuse.artifact: compiled models in .tilefuse files
        from tilefuse import artifact

        return getattr(artifact, name)
    raise AttributeError(f"module 'tilefuse' has no attribute {name!r}")
