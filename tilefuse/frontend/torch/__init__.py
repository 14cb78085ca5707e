"""PyTorch frontend: ``torch.compile(model, backend="tilefuse")`` and
:func:`compile_exported` for ``torch.export`` programs.

This package is the only place tilefuse imports torch. Modules: ``convert`` (the FX → tilefuse
conversion context), ``aten`` (the ATen → tilefuse converter table), ``partition`` (compiled
regions and torch fallbacks), ``backend`` (the entry points). The public, lazily importing face
is :mod:`tilefuse.torch`.
"""

from tilefuse.frontend.torch.aten import ATEN_CONVERTERS
from tilefuse.frontend.torch.backend import (
    CompiledExported,
    Options,
    SpecializedGraph,
    compile_exported,
    tilefuse_backend,
)
from tilefuse.frontend.torch.convert import Unsupported

__all__ = ["ATEN_CONVERTERS", "CompiledExported", "Options", "SpecializedGraph", "Unsupported",
           "compile_exported", "tilefuse_backend"]
