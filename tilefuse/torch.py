"""tilefuse for PyTorch models, imported lazily so that ``import tilefuse`` never needs torch.

- ``torch.compile(model, backend=tilefuse.torch.backend)`` (or ``backend="tilefuse"`` once the
  ``torch_dynamo_backends`` entry point is installed), with ``options={"dump": dir}``;
- ``tilefuse.torch.compile_exported(torch.export.export(model, args))``.

Both compile inference graphs: parameters and buffers are frozen into the compiled code, and
ATen ops without a tilefuse converter run in torch (logged on the ``fallback`` topic). See
:mod:`tilefuse.frontend.torch.backend`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
    """The Dynamo backend (``torch.compile(model, backend=tilefuse.torch.backend)``)."""
    from tilefuse.frontend.torch.backend import tilefuse_backend
    return tilefuse_backend(gm, example_inputs, **kwargs)


def compile_exported(ep: Any, *, dump: str | Path | None = None, target: str = "cpu",
                     debug: bool = False, quantize: str | None = None) -> Any:
    """Compiles a ``torch.export.ExportedProgram``; the result takes and returns tensors.
    ``quantize`` ("int8", "int4", ...) quantizes the weights of its matrix products."""
    from tilefuse.frontend.torch.backend import compile_exported as compile_ep
    return compile_ep(ep, dump=dump, target=target, debug=debug, quantize=quantize)


__all__ = ["backend", "compile_exported"]
