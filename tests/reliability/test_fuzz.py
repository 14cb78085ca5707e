"""The differential fuzzer: a short campaign must find nothing, and the fuzzer itself must
notice a planted wrong result, shrink it and replay the saved repro."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tilefuse.fuzz.__main__ import main
from tilefuse.fuzz.campaign import replay, run_campaign
from tilefuse.fuzz.check import check_graph, random_inputs
from tilefuse.fuzz.generator import GeneratorConfig, generate_graph
from tilefuse.graph.verifier import verify
from tilefuse.runtime.native import NativeExecutable

SMALL = GeneratorConfig(max_ops=5, max_elements=1024)


def test_short_campaign_finds_no_failure(tmp_path: Path) -> None:
    report = run_campaign(200, seed=2024, schedules="alternate", config=SMALL,
                          out_dir=tmp_path)
    assert report.graphs == 200
    details = [f"{f.path}: {f.verdict.detail[:300]}" for f in report.failures]
    assert not report.failures, "\n".join(details)
    assert report.checks["ok"] >= 195


def test_nan_inf_campaign_finds_no_failure() -> None:
    report = run_campaign(20, seed=11, schedules="random", config=SMALL, specials=0.05)
    assert not report.failures, [f.verdict.detail[:300] for f in report.failures]


def test_generated_graphs_verify_and_vary() -> None:
    ops: set[str] = set()
    for i in range(60):
        graph = generate_graph(np.random.default_rng(i), SMALL)
        verify(graph)
        ops.update(n.op.name for n in graph.nodes)
    assert {"matmul", "softmax", "sum", "slice", "add"} <= ops


def _perturbing_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plants a bug: every native float output comes back slightly wrong."""
    original = NativeExecutable.__call__

    def wrong(self: NativeExecutable, *arrays: np.ndarray) -> list[np.ndarray]:
        outs = original(self, *arrays)
        return [o * 1.01 + 0.01 if o.dtype.kind == "f" else o for o in outs]

    monkeypatch.setattr(NativeExecutable, "__call__", wrong)


def test_planted_bug_is_found_shrunk_and_replayed(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _perturbing_call(monkeypatch)
    report = run_campaign(6, seed=3, schedules="default", config=GeneratorConfig(max_ops=8),
                          out_dir=tmp_path, max_failures=2)
    assert report.failures
    failure = report.failures[0]
    assert failure.verdict.kind == "mismatch" and failure.verdict.stage == "compare"
    assert len(failure.graph.nodes) <= failure.original_nodes
    assert len(failure.graph.nodes) <= 2, failure.graph   # one op shows the planted bug
    assert failure.path is not None and failure.path.read_text().startswith("# tilefuse")
    assert replay(failure.path).kind == "mismatch"
    monkeypatch.undo()
    assert replay(failure.path).kind == "ok"


def test_random_schedules_are_reproducible() -> None:
    graph = generate_graph(np.random.default_rng(5), SMALL)
    inputs = random_inputs(graph, 5)
    assert check_graph(graph, inputs, schedule_seed=17).kind == "ok"


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--graphs", "5", "--seed", "1", "--schedules", "random",
                 "--out", str(tmp_path)]) == 0
    assert "5 graphs" in capsys.readouterr().out
