"""The pass manager: the pipeline list, dumps, debug verification, the report and its log."""

from __future__ import annotations

import logging
import textwrap

import numpy as np
import pytest

from tilefuse.dump import DumpWriter
from tilefuse.errors import TilefuseError, VerifyError
from tilefuse.graph.ir import Graph, Value, structurally_equal
from tilefuse.graph.parser import parse_graph
from tilefuse.graph.printer import print_graph
from tilefuse.passes import (
    GRAPH_PIPELINE,
    PassSpec,
    cse,
    dce,
    decompose_composites,
    run_pipeline,
    shape_infer,
    simplify_algebra,
)
from tilefuse.passes.attention import fuse_attention
from tilefuse.passes.constant_fold import constant_fold
from tilefuse.passes.conv_lowering import conv_to_matmul
from tilefuse.passes.eqsat import equality_saturation
from tilefuse.testing import assert_close, random_array

BEFORE = textwrap.dedent("""
    graph @g(%x: f32[2,3], %b: f32[3]) -> (f32[2,3], f32[2,3]) {
      %0 = add(%x, %b) : f32[2,3]
      %1 = add(%b, %x) : f32[2,3]
      %2 = exp(%0) : f32[2,3]
      %3 = tanh(%1) : f32[2,3]
      %4 = neg(%x) : f32[2,3]
      return %2, %3
    }
    """).lstrip()

AFTER = textwrap.dedent("""
    graph @g(%x: f32[2,3], %b: f32[3]) -> (f32[2,3], f32[2,3]) {
      %0 = add(%x, %b) : f32[2,3]
      %1 = exp(%0) : f32[2,3]
      %2 = tanh(%0) : f32[2,3]
      return %1, %2
    }
    """).lstrip()


def test_graph_pipeline_is_the_documented_list():
    assert [p.name for p in GRAPH_PIPELINE] == ["shape_infer", "decompose", "algebra",
                                                "conv_lowering", "dce", "cse", "constant_fold",
                                                "eqsat", "constant_fold", "dce", "attention",
                                                "dce"]
    assert [p.fn for p in GRAPH_PIPELINE] == [shape_infer, decompose_composites, simplify_algebra,
                                              conv_to_matmul, dce, cse, constant_fold,
                                              equality_saturation, constant_fold, dce,
                                              fuse_attention, dce]
    assert all(p.doc for p in GRAPH_PIPELINE)


def test_pipeline_result_and_numbers():
    graph = parse_graph(BEFORE)
    result, report = run_pipeline(graph, GRAPH_PIPELINE)
    assert print_graph(result) == AFTER
    rng = np.random.default_rng(7)
    args = [random_array(rng, (2, 3), graph.inputs[0].dtype),
            random_array(rng, (3,), graph.inputs[1].dtype)]
    from tilefuse.graph.interpreter import interpret
    for got, want in zip(interpret(result, *args), interpret(graph, *args), strict=True):
        assert_close(got, want)
    rows = [(r.position, r.name, r.changed, r.nodes_before, r.nodes_after)
            for r in report.records]
    assert rows == [(1, "shape_infer", False, 5, 5), (2, "decompose", False, 5, 5),
                    (3, "algebra", False, 5, 5), (4, "conv_lowering", False, 5, 5),
                    (5, "dce", True, 5, 4), (6, "cse", True, 4, 3),
                    (7, "constant_fold", False, 3, 3), (8, "eqsat", False, 3, 3),
                    (9, "constant_fold", False, 3, 3), (10, "dce", False, 3, 3),
                    (11, "attention", False, 3, 3), (12, "dce", False, 3, 3)]
    assert all(r.seconds >= 0 for r in report.records)
    assert report.total_seconds == pytest.approx(sum(r.seconds for r in report.records))
    assert report.changed == ("dce", "cse")
    shown = str(report)
    assert "05 dce" in shown and "changed" in shown and "total" in shown


