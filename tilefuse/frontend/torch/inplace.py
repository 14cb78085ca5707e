"""State updated in place by the compiled kernels themselves (compiled optimizer steps).

``functionalize`` turns an optimizer step's in-place updates (``mul_``, ``lerp_``,
``addcdiv_`` of parameters and of ``exp_avg``...) into pure ops whose results a tilefuse region
returns, then one ``aten.copy_(state, result)`` per updated tensor, run by torch: a second pass
over every byte of state, in torch, after the kernels. :func:`write_in_place` removes those
copies where it is safe: the region writes the result straight into the state tensor's memory
(:meth:`NativeExecutable.run_into` on the CPU; the output pointer on CUDA).

**When it is safe (CPU).** Writing output ``o`` into input ``x``'s memory while the kernels run
is correct when no kernel reads ``x`` after ``o``'s element is written. :func:`safe_aliases`
proves it from the kernel plan: the kernel ``K`` writing ``o`` is elementwise over exactly
``o``'s shape, which is ``x``'s, and reads ``x`` only in ops that are elementwise over that
domain (so at the element it writes, before writing it); every other kernel reading ``x`` runs
before ``K``; ``x`` is not returned as an output of its own; and ``x`` receives one output
only. The fused AdamW / SGD kernels (one elementwise kernel per parameter computing the new
parameter and moments) meet it. A pair that does not keeps torch's copy. On CUDA every pair
is safe: ``run_device`` copies its outputs out only after all kernels ran.

**When it is safe (graph).** The copy's destination is a placeholder read by nothing but the
region and the copy, of the output's shape and dtype, and the output is read by nothing but
the copy. At run time a destination that is not a contiguous tensor on the region's device is
written by a copy after the call (correct, just not in place).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import fx

from tilefuse.frontend.torch.backend import SpecializedGraph, direct_call
from tilefuse.frontend.torch.convert import DTYPE_TO_TORCH, numpy_to_tensor, tensor_to_numpy
from tilefuse.frontend.torch.partition import CompiledPartition
from tilefuse.kernel.fusion import KernelKind, KernelPlan
from tilefuse.log import get_logger
from tilefuse.ops.registry import OpKind

_COPY = torch.ops.aten.copy_.default


def safe_aliases(plan: KernelPlan, pairs: Mapping[int, int], single_launch: set[str]
                 ) -> dict[int, int]:
    """The pairs (graph output position -> graph input position) of ``pairs`` whose output can
    be written into the input's memory while the kernels of ``plan`` run (module docstring).
    ``single_launch``: the names of the kernels built as one launch (the analysis is per
    kernel, so a group split into several launches is not proven)."""
    graph = plan.graph
    groups = list(plan.groups)
    made_by = {v: i for i, g in enumerate(groups) for v in g.outputs}
    returned_inputs = {v for v in graph.outputs if v in set(graph.inputs)}
    targets = list(pairs.values())
    safe: dict[int, int] = {}
    for j, i in pairs.items():
        if targets.count(i) != 1 or not 0 <= j < len(graph.outputs) \
                or not 0 <= i < len(graph.inputs):
            continue
        out, x = graph.outputs[j], graph.inputs[i]
        if x in returned_inputs or out not in made_by or out.type != x.type \
                or not all(isinstance(d, int) for d in out.type.shape):
            continue
        k = made_by[out]
        kernel = groups[k]
        if kernel.kind is not KernelKind.ELEMENTWISE or kernel.name not in single_launch \
                or tuple(kernel.domain) != tuple(out.type.shape):
            continue
        if any(x in g.inputs for g in groups[k + 1:]):
            continue   # a later kernel reads the old value
        readers = [n for n in kernel.nodes if x in n.inputs]
        if all(n.op.kind is OpKind.ELEMENTWISE and len(n.outputs) == 1
               and tuple(n.outputs[0].type.shape) == tuple(kernel.domain) for n in readers):
            safe[j] = i
    return safe


class InPlacePartition(torch.nn.Module):
    """A :class:`CompiledPartition` whose outputs ``into`` (output position -> position of the
    argument receiving it) are written into those argument tensors. Returns what the region
    returns, with those outputs being the argument tensors themselves."""

    _is_impure = True   # it writes its arguments: dead-code elimination must keep the call

    def __init__(self, part: CompiledPartition, into: Mapping[int, int]):
        super().__init__()
        self.part = part
        self.into = dict(into)
        self.executable = part.executable   # what warn_host_steps and the dumps read

    def forward(self, *args: torch.Tensor) -> Any:
        part = self.part
        if getattr(self.executable, "device", "cpu") == "cuda":
            return self._forward_cuda(args)
        arrays = [tensor_to_numpy(args[i]) for i in part.runtime]
        into: dict[int, np.ndarray] = {}
        late: dict[int, torch.Tensor] = {}
        for j, a in self.into.items():
            dst = args[a]
            if dst.device.type == "cpu" and dst.is_contiguous() and not dst.is_conj():
                into[j] = tensor_to_numpy(dst)
            else:
                late[j] = dst
        outs: list[Any] = list(self.executable.run_into(arrays, into))
        for j in range(len(outs)):
            if j in into:
                outs[j] = args[self.into[j]]
            else:
                outs[j] = numpy_to_tensor(outs[j])
                if j in late:
                    with torch.no_grad():
                        late[j].copy_(outs[j])
                    outs[j] = late[j]
        return outs[0] if part.single else tuple(outs)

    def _forward_cuda(self, args: Sequence[torch.Tensor]) -> Any:
        part = self.part
        inputs = [args[i].detach().contiguous() for i in part.runtime]
        graph = self.executable.graph
        device = inputs[0].device if inputs else torch.device("cuda")
        outs: list[torch.Tensor] = []
        late: dict[int, torch.Tensor] = {}
        for j, v in enumerate(graph.outputs):
            dst = args[self.into[j]] if j in self.into else None
            if dst is not None and dst.device == device and dst.is_contiguous():
                outs.append(dst.detach())
            else:
                outs.append(torch.empty(tuple(v.shape), dtype=DTYPE_TO_TORCH[v.dtype],
                                        device=device))
                if dst is not None:
                    late[j] = dst
        stream = torch.cuda.current_stream(device).cuda_stream
        self.executable.run_device([t.data_ptr() for t in inputs],
                                   [o.data_ptr() for o in outs], stream)
        for j, dst in late.items():
            with torch.no_grad():
                dst.copy_(outs[j])
            outs[j] = dst
        return outs[0] if part.single else tuple(outs)


def _write_back(node: fx.Node) -> tuple[fx.Node, fx.Node, int] | None:
    """(the region's call, the destination placeholder, the output position) when ``node``
    is ``copy_(placeholder, output of a region)``."""
    if node.op != "call_function" or node.target is not _COPY or len(node.args) != 2 \
            or node.kwargs:
        return None
    dst, src = node.args
    if not isinstance(dst, fx.Node) or not isinstance(src, fx.Node) or dst.op != "placeholder":
        return None
    if src.op == "call_function" and src.target is operator.getitem:
        call, j = src.args
        if not isinstance(call, fx.Node) or not isinstance(j, int):
            return None
    else:
        call, j = src, 0
    if call.op != "call_module" or len(src.users) != 1:
        return None
    if set(dst.users) != {call, node} or call.args.count(dst) != 1:
        return None
    a, b = dst.meta.get("val"), src.meta.get("val")
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) \
            or a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return None
    return call, dst, j


def write_in_place(gm: fx.GraphModule) -> tuple[int, int]:
    """Rewrites a partitioned graph in place (module docstring): each proven ``copy_`` is
    removed and its region writes the destination itself. Returns (copies removed, copies
    kept)."""
    found: dict[fx.Node, dict[int, tuple[fx.Node, fx.Node]]] = {}
    copies = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is _COPY:
            copies += 1
        hit = _write_back(node)
        if hit is not None:
            call, dst, j = hit
            found.setdefault(call, {})[j] = (node, dst)
    removed = 0
    for call, writes in found.items():
        part = gm.get_submodule(str(call.target))
        if not isinstance(part, CompiledPartition):
            continue
        positions = {j: call.args.index(dst) for j, (_, dst) in writes.items()}
        runtime = {a: k for k, a in enumerate(part.runtime)}
        executable = part.executable
        if getattr(executable, "device", "cpu") == "cuda":
            # outputs are copied out after every kernel ran; an input also returned as it is
            # would be copied out after another output overwrote it
            graph = executable.graph
            returned = {k for k, v in enumerate(graph.inputs) if v in set(graph.outputs)}
            allowed = {j: a for j, a in positions.items()
                       if a in runtime and runtime[a] not in returned}
        else:
            plan = getattr(executable, "kernel_plan", None)
            if plan is None or not hasattr(executable, "run_into"):
                continue
            single = {s.name for s in executable.steps
                      if len(getattr(s, "launches", ())) == 1}
            pairs = {j: runtime[a] for j, a in positions.items() if a in runtime}
            proven = safe_aliases(plan, pairs, single)
            allowed = {j: positions[j] for j in proven}
        if not allowed:
            continue
        setattr(gm, str(call.target), InPlacePartition(part, allowed))
        for j in allowed:
            copy, dst = writes[j]
            copy.replace_all_uses_with(dst)
            gm.graph.erase_node(copy)
            removed += 1
    if removed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    get_logger("fallback").debug("write-backs: %d of %d copies written in place by the "
                                 "kernels", removed, copies)
    return removed, copies - removed


class StepGraph(SpecializedGraph):
    """An optimizer step's graph: compiled like any graph, then its write-backs removed where
    the kernels can write the state in place (:func:`~tilefuse.frontend.torch.inplace.
    write_in_place`); ``write_backs`` holds (removed, kept) per compiled signature."""

    def __init__(self, gm: fx.GraphModule, constants: Any, options: Any):
        super().__init__(gm, constants, options)
        self.write_backs: list[tuple[int, int]] = []

    def _compile(self, key: Any, args: Sequence[Any]) -> Any:
        super()._compile(key, args)
        with self._lock:
            traced = self.traced[key]
            if getattr(traced, "_tilefuse_in_place", False):
                return self._cache[key]
            counts = write_in_place(traced)
            traced._tilefuse_in_place = True
            self.write_backs.append(counts)
            if self._options.dump is not None:
                from tilefuse.dump import DumpWriter
                DumpWriter(self._options.dump / self._name / f"s{len(self._cache) - 1}").write(
                    "write_backs.txt", f"write-backs done in place by the kernels: {counts[0]}; "
                    f"copies left to torch: {counts[1]}\n{traced.graph}\n")
            self._cache[key] = direct_call(traced) or traced
            return self._cache[key]


__all__ = ["InPlacePartition", "StepGraph", "safe_aliases", "write_in_place"]
