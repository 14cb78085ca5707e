"""Kernels and bytes moved with and without the graph optimisations of issue 5 (constant folding
and equality saturation), on a BERT-base encoder layer and the light ResNet-50 from the onnx
package's test data. It counts (kernel formation on the optimised graph); it does not time.

Bytes moved = sum over kernels of the bytes of their inputs and outputs
(:class:`tilefuse.passes.manager.KernelFigures`).

    .venv/bin/python benchmarks/graph_opt.py
"""

from __future__ import annotations

import time
from pathlib import Path

import onnx

from tilefuse.graph.ir import Graph
from tilefuse.graph.types import TensorType
from tilefuse.onnx.importer import import_graph
from tilefuse.onnx.model import check_model, read_model
from tilefuse.passes.manager import KernelFigures, run_pipeline
from tilefuse.passes.pipeline import GRAPH_PIPELINE

OURS = frozenset({"constant_fold", "eqsat"})


def resnet50_graph() -> Graph:
    path = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    proto, folder = read_model(str(path))
    info = check_model(proto, folder)
    types = [TensorType(tuple(spec.dims), spec.dtype) for spec in info.inputs]
    return import_graph(info, types)


def bert_layer_graph() -> Graph:
    from tilefuse.zoo import bert_inputs, bert_layer, torch_graph

    return torch_graph(bert_layer(), bert_inputs(1, 128))


def _figures(graph: Graph, leave_out: frozenset[str]) -> KernelFigures:
    passes = [spec for spec in GRAPH_PIPELINE if spec.name not in leave_out]
    return KernelFigures.of(run_pipeline(graph, passes)[0])


def compare(name: str, graph: Graph) -> None:
    base = _figures(graph, OURS)
    folding = _figures(graph, frozenset({"eqsat"}))
    start = time.perf_counter()
    optimised, report = run_pipeline(graph, GRAPH_PIPELINE)
    seconds = time.perf_counter() - start
    ours = KernelFigures.of(optimised)
    print(f"{name}: kernels {base.kernels} -> {folding.kernels} (folding) -> {ours.kernels} "
          f"(folding + eqsat); bytes moved {base.bytes_moved:,} -> {folding.bytes_moved:,} -> "
          f"{ours.bytes_moved:,} (pipeline {seconds:.2f} s wall, approximate: shared machine)")
    for record in report.records:
        if record.name == "eqsat":
            print("  eqsat:", ", ".join(f"{k}={v}" for k, v in record.notes.items()))


def main() -> None:
    compare("BERT-base layer (1x128)", bert_layer_graph())
    compare("light ResNet-50", resnet50_graph())


if __name__ == "__main__":
    main()
