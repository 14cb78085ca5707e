"""Training graphs: forward and backward compiled by tilefuse through AOTAutograd.

When Dynamo hands the backend a graph with grad mode on and an input that requires grad,
:func:`compile_training` gives it to ``aot_module_simplified``, which traces the joint
forward-backward graph with the core-ATen decompositions, and splits it with a partition
function (torch's min-cut rematerialisation partitioner: it decides what the forward saves for
the backward and recomputes cheap elementwise values in the backward instead of saving them).
Each half is then compiled like an inference graph (:class:`SpecializedGraph`: traced to core
ATen per input signature, partitioned, each supported region one tilefuse executable).

**Parameters are inputs.** Nothing is frozen: the parameters are runtime inputs of the forward
graph, so an optimiser step that updates them in place is seen by the next call (inference
freezes them, see :mod:`~tilefuse.frontend.torch.backend`).

**Fallbacks are never silent.** An op tilefuse cannot compile runs in torch inside the graph,
and :func:`warn_fallbacks` logs one WARNING per graph naming it and the reasons, for training
and inference graphs alike. The partition's choice (values saved, values recomputed, bytes of
saved activations) is kept in :attr:`TrainingGraph.report` and written to the dump as
``partition.txt``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilefuse.log import get_logger
from tilefuse.runtime.arena_space import ArenaSpace, using

_warned: set[str] = set()
WRITE_BACKS = ("aten.copy_.default",)
"""Ops that only write a functionalized result back into a mutated input: not fallbacks."""
_warned_lock = threading.Lock()


def warn_fallbacks(name: str, fallbacks: Sequence[tuple[str, str]], what: str = "graph"
                   ) -> None:
    """One WARNING per graph ``name`` that runs some ops in torch: which and why."""
    fallbacks = [f for f in fallbacks if f[0] not in WRITE_BACKS]
    if not fallbacks:
        return
    with _warned_lock:
        if name in _warned:
            return
        _warned.add(name)
    ops: dict[str, str] = {}
    for op, reason in fallbacks:
        ops.setdefault(op, reason)
    shown = "; ".join(f"{op} ({reason})" for op, reason in ops.items())
    get_logger("fallback").warning("torch fallback in %s %s: %d op(s) run in torch: %s",
                                   what, name, len(fallbacks), shown)


def warn_host_steps(name: str, gm: fx.GraphModule) -> None:
    """One WARNING per graph ``name`` whose compiled regions run kernels on the host with the
    NumPy references (``runtime/native.py`` logs each at DEBUG): which ops and why."""
    steps: dict[str, str] = {}
    for module in gm.modules():
        executable = getattr(module, "executable", None)
        for kernel, reason in getattr(executable, "fallbacks", None) or ():
            steps.setdefault(reason, kernel)
    if not steps:
        return
    key = f"{name}/host"
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    shown = "; ".join(f"{kernel}: {reason}" for reason, kernel in steps.items())
    get_logger("fallback").warning("host fallback in graph %s: kernels run with the NumPy "
                                   "references (one per reason): %s", name, shown)


def warn_whole_graph(name: str, reason: str) -> None:
    """One WARNING when a whole graph runs in torch."""
    with _warned_lock:
        if name in _warned:
            return
        _warned.add(name)
    get_logger("fallback").warning("torch fallback: graph %s runs entirely in torch: %s",
                                   name, reason)


@dataclass
class PartitionChoice:
    """What the forward/backward partition saved and recomputed: saved activations (computed
    by the forward, kept for the backward: the memory a step holds), inputs the backward reads
    (parameters, batch: no extra memory), and forward ops the backward recomputes instead of
    saving their results, with those results' bytes."""

    saved: list[str] = field(default_factory=list)
    saved_bytes: int = 0
    inputs: list[str] = field(default_factory=list)
    recomputed: list[str] = field(default_factory=list)
    recomputed_bytes: int = 0

    def __str__(self) -> str:
        return (f"saved activations: {len(self.saved)} values, {self.saved_bytes} bytes\n"
                f"  {', '.join(self.saved) or '-'}\n"
                f"inputs read by the backward: {', '.join(self.inputs) or '-'}\n"
                f"recomputed in the backward instead of saved: {len(self.recomputed)} ops, "
                f"{self.recomputed_bytes} bytes not saved\n"
                f"  {', '.join(self.recomputed) or '-'}")


def _tensor_bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        try:
            return int(val.numel()) * val.element_size()
        except Exception:  # symbolic sizes
            return 0
    return 0


