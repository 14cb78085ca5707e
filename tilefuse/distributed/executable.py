"""Running sharded programs: one rank per process through a communicator, or every rank in one
process (the simulation that tests, dumps and the CLI use without several devices).

:class:`DistributedExecutable` is what the compile driver returns for ``devices=N``: this
rank's :class:`~tilefuse.distributed.program.Program`, its segments compiled for the target,
and a communicator (:mod:`tilefuse.distributed.comm`). A call runs the steps in order, starting
each collective asynchronously and waiting for it only where a segment reads its result.
:class:`SimulatedCluster` runs the N programs of one plan side by side, step by step, and
computes each collective from all ranks' arrays: the oracle that the per-process runs match.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tilefuse.distributed.program import Collective, Program, Segment
from tilefuse.distributed.shard import ShardPlan
from tilefuse.errors import GuardError
from tilefuse.graph.interpreter import run_node
from tilefuse.graph.ir import Graph, Value


class DistributedExecutable:
    """This rank's part of a sharded graph: ``executable(*arrays)`` takes the full (replicated)
    inputs and returns the full outputs, the same on every rank."""

    def __init__(self, graph: Graph, program: Program, plan: ShardPlan, comm: Any,
                 device: str = "cpu"):
        self.graph = graph              # the graph before sharding (the user's signature)
        self.program, self.plan, self.comm = program, plan, comm
        self._device = device

    def __repr__(self) -> str:
        return (f"DistributedExecutable(@{self.graph.name}, rank {self.comm.rank} of "
                f"{self.comm.world}, {len(self.program.segments)} segments)")

    @property
    def device(self) -> str:
        """"cuda" when the segments run on the GPU (then :meth:`run_torch` is the call)."""
        return self._device

    def run_trusted(self, arrays: Sequence[Any]) -> list[Any]:
        return self(*arrays)

    def run_torch(self, tensors: Sequence[Any]) -> list[Any]:
        """One call on torch CUDA tensors (the torch backend's path on the cuda target):
        each segment writes fresh tensors through ``run_device`` on torch's current stream,
        and the collectives take the tensors in place (NCCL, or gloo's CUDA path)."""
        import torch

        from tilefuse.distributed.comm import torch_dtype

        device = tensors[0].device if tensors else torch.device("cuda")

        def run_segment(seg: Segment, env: dict[Value, Any]) -> None:
            if not seg.outputs:
                return
            ins = [env[v].contiguous() for v in seg.inputs]
            outs = [torch.empty(tuple(v.type.shape), dtype=torch_dtype(v.type.dtype),
                                device=device) for v in seg.outputs]
            stream = torch.cuda.current_stream(device).cuda_stream
            seg.executable.run_device([t.data_ptr() for t in ins],  # type: ignore[attr-defined]
                                      [t.data_ptr() for t in outs], stream)
            env.update(zip(seg.outputs, outs))

        env = self._run_steps(tensors, run_segment)
        return [env[v] for v in self.program.graph.outputs]

    def __call__(self, *arrays: Any) -> list[Any]:
        if len(arrays) != len(self.graph.inputs):
            raise GuardError(f"graph @{self.graph.name} takes {len(self.graph.inputs)} "
                             f"inputs, got {len(arrays)}")
        env = self._run_steps(arrays, _run_segment)
        return [_value(v, env, self.program) for v in self.program.graph.outputs]

    def _run_steps(self, arrays: Sequence[Any],
                   run_segment: Callable[[Segment, dict[Value, Any]], None]) -> dict[Value, Any]:
        """The step loop shared by both calls: start each collective as soon as its input
        exists, wait for it only before the first segment that reads it (or at the end)."""
        env: dict[Value, Any] = dict(zip(self.program.graph.inputs, arrays))
        pending: dict[int, tuple[Any, Value]] = {}
        for step in self.program.steps:
            if isinstance(step, Collective):
                pending[step.index] = (self._start(step, env[step.node.inputs[0]]),
                                       step.node.outputs[0])
                continue
            for c in step.waits:
                handle, out = pending.pop(c)
                env[out] = handle.wait()
            run_segment(step, env)
        for _, (handle, out) in sorted(pending.items()):
            env[out] = handle.wait()
        return env

    def _start(self, step: Collective, x: Any) -> Any:
        node = step.node
        if node.op.name == "all_reduce":
            return self.comm.all_reduce(x)
        return self.comm.all_gather(x, node.attrs["axis"])


def _run_segment(seg: Segment, env: dict[Value, Any]) -> None:
    if not seg.outputs:
        return
    outs = seg.executable(*[env[v] for v in seg.inputs])  # type: ignore[operator]
    env.update(zip(seg.outputs, outs))


def _value(v: Value, env: dict[Value, Any], program: Program) -> Any:
    """An output from the environment; a source node's output (a constant returned as it
    is) is computed here."""
    if v not in env:
        for node in program.graph.nodes:
            if v in node.outputs and not node.inputs:
                env.update(zip(node.outputs, run_node(node, [], {})))
    out = env[v]
    return out.copy() if isinstance(out, np.ndarray) and not out.flags.writeable else out


class SimulatedCluster:
    """All ranks of one plan in this process, run in lock step: ``cluster(*arrays)`` gives each
    rank's outputs (``outputs[rank][i]``)."""

    def __init__(self, graph: Graph, programs: Sequence[Program], plan: ShardPlan):
        self.graph, self.programs, self.plan = graph, list(programs), plan

    @property
    def world(self) -> int:
        return len(self.programs)

    def __call__(self, *arrays: Any) -> list[list[Any]]:
        envs = [dict(zip(p.graph.inputs, arrays)) for p in self.programs]
        for i, step in enumerate(self.programs[0].steps):
            steps = [p.steps[i] for p in self.programs]
            if isinstance(step, Collective):
                xs = [env[s.node.inputs[0]] for env, s in zip(envs, steps)]
                if step.node.op.name == "all_reduce":
                    total = _sum(xs)
                    results = [total.copy() for _ in xs]
                else:
                    cat = np.concatenate(xs, axis=step.node.attrs["axis"])
                    results = [cat.copy() for _ in xs]
                for env, s, r in zip(envs, steps, results):
                    env[s.node.outputs[0]] = r
            else:
                for env, s in zip(envs, steps):
                    _run_segment(s, env)  # type: ignore[arg-type]
        return [[_value(v, env, p) for v in p.graph.outputs]
                for env, p in zip(envs, self.programs)]


def _sum(xs: Sequence[np.ndarray]) -> np.ndarray:
    """The sum in rank order, accumulated in the arrays' dtype (as a ring all-reduce does)."""
    total = np.array(xs[0], copy=True)
    for x in xs[1:]:
        total = (total + x).astype(total.dtype, copy=False)
    return total
