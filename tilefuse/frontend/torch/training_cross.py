"""A training step's forward and backward graphs cross-compiled for the cuda target, without a
GPU: what CI and a machine without a device can check of GPU training (host steps, PTX).

:func:`cross_compile_training` captures the step's Dynamo graphs on the CPU (under
``torch.autocast("cpu", dtype)`` when a dtype is given, standing in for CUDA's autocast: the
products and convolutions in the half dtype, the loss in f32), splits each into forward and
backward with the same AOTAutograd decompositions and partitioner as
:class:`~tilefuse.frontend.torch.training.TrainingGraph`, traces each half to core ATen as the
backend does, and builds every tilefuse region with
:func:`~tilefuse.runtime.gpu_cross.cross_compile`. Nothing runs: the capture stops after the
partition (the model's weights are never multiplied on the CPU), so GPT-2 small at batch 8,
sequence 512 cross-compiles in the time its kernels take to build.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilefuse.runtime.gpu_cross import CrossCompiled, cross_compile


class _Captured(Exception):
    """Stops Dynamo once a graph's halves are recorded (nothing is run)."""


@dataclass
class CrossTraining:
    """Per Dynamo graph (in capture order), per half (``forward``, ``backward``): the
    cross-compiled tilefuse regions, and the ATen ops left to torch (with their reasons)."""

    regions: list[dict[str, list[CrossCompiled]]] = field(default_factory=list)
    fallbacks: list[dict[str, list[tuple[str, str]]]] = field(default_factory=list)

    def host_steps(self) -> list[str]:
        """``graph/half/region: group: reason`` of every step that would run on the host."""
        found = []
        for i, halves in enumerate(self.regions):
            for half, built in halves.items():
                for j, region in enumerate(built):
                    found += [f"graph{i}/{half}/{j}: {s.group.name}: {s.reason}"
                              for s in region.host_steps]
        return found

    def torch_ops(self) -> list[str]:
        return [f"graph{i}/{half}: {op} ({reason})" for i, halves in enumerate(self.fallbacks)
                for half, ops in halves.items() for op, reason in ops]

    def ptx(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for halves in self.regions:
            for built in halves.values():
                for region in built:
                    found.update(region.ptx())
        return found


def _placeholder_args(gm: fx.GraphModule) -> list[Any]:
    """Uninitialised real tensors of the placeholders' recorded types (not touched: tracing
    reads their metadata only)."""
    args: list[Any] = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            args.append(torch.empty_strided(tuple(int(d) for d in val.shape),
                                            tuple(int(s) for s in val.stride()),
                                            dtype=val.dtype))
        else:
            args.append(val)
    return args


def _build_half(gm: fx.GraphModule, out: Path | None) -> tuple[list[CrossCompiled],
                                                               list[tuple[str, str]]]:
    from tilefuse.frontend.torch.backend import trace_to_core_aten
    from tilefuse.frontend.torch.partition import partition_and_compile

    traced = trace_to_core_aten(gm, _placeholder_args(gm))
    built: list[CrossCompiled] = []

    def compile_graph(graph: Any, name: str) -> Any:
        built.append(cross_compile(graph, None if out is None else out / name))
        return built[-1]

    report = partition_and_compile(traced, {}, compile_graph)
    return built, [f for f in report.fallbacks if f[0] != "aten.copy_.default"]


def cross_compile_training(model: torch.nn.Module, step: Callable[[Any], torch.Tensor],
                           dtype: torch.dtype | None = None, out: Path | str | None = None
                           ) -> CrossTraining:
    """``step(compiled_model)`` (which returns the loss) captured and each graph's forward and
    backward cross-compiled for the cuda target (module docstring); stages are written under
    ``out/graph<i>/<half>`` when given."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from tilefuse.frontend.torch.aten_training import training_decompositions
    from tilefuse.frontend.torch.backend import _DECOMPOSITIONS

    result = CrossTraining()
    where = None if out is None else Path(out)

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        index = len(result.regions)

        def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                      **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
            fw, bw = min_cut_rematerialization_partition(
                joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
            halves, torch_ops = {}, {}
            for half, g in (("forward", fw), ("backward", bw)):
                sub = None if where is None else where / f"graph{index}" / half
                halves[half], torch_ops[half] = _build_half(g, sub)
            result.regions.append(halves)
            result.fallbacks.append(torch_ops)
            raise _Captured

        try:
            with sdpa_kernel([SDPBackend.MATH]):
                aot_module_simplified(gm, list(example_inputs), fw_compiler=lambda g, _: g,
                                      partition_fn=partition,
                                      decompositions={**_DECOMPOSITIONS,
                                                      **training_decompositions()})
        except Exception as err:
            if not _caused_by_capture(err):
                raise
        return _stand_in(gm)

    compiled = torch.compile(model, backend=backend, dynamic=False)
    context = torch.autocast("cpu", dtype=dtype) if dtype is not None else nullcontext()
    try:
        with context:
            step(compiled)
    finally:
        torch._dynamo.reset()
    return result


def _stand_in(gm: fx.GraphModule) -> Callable[..., Any]:
    """A callable in the graph's place that returns uninitialised tensors of its outputs'
    recorded types (float ones requiring grad, so the next graph is a training graph too)."""
    outs = gm.graph.output_node().args[0]
    vals = [o.meta.get("example_value") if isinstance(o, fx.Node) else o for o in outs]

    def run(*args: Any) -> Any:
        made = []
        for val in vals:
            if isinstance(val, torch.Tensor):
                t = torch.empty(tuple(int(d) for d in val.shape), dtype=val.dtype)
                made.append(t.requires_grad_(val.requires_grad))
            else:
                made.append(val)
        return tuple(made) if isinstance(outs, tuple) else made
    return run


def _caused_by_capture(err: BaseException | None) -> bool:
    while err is not None:
        if isinstance(err, _Captured):
            return True
        err = err.__cause__ or err.__context__
    return False


__all__ = ["CrossTraining", "cross_compile_training"]
