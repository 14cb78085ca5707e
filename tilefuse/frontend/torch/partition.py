"""Partitioning an ATen FX graph into tilefuse graphs and torch fallback ops.

A node is *supported* when the converter table has its op and converting it alone succeeds and
gives exactly the shape and dtype torch recorded for it (so a converter can never silently
change a result's type). torch.fx's :class:`CapabilityBasedPartitioner` then grows maximal
regions of supported nodes that do not form a cycle through an unsupported node; each region
that does some arithmetic (not only views, copies and ``getitem``) becomes one tilefuse graph,
compiled once, and is called from the FX graph in place of its nodes. Every other call node runs
in torch, and each one is logged on the ``fallback`` topic with its reason.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from tilefuse.errors import TilefuseError
from tilefuse.frontend.torch.aten import ATEN_CONVERTERS, COMPUTE_FREE, RESULT_SHAPED
from tilefuse.frontend.torch.convert import (
    DTYPE_TO_TORCH,
    Lowering,
    Placeholder,
    lower_graph,
    numpy_to_tensor,
    op_name,
    tensor_to_numpy,
    val_type,
)
from tilefuse.frontend.torch.symbolic import expr
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph
from tilefuse.log import get_logger
from tilefuse.runtime.executable import Executable

PREFIX = "tilefuse_"


def _check_result(node: fx.Node, result: Any) -> None:
    """TilefuseError unless the converted result has the types torch recorded for ``node``."""
    val = node.meta.get("val")
    produced = result if isinstance(result, tuple) else (result,)
    expected = val if isinstance(val, (tuple, list)) else (val,)
    if len(produced) != len(expected):
        raise TilefuseError(f"gave {len(produced)} results, torch gives {len(expected)}",
                            op=op_name(node))
    for i, (value, want) in enumerate(zip(produced, expected)):
        if value is None:
            continue
        torch_type = val_type(want, f"{node.name}[{i}]", op_name(node))
        if value.type != torch_type:
            raise TilefuseError(f"result {i} would be {value.type}, torch gives {torch_type}",
                                op=op_name(node))


def _free_symbols(vals: Any) -> set[Any]:
    found: set[Any] = set()
    for val in vals if isinstance(vals, (tuple, list)) else (vals,):
        if isinstance(val, torch.Tensor):
            for d in val.shape:
                found |= getattr(expr(d), "free_symbols", set())
    return found


def _check_symbolic(node: fx.Node) -> None:
    """TilefuseError when a node of a dynamic graph takes a size computed at run time (except
    views, which read their recorded result shape) or makes a symbolic size that none of its
    tensor operands has (the tilefuse graph's inputs must bind every symbol)."""
    tensors = [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
    sizes = [a.name for a in node.all_input_nodes if a not in tensors]
    if sizes and node.target not in RESULT_SHAPED:
        raise TilefuseError(f"takes sizes computed at run time ({', '.join(sizes)})",
                            op=op_name(node))
    made = _free_symbols(node.meta.get("val")) - \
        set().union(*(_free_symbols(a.meta["val"]) for a in tensors))
    if made:
        raise TilefuseError(f"makes symbolic sizes {', '.join(sorted(map(str, made)))} that "
                            f"no tensor operand has", op=op_name(node))


class TilefuseSupport(OperatorSupportBase):
    """Which call nodes tilefuse can compile; ``reasons`` keeps why the others cannot."""

    def __init__(self) -> None:
        self.reasons: dict[fx.Node, str] = {}
        self._results: dict[fx.Node, Any] = {}

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module],
                          node: fx.Node) -> bool:
        return node.op == "call_function" and self.reason(node) is None

    def reason(self, node: fx.Node) -> str | None:
        """None when ``node`` is supported, else why not."""
        if node not in self.reasons and node not in self._results:
            try:
                self._results[node] = self._probe(node)
            except TilefuseError as err:
                self.reasons[node] = str(err)
        return self.reasons.get(node)

    def _probe(self, node: fx.Node) -> Any:
        if node.target is operator.getitem:
            source, index = node.args
            if not isinstance(source, fx.Node) or self.reason(source) is not None:
                raise TilefuseError("reads a result of an op that runs in torch")
            if self._results[source][index] is None:
                raise TilefuseError(f"reads result {index} of {op_name(source)}, which "
                                    f"tilefuse does not compute")
            return self._results[source][index]
        converter = ATEN_CONVERTERS.get(node.target)
        if converter is None:
            raise TilefuseError(f"no tilefuse converter for {op_name(node)}")
        _check_symbolic(node)
        lowering = Lowering(GraphBuilder("probe"), open_inputs=True)
        result = lowering.convert(node, converter)
        _check_result(node, result)
        return result


