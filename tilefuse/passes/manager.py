"""The pass manager: runs a list of passes, timing each, verifying at stage boundaries (after
every pass in debug mode), logging each pass on topic ``passes`` and dumping the graph after
each pass that changed it.

A pass is a plain function ``graph -> (graph, changed)``; ``changed`` is False exactly when the
result is structurally equal to the input (debug mode checks that promise). A pass may return a
third element, ``notes`` (a mapping: rules fired, why it stopped, ...), which the report and the
dump show with that pass.

Visibility: when dumping, or when the ``passes`` log topic is on, each pass that changed the graph
is also measured by kernel formation: kernels and bytes moved (each kernel's inputs + outputs)
before and after. Forming kernels costs about as much as a cheap pass, so it is skipped otherwise.
The dump of a pass starts with a comment block of these figures and its notes, and
``passes.report`` in the dump directory holds the whole report.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tilefuse.dump import DumpWriter
from tilefuse.errors import TilefuseError, VerifyError
from tilefuse.graph.ir import Graph, Value, structurally_equal
from tilefuse.graph.printer import print_graph
from tilefuse.graph.verifier import verify
from tilefuse.kernel.fusion import form_kernels
from tilefuse.log import get_logger

PassNotes = Mapping[str, object]
Pass = Callable[[Graph], "tuple[Graph, bool] | tuple[Graph, bool, PassNotes]"]

_PASS_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclass(frozen=True)
class PassSpec:
    """A named pass. The name (lower-case identifier) appears in logs and dump file names."""

    name: str
    fn: Pass
    doc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _PASS_NAME.match(self.name):
            raise TilefuseError(f"pass name {self.name!r} must be a lower-case identifier")


@dataclass(frozen=True)
class KernelFigures:
    """What kernel formation makes of a graph: kernel count and bytes moved (the sum over
    kernels of their inputs' and outputs' bytes; symbolic dims count as 1)."""

    kernels: int
    bytes_moved: int

    @classmethod
    def of(cls, graph: Graph) -> KernelFigures:
        plan = form_kernels(graph)
        moved = sum(_static_bytes(v) for group in plan.groups
                    for v in (*group.inputs, *group.outputs))
        return cls(len(plan.groups), moved)


def _static_bytes(value: Value) -> int:
    count = 1
    for d in value.shape:
        count *= d if isinstance(d, int) else 1
    return count * value.dtype.itemsize


@dataclass(frozen=True)
class PassRecord:
    """What one pass did: position in the pipeline (1-based), whether it changed the graph,
    wall time, and the node count before and after."""

    position: int
    name: str
    changed: bool
    seconds: float
    nodes_before: int
    nodes_after: int
    notes: PassNotes = field(default_factory=dict)
    kernels: tuple[KernelFigures, KernelFigures] | None = None   # before, after (when measured)

    def detail_lines(self) -> list[str]:
        """Kernel figures and notes, one line each (empty when there are none)."""
        lines = []
        if self.kernels is not None:
            before, after = self.kernels
            lines.append(f"kernels {before.kernels} -> {after.kernels}, bytes moved "
                         f"{before.bytes_moved:,} -> {after.bytes_moved:,}")
        for key, value in self.notes.items():
            if isinstance(value, Mapping):
                value = ", ".join(f"{k}={v}" for k, v in value.items()) or "none"
            lines.append(f"{key}: {value}")
        return lines


@dataclass(frozen=True)
class PipelineReport:
    records: tuple[PassRecord, ...]

    @property
    def total_seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    @property
    def changed(self) -> tuple[str, ...]:
        """Names of the passes that changed the graph, in order."""
        return tuple(r.name for r in self.records if r.changed)

    def __str__(self) -> str:
        rows = []
        for r in self.records:
            rows.append(f"{r.position:02d} {r.name:<16} {'changed' if r.changed else '-':<8} "
                        f"{r.nodes_before:>5} -> {r.nodes_after:<5} {r.seconds * 1e3:9.3f} ms")
            rows.extend(f"     {line}" for line in r.detail_lines())
        return "\n".join([*rows, f"total {self.total_seconds * 1e3:.3f} ms"])


def run_pipeline(graph: Graph, passes: Sequence[PassSpec], *,
                 dump_dir: str | Path | DumpWriter | None = None,
                 debug: bool = False) -> tuple[Graph, PipelineReport]:
    """Runs ``passes`` in order on ``graph``; returns the result and a report.

    ``dump_dir`` (already resolved by the caller, see :func:`tilefuse.dump.resolve_dump_dir`)
    receives ``00-captured.graph`` and ``NN-after-<pass>.graph`` for each pass that changed the
    graph. ``debug`` verifies after every pass and checks each pass's ``changed`` flag.
    """
    log = get_logger("passes")
    writer = dump_dir if isinstance(dump_dir, DumpWriter) or dump_dir is None \
        else DumpWriter(dump_dir)
    _verify_at(graph, "before the first pass")
    if writer is not None:
        writer.write("00-captured.graph", print_graph(graph))
    measure = writer is not None or log.isEnabledFor(logging.DEBUG)
    figures = _measure(graph, log) if measure else None
    records = []
    for position, spec in enumerate(passes, start=1):
        before = graph
        start = time.perf_counter()
        graph, changed, notes = _run_one(spec, before)
        seconds = time.perf_counter() - start
        if debug:
            _check_pass(spec, position, before, graph, changed)
        kernels = None
        if measure and changed:
            after = _measure(graph, log)
            if figures is not None and after is not None:
                kernels = (figures, after)
            figures = after
        record = PassRecord(position, spec.name, changed, seconds, len(before.nodes),
                            len(graph.nodes), notes, kernels)
        records.append(record)
        log.debug("%02d %s: %s, %d -> %d nodes, %.3f ms%s", position, spec.name,
                  "changed" if changed else "unchanged", len(before.nodes), len(graph.nodes),
                  seconds * 1e3, "".join(f"; {line}" for line in record.detail_lines()))
        if changed and writer is not None:
            header = "".join(f"# {line}\n" for line in record.detail_lines())
            writer.write(f"{position:02d}-after-{spec.name}.graph", header + print_graph(graph))
    _verify_at(graph, "after the last pass")
    report = PipelineReport(tuple(records))
    if writer is not None:
        writer.write("passes.report", str(report) + "\n")
    return graph, report


def _measure(graph: Graph, log: logging.Logger) -> KernelFigures | None:
    """Kernel figures for the report, or None (logged) when kernel formation refuses the graph:
    visibility must never stop a compilation."""
    try:
        return KernelFigures.of(graph)
    except TilefuseError as err:
        log.debug("no kernel figures for this graph: %s", err)
        return None


def _run_one(spec: PassSpec, graph: Graph) -> tuple[Graph, bool, PassNotes]:
    result = spec.fn(graph)
    ok = (isinstance(result, tuple) and len(result) in (2, 3) and isinstance(result[0], Graph)
          and isinstance(result[1], bool)
          and (len(result) == 2 or isinstance(result[2], Mapping)))
    if not ok:
        raise VerifyError(f"pass {spec.name!r} must return (Graph, bool) or (Graph, bool, "
                          f"notes), got {type(result).__name__}")
    return result[0], result[1], (result[2] if len(result) == 3 else {})


def _verify_at(graph: Graph, where: str) -> None:
    try:
        verify(graph)
    except VerifyError as err:
        raise VerifyError(f"{where}: {err.message}", op=err.op, inputs=err.inputs,
                          loc=err.loc) from None


def _check_pass(spec: PassSpec, position: int, before: Graph, after: Graph,
                changed: bool) -> None:
    _verify_at(after, f"after pass {position:02d} {spec.name!r}")
    if changed == structurally_equal(before, after):
        said = "changed" if changed else "unchanged"
        raise VerifyError(f"pass {position:02d} {spec.name!r} reported the graph {said}, but it "
                          f"is {'the same' if changed else 'different'}")