def _describe_partition(fw: fx.GraphModule, bw: fx.GraphModule, num_fwd_outputs: int
                        ) -> PartitionChoice:
    """The saved values (forward outputs past the user's) and the backward's recomputed ops
    (compute nodes of the backward that the forward also has, by name: the partitioner copies
    them from the joint graph)."""
    choice = PartitionChoice()
    outs = fw.graph.output_node().args[0]
    for node in list(outs)[num_fwd_outputs:]:
        if not isinstance(node, fx.Node):
            continue
        if node.op == "placeholder":
            choice.inputs.append(node.name)
        else:
            choice.saved.append(node.name)
            choice.saved_bytes += _tensor_bytes(node)
    forward_ops = {n.name for n in fw.graph.nodes if n.op == "call_function"}
    for node in bw.graph.nodes:
        if node.op == "call_function" and node.name in forward_ops:
            choice.recomputed.append(node.name)
            choice.recomputed_bytes += _tensor_bytes(node)
    return choice


class TrainingGraph:
    """A Dynamo graph compiled for training. Calls go to AOTAutograd's function, whose
    forward and backward are :class:`SpecializedGraph`\\ s; ``forward`` and ``backward`` hold
    them (None until built), ``choice`` what the partition saved and recomputed."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], options: Any,
                 name: str):
        from torch._functorch.aot_autograd import aot_module_simplified

        from tilefuse.frontend.torch.aten_training import training_decompositions
        from tilefuse.frontend.torch.backend import _DECOMPOSITIONS

        self.name = name
        self.options = options
        self.forward: Any = None
        self.backward: Any = None
        self.choice: PartitionChoice | None = None
        self.arena_space = TRAINING_ARENA
        """The one arena the CPU executables of the forward and the backward share."""
        # the math attention (matmuls and a softmax), differentiated by autograd, rather than
        # the fused CPU flash kernel whose backward op tilefuse does not convert
        with sdpa_kernel([SDPBackend.MATH]):
            self._fn = aot_module_simplified(gm, list(example_inputs),
                                             fw_compiler=self._compiler("forward"),
                                             bw_compiler=self._compiler("backward"),
                                             partition_fn=self._partition,
                                             decompositions={**_DECOMPOSITIONS,
                                                             **training_decompositions()})

    def __call__(self, *args: Any) -> Any:
        return self._fn(*args)

    def _partition(self, joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
                   **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs,
                                                     num_fwd_outputs=num_fwd_outputs, **kwargs)
        self.choice = _describe_partition(fw, bw, num_fwd_outputs)
        get_logger("fallback").debug("%s partition: %s", self.name, self.choice)
        if self.options.dump is not None:
            from tilefuse.dump import DumpWriter
            DumpWriter(Path(self.options.dump) / self.name).write(
                "partition.txt", f"{self.choice}\n")
        return fw, bw

    def _compiler(self, half: str) -> Callable[..., Any]:
        def compile_half(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
            from torch._functorch.aot_autograd import make_boxed_func

            from tilefuse.frontend.torch.backend import SpecializedGraph

            options = self.options
            if options.dump is not None:
                options = dataclasses.replace(options, dump=Path(options.dump) / self.name / half)
            compiled = SpecializedGraph(gm, {}, options)
            setattr(self, half, compiled)
            space = self.arena_space

            def run(*args: Any) -> Any:
                with using(space):   # regions built on a first call place their arena there
                    outs = compiled(*args)
                for executable in _executables(compiled):
                    executable.forget_outputs()
                return outs
            return make_boxed_func(run)
        return compile_half


TRAINING_ARENA = ArenaSpace("training")
"""The arena every compiled training graph's CPU regions share: a step runs them one after
another (a model's forward, its loss's forward and backward, its backward), so it holds the
largest, not their sum (:mod:`~tilefuse.runtime.arena_space`)."""


def _executables(graph: Any) -> list[Any]:
    """The executables of a SpecializedGraph's compiled regions that can forget their
    outputs: a training step keeps no output buffer for the next call, so an output released
    early in the step (the logits, once the loss's backward read them) is freed then."""
    found = []
    for traced in getattr(graph, "traced", {}).values():
        for module in traced.modules():
            executable = getattr(module, "executable", None)
            if hasattr(executable, "forget_outputs"):
                found.append(executable)
    return found


@dataclass(frozen=True)
class StepMemory:
    """The memory a compiled training step holds on the CPU, in bytes: the arenas of the
    forward's and the backward's compiled regions (allocated once, held for the executable's
    life), the activations the forward saves for the backward, and the forward's and
    backward's outputs (loss, gradients, as torch tensors over NumPy buffers).

    The regions' arenas are placed in the graph's one :class:`ArenaSpace`, so the step holds
    only the largest of them (``shared``); an arena that did not fit there (``forward_arena``
    and ``backward_arena`` count those alone) is held besides. ``peak`` is the sum: an upper
    bound of the step's peak, since the saved activations are freed as the backward runs."""

    forward_arena: int
    backward_arena: int
    saved: int
    outputs: int
    shared: int = 0

    @property
    def arenas(self) -> int:
        """The arena bytes the step holds."""
        return self.shared + self.forward_arena + self.backward_arena

    @property
    def peak(self) -> int:
        return self.arenas + self.saved + self.outputs

    def __str__(self) -> str:
        mib = 2.0 ** 20
        own = "" if not self.forward_arena + self.backward_arena else \
            f" + own arenas {self.forward_arena / mib:.2f} (forward), " \
            f"{self.backward_arena / mib:.2f} (backward)"
        return (f"peak <= {self.peak / mib:.2f} MiB: shared arena {self.shared / mib:.2f}"
                f"{own}, saved activations {self.saved / mib:.2f}, outputs "
                f"{self.outputs / mib:.2f}")


def _arenas_and_outputs(graph: Any, space: ArenaSpace | None = None) -> tuple[int, int]:
    """(bytes of arenas outside ``space``, output bytes) of the compiled regions of a
    SpecializedGraph's latest signature."""
    traced = list(getattr(graph, "traced", {}).values())
    if not traced:
        return 0, 0
    arena = out = 0
    for module in traced[-1].modules():
        executable = getattr(module, "executable", None)
        plan = getattr(executable, "memory_plan", None)
        if plan is None:
            continue
        own = getattr(executable, "_arena", None)
        if space is None or own is None or not space.owns(own):
            arena += int(getattr(plan, "arena_bytes", 0))
        for v in executable.graph.outputs:
            out += int(np.prod(v.type.shape, dtype=np.int64)) * v.type.dtype.np.itemsize
    return arena, out


def step_memory(graph: Any) -> StepMemory | None:
    """The :class:`StepMemory` of a compiled training graph (a :class:`TrainingGraph`, or what
    ``tilefuse.torch.backend`` returned for one), None before its first backward."""
    graph = getattr(graph, "graph", graph)
    if not isinstance(graph, TrainingGraph) or graph.backward is None or graph.choice is None:
        return None
    space = graph.arena_space
    fa, fo = _arenas_and_outputs(graph.forward, space)
    ba, bo = _arenas_and_outputs(graph.backward, space)
    return StepMemory(fa, ba, graph.choice.saved_bytes, fo - graph.choice.saved_bytes + bo,
                      space.peak)


def device_bytes(graph: Any) -> int:
    """Bytes of device memory the cuda executables of a compiled training graph hold outside
    torch's allocator (their arenas, input buffers and constants: ``cuMemAlloc`` blocks that
    ``torch.cuda.max_memory_allocated`` does not see); 0 for a CPU graph."""
    graph = getattr(graph, "graph", graph)
    if not isinstance(graph, TrainingGraph):
        return 0
    total = 0
    seen: set[int] = set()
    for half in (graph.forward, graph.backward):
        for traced in getattr(half, "traced", {}).values():
            for module in traced.modules():
                executable = getattr(module, "executable", None)
                if getattr(executable, "device", "cpu") != "cuda":
                    continue
                buffers = [getattr(executable, "arena", None),
                           *getattr(executable, "_buffers", {}).values(),
                           *getattr(executable, "_constants", {}).values()]
                for buffer in buffers:
                    if buffer is None or getattr(buffer, "owner", None) is not None \
                            or id(buffer) in seen:
                        continue
                    seen.add(id(buffer))
                    total += int(getattr(buffer, "nbytes", 0))
    return total


def needs_training(example_inputs: Sequence[Any]) -> bool:
    """Whether Dynamo's graph must be differentiable: grad mode on and a tensor input that
    requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def compile_training(gm: fx.GraphModule, example_inputs: Sequence[Any], options: Any,
                     name: str) -> Callable[..., Any]:
    """The backend's training path (see the module docstring)."""
    return TrainingGraph(gm, example_inputs, options, name)


__all__ = ["TRAINING_ARENA", "PartitionChoice", "StepMemory", "TrainingGraph",
           "compile_training", "device_bytes", "needs_training", "step_memory",
           "warn_fallbacks", "warn_host_steps", "warn_whole_graph"]
