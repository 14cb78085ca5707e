"""Memory planner: hand cases, random intervals (hypothesis), liveness bridge, report text."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tilefuse.dtypes import DType
from tilefuse.errors import VerifyError
from tilefuse.graph.analysis import liveness
from tilefuse.graph.builder import GraphBuilder
from tilefuse.runtime.memory import (
    ALIGNMENT,
    BufferRequest,
    MemoryPlan,
    align_up,
    format_bytes,
    live_peak_bytes,
    plan_from_liveness,
    plan_memory,
    value_names,
    verify_plan,
)

MiB = 1 << 20


def _plan(requests: list[BufferRequest]) -> MemoryPlan:
    plan = plan_memory(requests)
    verify_plan(plan, requests)
    return plan


# --- hand cases -------------------------------------------------------------------------------

def test_chain_reuses_memory():
    # a -> b -> c: a dies when b is made, so c can take a's place
    a, b, c = (BufferRequest("a", 1000, 0, 1), BufferRequest("b", 1000, 1, 2),
               BufferRequest("c", 1000, 2, 3))
    plan = _plan([a, b, c])
    assert plan.offsets["a"] == plan.offsets["c"]
    assert plan.offsets["a"] != plan.offsets["b"]
    assert plan.arena_bytes == align_up(1000) + 1000
    assert plan.sum_bytes == 3 * align_up(1000)


def test_all_alive_at_once_needs_the_sum():
    requests = [BufferRequest(f"t{i}", 64 * (i + 1), 0, 5) for i in range(5)]
    plan = _plan(requests)
    assert plan.arena_bytes == plan.sum_bytes == 64 * (1 + 2 + 3 + 4 + 5)
    assert sorted(plan.offsets.values()) == sorted(set(plan.offsets.values()))


def test_largest_first_and_freed_space_reused():
    # big and top are long-lived; small takes the bytes hole had once hole is dead
    requests = [BufferRequest("big", 4096, 0, 9), BufferRequest("hole", 1024, 0, 2),
                BufferRequest("top", 2048, 0, 9), BufferRequest("small", 1024, 5, 6)]
    plan = _plan(requests)
    assert plan.offsets["big"] == 0
    assert (plan.offsets["top"], plan.offsets["hole"]) == (4096, 6144)
    assert plan.offsets["small"] == plan.offsets["hole"]
    assert plan.arena_bytes == 4096 + 2048 + 1024


def test_lowest_waste_gap_wins_over_first_gap():
    # during step 5 only q1 and q2 are live: below q1 is a 2048-byte hole (p1, p2) and between
    # q1 and q2 a 512-byte hole (r1); x goes into the smaller one
    requests = [BufferRequest("p1", 1024, 0, 1), BufferRequest("p2", 1024, 0, 1),
                BufferRequest("q1", 960, 0, 9), BufferRequest("r1", 512, 0, 1),
                BufferRequest("q2", 448, 0, 9), BufferRequest("x", 400, 5, 5)]
    plan = _plan(requests)
    assert [plan.offsets[n] for n in ("p1", "p2", "q1", "r1", "q2")] == [0, 1024, 2048, 3008,
                                                                        3520]
    assert plan.offsets["x"] == 3008


def test_zero_size_buffers_get_offset_zero_and_cost_nothing():
    requests = [BufferRequest("empty", 0, 0, 3), BufferRequest("x", 100, 0, 3),
                BufferRequest("y", 0, 2, 2)]
    plan = _plan(requests)
    assert plan.offsets == {"empty": 0, "x": 0, "y": 0}
    assert plan.arena_bytes == 100
    assert _plan([]).arena_bytes == 0


def test_offsets_are_aligned_even_for_odd_sizes():
    requests = [BufferRequest(f"b{i}", 1 + 7 * i, 0, 1) for i in range(6)]
    plan = _plan(requests)
    assert all(off % ALIGNMENT == 0 for off in plan.offsets.values())


def test_requests_are_checked():
    with pytest.raises(VerifyError, match="negative size"):
        BufferRequest("a", -1, 0, 1)
    with pytest.raises(VerifyError, match="ends before it starts"):
        BufferRequest("a", 8, 3, 2)
    with pytest.raises(VerifyError, match="non-empty string"):
        BufferRequest("", 8, 0, 1)
    with pytest.raises(VerifyError, match="must be an int"):
        BufferRequest("a", 8.0, 0, 1)  # type: ignore[arg-type]
    with pytest.raises(VerifyError, match="must be an int"):
        BufferRequest("a", True, 0, 1)  # type: ignore[arg-type]
    assert BufferRequest("a", np.int64(8), 0, 1).nbytes == 8  # type: ignore[arg-type]
    with pytest.raises(VerifyError, match="requested twice"):
        plan_memory([BufferRequest("a", 8, 0, 1), BufferRequest("a", 8, 2, 3)])


# --- verify_plan ------------------------------------------------------------------------------

def test_verify_plan_rejects_overlap_misalignment_and_mismatch():
    a, b = BufferRequest("a", 128, 0, 2), BufferRequest("b", 128, 2, 4)
    with pytest.raises(VerifyError, match=r"'a' .* and 'b' .* overlap while both are live"):
        verify_plan(MemoryPlan({"a": 0, "b": 64}, 192, 256), [a, b])
    with pytest.raises(VerifyError, match="not a non-negative multiple of 64"):
        verify_plan(MemoryPlan({"a": 0, "b": 130}, 258, 256), [a, b])
    with pytest.raises(VerifyError, match="ends past the arena"):
        verify_plan(MemoryPlan({"a": 0, "b": 128}, 200, 256), [a, b])
    with pytest.raises(VerifyError, match=r"unplaced: \['b'\]"):
        verify_plan(MemoryPlan({"a": 0}, 128, 256), [a, b])
    with pytest.raises(VerifyError, match=r"unknown: \['z'\]"):
        verify_plan(MemoryPlan({"a": 0, "b": 128, "z": 0}, 256, 256), [a, b])
    # the same bytes at disjoint times are fine
    verify_plan(MemoryPlan({"a": 0, "b": 0}, 128, 256), [a, BufferRequest("b", 128, 3, 4)])


# --- random cases -----------------------------------------------------------------------------

@st.composite
def _requests(draw: st.DrawFn) -> list[BufferRequest]:
    count = draw(st.integers(0, 24))
    result = []
    for i in range(count):
        start = draw(st.integers(0, 15))
        length = draw(st.integers(0, 6))
        size = draw(st.one_of(st.integers(0, 5000), st.integers(0, 40).map(lambda k: 64 * k)))
        result.append(BufferRequest(f"b{i}", size, start, start + length))
    return result


@settings(max_examples=300, deadline=None)
@given(_requests())
def test_random_plans_are_valid_and_never_above_the_sum(requests):
    plan = _plan(requests)
    assert live_peak_bytes(requests) <= plan.arena_bytes <= plan.sum_bytes
    assert plan.sum_bytes == sum(align_up(r.nbytes) for r in requests)
    assert plan.arena_bytes == max((plan.offsets[r.name] + r.nbytes for r in requests),
                                   default=0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40).map(lambda k: 64 * k), min_size=1, max_size=16))
def test_simple_chains_need_exactly_the_largest_live_set(sizes):
    # each value is read by the next step only: value i lives over [i, i + 1]
    requests = [BufferRequest(f"v{i}", n, i, i + 1) for i, n in enumerate(sizes)]
    plan = _plan(requests)
    pairs = [a + b for a, b in zip(sizes, [*sizes[1:], 0])]
    assert plan.arena_bytes == live_peak_bytes(requests) == max(pairs)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=16))
def test_chains_of_odd_sizes_need_at_most_the_aligned_live_set(sizes):
    requests = [BufferRequest(f"v{i}", n, i, i + 1) for i, n in enumerate(sizes)]
    plan = _plan(requests)
    assert plan.arena_bytes <= live_peak_bytes(requests, aligned=True)


def test_a_chain_that_plain_greedy_gets_wrong_reaches_the_live_peak():
    # greedy by size puts v0 and v3 both at 0, so v1 and v2 stack above them (2816 bytes)
    sizes = [1280, 704, 960, 1152, 832, 128, 448, 1024]
    requests = [BufferRequest(f"v{i}", n, i, i + 1) for i, n in enumerate(sizes)]
    assert _plan(requests).arena_bytes == 2112


def test_plans_are_deterministic():
    requests = [BufferRequest(f"b{i}", 64 * (i % 3 + 1), i % 4, i % 4 + 2) for i in range(12)]
    assert plan_memory(requests) == plan_memory(list(reversed(requests)))


# --- liveness bridge --------------------------------------------------------------------------

def test_plan_from_graph_liveness():
    b = GraphBuilder("mlp")
    x = b.input(((256, 256), DType.f32), "x")
    h1 = b.add1("tanh", [x])
    h2 = b.add1("exp", [h1])
    h3 = b.add1("neg", [h2])
    h4 = b.add1("add", [h3, x])
    graph = b.build([h4])
    live = liveness(graph)
    intermediates = [h1, h2, h3]
    plan = plan_from_liveness(intermediates, live, lambda v: v.type.nbytes)
    names = value_names(intermediates)
    assert names == {h1: "%0", h2: "%1", h3: "%2"}
    size = 256 * 256 * 4
    assert plan.arena_bytes == 2 * size  # h1 and h3 share
    assert plan.offsets[names[h1]] == plan.offsets[names[h3]]
    assert "[0, 1]" in plan.report()


def test_value_names_prefer_unique_names():
    class V:
        def __init__(self, name):
            self.name = name

    a, b, c, d = V("a"), V("dup"), V("dup"), V("%1")
    assert value_names([a, b, c, d]) == {a: "a", b: "%1", c: "%2", d: "%3"}


def test_plan_from_liveness_checks_its_inputs():
    with pytest.raises(VerifyError, match="no liveness interval"):
        plan_from_liveness(["a", "b"], {"a": (0, 1)}, lambda v: 8, name_of=str)
    with pytest.raises(VerifyError, match="requested twice"):
        plan_from_liveness(["a", "b"], {"a": (0, 1), "b": (0, 1)}, lambda v: 8,
                           name_of=lambda v: "same")
    plan = plan_from_liveness(["a", "b"], {"a": (0, 1), "b": (2, 3)}, lambda v: 8, name_of=str)
    assert plan.offsets == {"a": 0, "b": 0}


# --- report -----------------------------------------------------------------------------------

def test_report_text():
    requests = [BufferRequest("a", 4 * MiB, 0, 1), BufferRequest("b", 8 * MiB, 1, 2),
                BufferRequest("c", 4 * MiB, 2, 3), BufferRequest("d", 2 * MiB, 3, 4),
                BufferRequest("e", 2 * MiB, 4, 4)]
    report = _plan(requests).report()
    lines = report.splitlines()
    assert lines[0] == ("arena 12.0 MiB for 5 buffers, 20.0 MiB if each had its own "
                        "(saves 40%)")
    assert lines[1].split() == ["buffer", "offset", "bytes", "size", "live"]
    assert lines[2].split() == ["b", "0", str(8 * MiB), "8.0", "MiB", "[1,", "2]"]
    assert [line.split()[0] for line in lines[2:]] == ["b", "d", "e", "a", "c"]
    assert len(lines) == 7 and report.endswith("\n")


def test_summary_of_small_and_empty_plans():
    assert _plan([BufferRequest("x", 100, 0, 0)]).summary() == (
        "arena 100 B for 1 buffer, 128 B if each had its own (saves 22%)")
    assert _plan([]).summary() == "arena 0 B for 0 buffers, 0 B if each had its own (saves 0%)"
    assert [format_bytes(n) for n in (0, 1023, 1536, 3 * MiB, 5 << 30)] == [
        "0 B", "1023 B", "1.5 KiB", "3.0 MiB", "5.0 GiB"]
