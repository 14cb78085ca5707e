"""Suite-wide fixtures.

Every graph any test builds through ``GraphBuilder.build`` is printed, parsed back and compared
with ``structurally_equal``: that is how the text format is round-trip tested on every graph the
tests make. Graphs that do not verify (built broken on purpose) are left alone: their text is
not meant to parse. A graph that verifies but does not survive the round trip fails the test
loudly, naming both texts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tilefuse.dtypes import DType
from tilefuse.errors import TilefuseError, VerifyError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Value, structurally_equal
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.graph.verifier import verify


def check_round_trip(graph: Graph) -> None:
    """Fails the current test unless ``graph`` prints, parses back and prints the same."""
    try:
        verify(graph)
    except VerifyError:
        return
    text = print_graph(graph)
    try:
        back = parse_graph(text)
    except TilefuseError as err:
        pytest.fail(f"graph text does not parse back: {err}\n--- text ---\n{text}")
    if not structurally_equal(back, graph):
        pytest.fail(f"graph text round trip differs\n--- printed ---\n{text}"
                    f"--- reparsed ---\n{print_graph(back)}")


@pytest.fixture(autouse=True)
def _round_trip_every_graph(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    original = GraphBuilder.build
    busy: list[bool] = []  # the parser builds graphs too; check only the outermost

    def build(self: GraphBuilder, outputs: Sequence[Value]) -> Graph:
        graph = original(self, outputs)
        if not busy:
            busy.append(True)
            try:
                check_round_trip(graph)
            finally:
                busy.pop()
        return graph

    monkeypatch.setattr(GraphBuilder, "build", build)
    yield


_UNARY = ("neg", "exp", "tanh", "gelu")
_BINARY = ("add", "mul", "div")


def random_graph(rng: np.random.Generator, n_nodes: int = 12) -> Graph:
    """A random f32 graph over inputs x: [2,3] and b: [3] with unary, binary, where and split
    nodes, some repeated computations (swapped for commutative ops) and some dead nodes."""
    builder = GraphBuilder("random")
    values = [builder.input(((2, 3), DType.f32), "x"), builder.input(((3,), DType.f32), "b")]
    made: list[tuple[str, list[Value], dict]] = []
    for _ in range(n_nodes):
        pick = lambda: values[int(rng.integers(len(values)))]  # noqa: E731
        roll = rng.random()
        if made and roll < 0.2:
            op, args, attrs = made[int(rng.integers(len(made)))]
            args = args[::-1] if op in ("add", "mul") else args
        elif roll < 0.45:
            op, args, attrs = str(rng.choice(_UNARY)), [pick()], {}
        elif roll < 0.8:
            op, args, attrs = str(rng.choice(_BINARY)), [pick(), pick()], {}
        elif roll < 0.9:
            a, b = pick(), pick()
            cond = builder.add1("lt", [a, b])
            op, args, attrs = "where", [cond, a, b], {}
        else:
            x = pick()
            op, args, attrs = "split", [x], {"axis": x.type.rank - 1, "sizes": (1, 2)}
        outs = builder.add(op, args, attrs)
        made.append((op, args, attrs))
        values.extend(v for v in outs if v.type.shape[-1] == 3)
    count = int(rng.integers(1, 4))
    outputs = [values[int(i)] for i in rng.choice(len(values), size=count)]
    return builder.build(outputs)


@pytest.fixture(scope="session")
def graph_factory() -> Callable[[np.random.Generator, int], Graph]:
    """:func:`random_graph`, for tests in any folder."""
    return random_graph


@pytest.fixture(scope="session", autouse=True)
def _session_kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Kernels compiled by tests go to one temp cache for the session, never ~/.cache.
    (Subprocesses inherit it through the environment.) Under pytest-xdist the workers share
    one: the session's base temp folder (``pytest-N/``) holds each worker's ``popen-gwK/``, and
    the cache sits beside them. The disk cache is safe across processes (atomic writes,
    validated reads; tests/reliability tests that); tests of the cache itself use their own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        directory = tmp_path_factory.getbasetemp().parent / "kernel-cache"
        directory.mkdir(mode=0o700, exist_ok=True)
    else:
        directory = tmp_path_factory.mktemp("kernel-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TILEFUSE_CACHE_DIR", str(directory))
        patch.delenv("TILEFUSE_CACHE", raising=False)
        yield


# --- pytest-xdist: the longest tests start first -------------------------------------------------
# Under --dist worksteal each worker first gets a contiguous share of the collection, and an
# idle worker steals the second half of the longest queue: the run ends on the tests at the end
# of the queues. In path order those were tests/tune's (15-30 s each, Ray's and the tuner's),
# so one worker ran them while the other idled. Workers therefore sort the collection so that
# folders (and a few files) with long tests come first and the many short tests (ops, graph,
# loop, passes) come last, where they even out the end. A folder keeps its files in order, so
# module-scoped fixtures still set up once per worker. One process (-n 0) keeps path order.

LONG_FIRST = (
    "tests/onnx_conformance/test_onnx_backend.py::test_backend[light/",  # whole models
    "tests/dynamic/", "tests/distributed/", "tests/tune/", "tests/reliability/", "tests/torch/",
    "tests/cross/", "tests/cli/", "tests/runtime/", "tests/artifact/", "tests/onnx/",
    "tests/passes/", "tests/frontend/", "tests/kernel/", "tests/driver/", "tests/gpu/",
    "tests/onnx_conformance/", "tests/codegen/", "tests/graph/", "tests/ops/", "tests/loop/",
)
"""Node id prefixes, by the mean time of their tests, longest first (the first match counts).
Measured on the 2-core machine, 2026-12-03 (``--durations=0`` of the whole suite: the light
models 86 s a test on the busy machine, dynamic 9.4, distributed 8.6, tune 8.1, ... ops 0.03,
loop 0.01). Anything else (a folder added since) runs before them all: unknown is treated as
long, so that it cannot end the run."""


def _long_first_rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(LONG_FIRST) if nodeid.startswith(prefix)), -1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _is_xdist_worker(config):
        items.sort(key=lambda item: _long_first_rank(item.nodeid))  # stable: paths in order


_TORCH_THREADS_SHARED: list[bool] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under pytest-xdist each worker's eager torch (the reference of the torch tests, dynamo
    and AOT autograd) gets its share of the cores, not all of them: two workers each running
    two OpenMP threads on two cores spun and preempted each other (a torch training test
    took ~30% more CPU and ~40% more time, measured interleaved on the busy 2-core machine).
    tilefuse's own thread pool is left alone (it reads TILEFUSE_NUM_THREADS/OMP_NUM_THREADS,
    which are not touched, so tests of parallel kernels still run them on every core), and so
    are subprocesses. Done once, before the first test after torch is imported: this never
    imports torch."""
    if _TORCH_THREADS_SHARED or "torch" not in sys.modules:
        return
    _TORCH_THREADS_SHARED.append(True)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    torch = sys.modules["torch"]
    share = max(1, len(os.sched_getaffinity(0)) // workers)
    if workers > 1 and share < torch.get_num_threads():
        torch.set_num_threads(share)


# --- ONNX conformance bookkeeping -------------------------------------------------------------
# tests/onnx_conformance/test_onnx_backend.py records each test's bucket in its report's
# user_properties. The hooks that count them live here rather than in that folder's conftest.py
# because this file is the one the pytest-xdist controller loads whatever the command line: the
# controller receives every worker's reports, so its counts are the whole session's. Workers
# count nothing (they would write partial reports).

CONFORMANCE_REPORT_ENV = "TILEFUSE_CONFORMANCE_REPORT"
_CONFORMANCE_ROWS: list[tuple[str, str, str, str]] = []


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    _CONFORMANCE_ROWS.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == "conformance":
            directory, name, bucket, detail = value
            _CONFORMANCE_ROWS.append((directory, name, bucket, detail))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not _CONFORMANCE_ROWS or _is_xdist_worker(config):
        return
    counts: dict[str, dict[str, int]] = {}
    for directory, _, bucket, _ in _CONFORMANCE_ROWS:
        per = counts.setdefault(directory, {})
        per[bucket] = per.get(bucket, 0) + 1
    terminalreporter.section("ONNX conformance buckets")
    for directory, per in counts.items():
        shown = ", ".join(f"{b} {n}" for b, n in sorted(per.items()))
        terminalreporter.write_line(f"{directory}: {shown}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(CONFORMANCE_REPORT_ENV)
    if not target or not _CONFORMANCE_ROWS or _is_xdist_worker(session.config):
        return
    import importlib.util

    import onnx

    spec = importlib.util.spec_from_file_location(
        "conformance_report", Path(__file__).parent / "onnx_conformance" / "conformance_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = sorted(_CONFORMANCE_ROWS, key=lambda r: (r[0], r[1]))
    Path(target).write_text(module.render(rows, onnx.__version__))