def _without_header(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def test_dumps_only_changed_passes(tmp_path):
    graph = parse_graph(BEFORE)
    run_pipeline(graph, GRAPH_PIPELINE, dump_dir=tmp_path / "dump")
    files = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert files == ["00-captured.graph", "05-after-dce.graph", "06-after-cse.graph",
                     "passes.report"]
    assert (tmp_path / "dump" / "00-captured.graph").read_text() == BEFORE
    after_dce = (tmp_path / "dump" / "05-after-dce.graph").read_text()
    assert _without_header(after_dce) == print_graph(dce(graph)[0])
    # the header gives kernels and bytes moved before and after: kernel formation already
    # ignored the dead neg, so two kernels (add+exp, add+tanh), each reading x (24 bytes) and
    # b (12) and writing 24
    assert after_dce.startswith("# kernels 2 -> 2, bytes moved 120 -> 120\n")
    assert _without_header((tmp_path / "dump" / "06-after-cse.graph").read_text()) == AFTER
    report = (tmp_path / "dump" / "passes.report").read_text()
    assert "08 eqsat" in report and "kernels 2 -> 2" in report
    # a dump is graph text: it parses back
    assert structurally_equal(parse_graph(AFTER),
                              parse_graph((tmp_path / "dump" / "06-after-cse.graph").read_text()))


def test_dumps_accept_a_writer_and_number_by_position(tmp_path):
    graph = parse_graph(BEFORE)
    passes = (PassSpec("cse", cse, ""), PassSpec("cse", cse, ""), PassSpec("dce", dce, ""))
    run_pipeline(graph, passes, dump_dir=DumpWriter(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "00-captured.graph", "01-after-cse.graph", "03-after-dce.graph", "passes.report"]


def _dangling(graph: Graph) -> tuple[Graph, bool]:
    """A broken pass: returns a graph whose output is defined nowhere."""
    return Graph(graph.name, graph.inputs, graph.nodes,
                 (Value(graph.outputs[0].type),)), True


def _liar(graph: Graph) -> tuple[Graph, bool]:
    return dce(graph)[0], False


def test_debug_mode_verifies_after_every_pass():
    graph = parse_graph(BEFORE)
    passes = (PassSpec("breaker", _dangling), PassSpec("undo", lambda g: (graph, True)))
    with pytest.raises(VerifyError, match="after pass 01 'breaker': graph output 0"):
        run_pipeline(graph, passes, debug=True)
    # without debug mode the breakage goes unnoticed until a stage boundary catches it
    result, _ = run_pipeline(graph, passes)
    assert result is graph
    with pytest.raises(VerifyError, match="after the last pass: graph output 0"):
        run_pipeline(graph, passes[:1])


def test_debug_mode_checks_the_changed_flag():
    with pytest.raises(VerifyError, match="reported the graph unchanged, but it is different"):
        run_pipeline(parse_graph(BEFORE), (PassSpec("liar", _liar),), debug=True)
    run_pipeline(parse_graph(AFTER), (PassSpec("liar", _liar),), debug=True)


def test_the_input_is_verified_before_the_first_pass():
    graph = parse_graph(BEFORE)
    broken = Graph("g", graph.inputs, graph.nodes[1:], graph.outputs)
    with pytest.raises(VerifyError, match="before the first pass"):
        run_pipeline(broken, GRAPH_PIPELINE)


def test_bad_pass_results_and_names_are_errors():
    with pytest.raises(VerifyError, match=r"must return \(Graph, bool\)"):
        run_pipeline(parse_graph(AFTER), (PassSpec("bad", lambda g: g),))  # type: ignore
    with pytest.raises(TilefuseError, match="lower-case identifier"):
        PassSpec("../escape", dce)


def test_each_pass_is_logged_on_the_passes_topic(caplog):
    with caplog.at_level(logging.DEBUG, logger="tilefuse.passes"):
        run_pipeline(parse_graph(BEFORE), GRAPH_PIPELINE)
    records = [r for r in caplog.records if r.name == "tilefuse.passes"]
    assert [r.getMessage().split(":")[0] for r in records] == [
        "01 shape_infer", "02 decompose", "03 algebra", "04 conv_lowering", "05 dce", "06 cse",
        "07 constant_fold", "08 eqsat", "09 constant_fold", "10 dce", "11 attention", "12 dce"]
    assert "changed, 5 -> 4 nodes" in records[4].getMessage()


def test_pass_notes_reach_the_report_and_bad_notes_are_errors():
    graph = parse_graph(AFTER)
    noting = PassSpec("noting", lambda g: (g, False, {"stopped": "saturated",
                                                      "rules_fired": {"mul_one": 2}}))
    _, report = run_pipeline(graph, (noting,))
    assert report.records[0].notes["rules_fired"] == {"mul_one": 2}
    assert "stopped: saturated" in str(report) and "rules_fired: mul_one=2" in str(report)
    with pytest.raises(VerifyError, match="notes"):
        run_pipeline(graph, (PassSpec("bad", lambda g: (g, False, "notes")),))  # type: ignore
