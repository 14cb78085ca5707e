"""The model check: verdicts timed in the model's own call, taken back when not faster there."""

from __future__ import annotations

import pytest
from helpers_tune import matmul_candidates, matmul_graph

from tilefuse.tune import in_model
from tilefuse.tune.database import MemoryDatabase, TuneKey
from tilefuse.tune.in_model import TunedKernel, check_in_model
from tilefuse.tune.task import named_tasks


def _tuned(verdict_index: int) -> tuple[object, TunedKernel, MemoryDatabase]:
    task, schedules = matmul_candidates(2)
    graph = task.graph
    [(name, _)] = named_tasks(graph)
    key = TuneKey(task.fingerprint(), "t")
    db = MemoryDatabase()
    db.decide(key, schedules[verdict_index], 1.1)
    return graph, TunedKernel(key, (name,), schedules[verdict_index], schedules[0]), db


def test_nothing_changed_nothing_to_check():
    graph, tuned, db = _tuned(0)
    assert check_in_model(graph, [tuned], db, rounds=1) is None


def test_both_builds_run_the_graph_and_the_gain_decides_the_verdict():
    """Real builds, real timings: the gain is a positive ratio, and the verdict is kept
    exactly when it is at least IN_MODEL_MIN_GAIN."""
    graph, tuned, db = _tuned(1)
    check = check_in_model(graph, [tuned], db, rounds=5)
    gain = check.gains[tuned.names[0]]
    assert gain > 0 and check.default_seconds > 0 and check.tuned_seconds > 0
    kept = gain >= in_model.IN_MODEL_MIN_GAIN
    assert (tuned.names[0] not in check.reverted) == kept
    assert db.verdict(tuned.key)[0] == (tuned.verdict if kept else tuned.default)
    assert "in the model's call (5 rounds" in check.summary()


@pytest.mark.parametrize(("tuned_seconds", "kept"), [(2.0, False), (0.5, True)])
def test_a_verdict_slower_in_the_model_is_taken_back(monkeypatch, tuned_seconds, kept):
    """Scripted step times: the default build's kernel step takes 1 s, the tuned build's
    ``tuned_seconds``; a slower one goes back to the default in the database."""
    graph, tuned, db = _tuned(1)
    builds = iter(["default", "tuned"])
    monkeypatch.setattr(in_model, "step_calls", lambda exe, arrays: [next(builds)])
    seconds = {"default": 1.0, "tuned": tuned_seconds}
    monkeypatch.setattr(in_model, "_timed_round",
                        lambda steps: {tuned.names[0]: seconds[steps[0]], "other": 0.25})
    check = check_in_model(graph, [tuned], db, rounds=3)
    assert check.gains == {tuned.names[0]: pytest.approx(1.0 / tuned_seconds)}
    assert check.reverted == (() if kept else (tuned.names[0],))
    assert db.verdict(tuned.key)[0] == (tuned.verdict if kept else tuned.default)
    assert check.default_seconds == 1.25 and check.tuned_seconds == tuned_seconds + 0.25


def test_kernels_sharing_a_fingerprint_are_counted_together():
    samples = {"default": [{"a": 1.0, "b": 1.0, "c": 5.0}],
               "tuned": [{"a": 0.5, "b": 1.5, "c": 1.0}]}
    assert in_model._paired_gain(samples, ("a", "b")) == pytest.approx(1.0)
    assert in_model._paired_gain(samples, ("c",)) == pytest.approx(5.0)


def test_example_arrays_follow_the_graph_inputs():
    graph = matmul_graph(7, 5, 3, constant_w=False)
    arrays = in_model.example_arrays(graph)
    assert [a.shape for a in arrays] == [(7, 5), (5, 3)]
    assert all(a.any() for a in arrays)


def test_a_symbolic_input_needs_example_inputs():
    from tilefuse.dtypes import DType
    from tilefuse.graph.builder import GraphBuilder
    from tilefuse.graph.types import Sym
    from tilefuse.tune.task import TuneError

    b = GraphBuilder("sym")
    x = b.input(((Sym("n"), 5), DType.f32), "x")
    graph = b.build([b.add1("relu", [x])])
    with pytest.raises(TuneError, match="symbolic dims"):
        in_model.example_arrays(graph)
