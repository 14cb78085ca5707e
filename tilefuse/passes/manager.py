"""The pass manager: runs a list of passes, timing each, verifying at stage boundaries (after
every pass in debug mode), logging each pass on topic ``passes`` and dumping the graph after
each pass that changed it.

A pass is a plain function ``graph -> (graph, changed)``; ``changed`` is False exactly when the
result is structurally equal to the input (debug mode checks that promise).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tilefuse.dump import DumpWriter
from tilefuse.errors import TilefuseError, VerifyError
from tilefuse.graph.ir import Graph, structurally_equal
from tilefuse.graph.printer import print_graph
from tilefuse.graph.verifier import verify
from tilefuse.log import get_logger

Pass = Callable[[Graph], tuple[Graph, bool]]

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
class PassRecord:
    """What one pass did: position in the pipeline (1-based), whether it changed the graph,
    wall time, and the node count before and after."""

    position: int
    name: str
    changed: bool
    seconds: float
    nodes_before: int
    nodes_after: int


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
        rows = [f"{r.position:02d} {r.name:<16} {'changed' if r.changed else '-':<8} "
                f"{r.nodes_before:>5} -> {r.nodes_after:<5} {r.seconds * 1e3:9.3f} ms"
                for r in self.records]
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
    records = []
    for position, spec in enumerate(passes, start=1):
        before = graph
        start = time.perf_counter()
        graph, changed = _run_one(spec, before)
        seconds = time.perf_counter() - start
        if debug:
            _check_pass(spec, position, before, graph, changed)
        records.append(PassRecord(position, spec.name, changed, seconds, len(before.nodes),
                                  len(graph.nodes)))
        log.debug("%02d %s: %s, %d -> %d nodes, %.3f ms", position, spec.name,
                  "changed" if changed else "unchanged", len(before.nodes), len(graph.nodes),
                  seconds * 1e3)
        if changed and writer is not None:
            writer.write(f"{position:02d}-after-{spec.name}.graph", print_graph(graph))
    _verify_at(graph, "after the last pass")
    return graph, PipelineReport(tuple(records))


def _run_one(spec: PassSpec, graph: Graph) -> tuple[Graph, bool]:
    result = spec.fn(graph)
    ok = (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Graph)
          and isinstance(result[1], bool))
    if not ok:
        raise VerifyError(f"pass {spec.name!r} must return (Graph, bool), got "
                          f"{type(result).__name__}")
    return result


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
