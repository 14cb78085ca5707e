"""Finding the user's source line: the first stack frame outside tilefuse (and outside the NumPy
and SciPy code that dispatches to the tracer)."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

import tilefuse
from tilefuse.errors import SourceLoc


def _package_dir(module: object) -> str:
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep  # type: ignore[attr-defined]


def _spec_dir(name: str) -> str:
    """The directory of package ``name`` without importing it (SciPy is imported on first use;
    a frame in it is still not the user's)."""
    spec = importlib.util.find_spec(name)
    where = spec.submodule_search_locations if spec is not None else None
    return os.path.abspath(where[0]) + os.sep if where else "\0"  # "\0": matches no file


# Frames in these directories are never the user's code.
_INTERNAL_DIRS: tuple[str, ...] = (_package_dir(tilefuse), _package_dir(np), _spec_dir("scipy"))


def _is_internal(filename: str) -> bool:
    return filename.startswith(_INTERNAL_DIRS) or filename.startswith("<frozen ")


def user_loc(depth: int = 1) -> SourceLoc | None:
    """The SourceLoc of the innermost frame that is not tilefuse, NumPy or SciPy code."""
    frame = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        if not _is_internal(code.co_filename):
            return SourceLoc(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None
