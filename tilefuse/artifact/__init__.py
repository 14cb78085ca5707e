"""Compiled artifacts: a model compiled once, saved to one ``.tilefuse`` file, loaded by another
process without tracing, graph passes or code generation.

``tilefuse.save(compiled, path)`` (:mod:`tilefuse.artifact.saver`) and ``tilefuse.load(path)``
(:mod:`tilefuse.artifact.loader`; the modules are not called save and load so that
they do not shadow the functions); the container format is :mod:`tilefuse.artifact.format`, one
executable's data :mod:`tilefuse.artifact.program`, the targets :mod:`tilefuse.artifact.targets`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tilefuse.artifact.format import ArtifactError

if TYPE_CHECKING:
    from tilefuse.artifact.loader import LoadedModel


def save(compiled: object, path: str | Path) -> Path:
    """Writes ``compiled`` (a tilefuse.jit function, a tilefuse.onnx model, a
    compile_exported result or a NativeExecutable) to ``path``: see
    :mod:`tilefuse.artifact.saver`."""
    from tilefuse.artifact.saver import save as _save

    return _save(compiled, path)


def load(path: str | Path) -> LoadedModel:
    """The model saved at ``path``, ready to call: see :mod:`tilefuse.artifact.loader`."""
    from tilefuse.artifact.loader import load as _load

    return _load(path)


__all__ = ["ArtifactError", "load", "save"]