class CompiledPartition(torch.nn.Module):
    """One compiled tilefuse graph, called from the partitioned FX graph with torch tensors."""

    def __init__(self, executable: Executable, runtime: Sequence[int], single: bool):
        super().__init__()
        self.executable = executable
        self.runtime = tuple(runtime)   # which placeholders are fed at run time (not constants)
        self.single = single

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if getattr(self.executable, "device", "cpu") == "cuda":
            return self._forward_cuda(args)
        arrays = [tensor_to_numpy(args[i]) for i in self.runtime]
        outs = [numpy_to_tensor(a) for a in self.executable(*arrays)]
        return outs[0] if self.single else tuple(outs)


    def _forward_cuda(self, args: Sequence[torch.Tensor]) -> Any:
        """CUDA tensors in place: inputs by device pointer, outputs allocated by torch."""
        inputs = [args[i].detach().contiguous() for i in self.runtime]
        graph = self.executable.graph
        if any(t.device.type != "cuda" for t in inputs):
            raise TilefuseError(f"{graph.name} was compiled for the cuda target; its inputs "
                                f"must be CUDA tensors")
        run_torch = getattr(self.executable, "run_torch", None)
        if run_torch is not None:    # a sharded graph: segments and collectives on tensors
            outs = run_torch(inputs)
            return outs[0] if self.single else tuple(outs)
        device = inputs[0].device if inputs else torch.device("cuda")
        outs = [torch.empty(tuple(v.shape), dtype=DTYPE_TO_TORCH[v.dtype], device=device)
                for v in graph.outputs]
        # Queued on torch's current stream, so torch's own work on these tensors orders with it.
        stream = torch.cuda.current_stream(device).cuda_stream
        self.executable.run_device([t.data_ptr() for t in inputs],  # type: ignore[attr-defined]
                                   [o.data_ptr() for o in outs], stream)
        return outs[0] if self.single else tuple(outs)


@dataclass(frozen=True)
class PartitionReport:
    """What partitioning did: the tilefuse graphs (by submodule name) and the torch fallbacks
    (op name and reason, one per node)."""

    graphs: Mapping[str, Graph]
    fallbacks: tuple[tuple[str, str], ...]


Compile = Callable[[Graph, str], Executable]


def _log_fallbacks(gm: fx.GraphModule, support: TilefuseSupport) -> list[tuple[str, str]]:
    log = get_logger("fallback")
    fallbacks = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or support.is_node_supported({}, node):
            continue
        if isinstance(node.meta.get("val"), (torch.SymInt, int)):
            continue   # size arithmetic of a dynamic graph (s0*s1): Python ints at run time
        source = node.args[0] if node.target is operator.getitem else None
        if isinstance(source, fx.Node) and support.reason(source) is not None:
            continue  # reading a result of a torch op is part of that op's fallback
        reason = support.reason(node) or "unsupported"
        fallbacks.append((op_name(node), reason))
        log.debug("torch fallback: node %s runs in torch: %s", node.name, reason)
    return fallbacks


def partition_and_compile(gm: fx.GraphModule, constants: Mapping[fx.Node, torch.Tensor],
                          compile_graph: Compile) -> PartitionReport:
    """Rewrites ``gm`` in place: each supported region becomes a call of a
    :class:`CompiledPartition` built by ``compile_graph(graph, name)``. ``constants`` maps
    placeholder nodes to the tensors whose values are frozen into the tilefuse graphs."""
    support = TilefuseSupport()
    fallbacks = _log_fallbacks(gm, support)
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    regions = [p for p in partitioner.propose_partitions()
               if any(n.target not in COMPUTE_FREE for n in p.nodes)]
    if regions:
        partitioner.fuse_partitions(regions, prefix=PREFIX)
    graphs: dict[str, Graph] = {}
    # Fusing partitions can rebuild placeholder nodes: match the frozen ones by name as well
    # (placeholder names are unique in a graph), or weights would become runtime inputs.
    frozen = {n.name: t for n, t in constants.items()}
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith(PREFIX):
            continue
        name = str(node.target)
        sub = gm.get_submodule(name)
        assert isinstance(sub, fx.GraphModule)
        specs = [Placeholder(a, constants.get(a, frozen.get(a.name) if a.op == "placeholder"
                                              else None)) for a in node.args]
        graph = lower_graph(sub, specs, name, ATEN_CONVERTERS)
        graphs[name] = graph
        out = sub.graph.output_node().args[0]
        runtime = [i for i, s in enumerate(specs) if s.constant is None]
        setattr(gm, name, CompiledPartition(compile_graph(graph, name), runtime,
                                            single=not isinstance(out, (tuple, list))))
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return PartitionReport(graphs, tuple(fallbacks))


def write_report(directory: Path, gm: fx.GraphModule, report: PartitionReport) -> None:
    """``partitions.txt``: the partitioned FX graph and each fallback with its reason."""
    from tilefuse.dump import DumpWriter
    lines = ["# FX graph after partitioning (tilefuse_* are compiled tilefuse graphs)",
             str(gm.graph), "# torch fallbacks"]
    lines += [f"{op}: {reason}" for op, reason in report.fallbacks] or ["none"]
    DumpWriter(directory).write("partitions.txt", "\n".join(lines) + "\n")


__all__ = ["CompiledPartition", "PartitionReport", "TilefuseSupport", "partition_and_compile",
           "write_report"]
