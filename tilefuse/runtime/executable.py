"""The executable interface: what ``tilefuse.jit`` runs once a graph is compiled.

An executable holds its (optimised) graph and maps input arrays (C-contiguous, of the graph's
input types) to freshly allocated output arrays that the caller owns. Target ``"cpu"`` builds the
native executable (fused kernels compiled through LLVM, :mod:`tilefuse.runtime.native`);
``"reference"`` runs the reference interpreter; ``"cuda"`` runs the kernels as PTX on an NVIDIA
GPU (:mod:`tilefuse.runtime.gpu`; needs cuda-python and a device).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from tilefuse.errors import GuardError
from tilefuse.graph.ir import Graph
from tilefuse.target import Target

KNOWN_TARGETS: tuple[str, ...] = ("cpu", "reference", "cuda")
"""The target kinds (:class:`tilefuse.target.Target` parses the full spellings)."""


@runtime_checkable
class Executable(Protocol):
    """A compiled graph: ``executable(*arrays)`` returns one fresh array per graph output."""

    graph: Graph

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]: ...

    def run_trusted(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The same call for a caller that has already checked the arrays' count, dtypes,
        shapes and contiguity against the graph's inputs (as tilefuse.jit's guard does)."""
        ...


class InterpreterExecutable:
    """Runs the graph with the reference interpreter (:func:`tilefuse.graph.interpreter.interpret`).

    Outputs never alias inputs, constants or each other: an output that is a graph input, a view
    (``base`` set) or read-only (a constant's literal) is copied, so callers may write to them.
    """

    def __init__(self, graph: Graph):
        self.graph = graph
        inputs = set(graph.inputs)
        seen: set[object] = set()
        always_copy = []
        for i, value in enumerate(graph.outputs):
            if value in inputs or value in seen:
                always_copy.append(i)
            seen.add(value)
        self._always_copy = frozenset(always_copy)

    def __repr__(self) -> str:
        return f"InterpreterExecutable(@{self.graph.name})"

    def run_trusted(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self(*arrays)

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        from tilefuse.graph.interpreter import interpret

        outs = interpret(self.graph, *arrays)
        for i, out in enumerate(outs):
            if i in self._always_copy or out.base is not None or not out.flags.writeable:
                outs[i] = out.copy()
        return outs


def build_executable(graph: Graph, target: str, dump_dir: Path | str | None = None) -> Executable:
    """An executable of the optimised ``graph`` for ``target`` ("cpu", "reference", "cuda", ...):
    the compile driver's back-end stages (:func:`tilefuse.driver.build`)."""
    from tilefuse.driver import CompileOptions, build

    return build(graph, target, CompileOptions(dump_dir=dump_dir))


def check_target(target: object) -> None:
    """CompileError (a :class:`~tilefuse.target.TargetError`) unless ``target`` names a target
    tilefuse can build for (:meth:`tilefuse.target.Target.parse`)."""
    Target.parse(target)  # type: ignore[arg-type]


def select_outputs(outs: Sequence[np.ndarray], names: Sequence[str],
                   wanted: Sequence[str] | None) -> list[np.ndarray]:
    """onnxruntime's ``run(output_names, ...)`` choice: the outputs named in ``wanted`` (None:
    all, in order) of ``outs``, whose names are ``names``; GuardError naming unknown ones."""
    if wanted is None:
        return list(outs)
    index = {n: i for i, n in enumerate(names)}
    bad = [n for n in wanted if n not in index]
    if bad:
        raise GuardError(f"unknown outputs {bad} (the model's outputs: {list(names)})")
    return [outs[index[n]] for n in wanted]
