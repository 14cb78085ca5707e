"""Per-kernel time of a native executable, measured in place, and each kernel's compulsory work.

:func:`profile_steps` runs an executable's launch sequence step by step on the caller's inputs,
with the executable's own arena, constants and packed weights, so each kernel reads what it
reads in a real call (the whole-sequence launcher is bypassed: one Python→native call per step
instead of one per call, which adds about a microsecond per step). Every round runs every step
once in order (a batch of runs when one is shorter than ``min_sample``); the figure is the median
over rounds. The executable's normal call is timed the same way, so the sum of the steps can be
compared with it.

:func:`group_work` gives the least work a kernel group must do: FLOPs (2·M·N·K per matmul, an
attention's two products and softmax (:func:`~tilefuse.ops.attention.attention_flops`), each
other node's scalar ops per element, movement nodes none) and bytes (every group input read
once and every output written once), which is what a roofline bound is computed from.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.codegen.jit import aligned_empty
from tilefuse.graph.ir import Value
from tilefuse.kernel.fusion import KernelGroup, op_cost
from tilefuse.ops.attention import attention_flops
from tilefuse.ops.quant import INTEGER_PRODUCTS
from tilefuse.ops.registry import OpKind
from tilefuse.runtime.launch import HostStep, NativeStep
from tilefuse.runtime.native import NativeExecutable


@dataclass(frozen=True)
class StepTime:
    """One step of the launch sequence: its kernel group's name, median seconds, and the
    fallback reason when it runs on the host (``native`` False)."""

    name: str
    seconds: float
    native: bool
    reason: str = ""


@dataclass(frozen=True)
class Profile:
    """Each step's median time and the median time of a whole call."""

    steps: list[StepTime]
    call_seconds: float

    @property
    def step_seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


def _aligned(array: np.ndarray) -> np.ndarray:
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def _batched(fn: Callable[[], Any], min_sample: float) -> Callable[[], float]:
    """A sampler: seconds per run of ``fn``, repeating it to fill ``min_sample``."""
    start = time.perf_counter()
    fn()
    n = max(1, int(min_sample / max(time.perf_counter() - start, 1e-7)))

    def sample() -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n
    return sample


def step_calls(executable: NativeExecutable, arrays: Sequence[np.ndarray]
               ) -> list[tuple[str, Callable[[], Any]]]:
    """Each step of ``executable`` as a call of its own, by name, on the executable's arena
    and constants, with aligned copies of ``arrays`` as the inputs and fresh outputs (the
    inputs are not checked: give what the executable was built for). Calling them in order
    is one call of the executable without its launcher."""
    inputs = [_aligned(np.asarray(a)) for a in arrays]
    outputs = [aligned_empty(tuple(int(d) for d in v.shape), v.dtype.np)
               for v in executable.graph.outputs]
    table = [*inputs, *outputs]
    addresses = [a.ctypes.data for a in table]
    # every call holds ``table``: a native step sees only its addresses
    return [(step.name, (lambda s=step, t=table: s.run_addresses(addresses))
             if isinstance(step, NativeStep) else (lambda s=step, t=table: s.run(t)))
            for step in executable.steps]


def profile_steps(executable: NativeExecutable, arrays: Sequence[np.ndarray], *,
                  rounds: int = 5, min_sample: float = 1e-3,
                  on_round: Callable[[], None] | None = None) -> Profile:
    """Median seconds of each step of ``executable`` and of a whole call, on ``arrays``
    (checked as a call checks them)."""
    executable(*arrays)  # checks the inputs, warms every kernel
    inputs = [_aligned(np.asarray(a)) for a in arrays]
    runs = [run for _, run in step_calls(executable, inputs)]
    samplers = [_batched(run, min_sample) for run in runs]
    call = _batched(lambda: executable(*inputs), min_sample)
    samples: list[list[float]] = [[] for _ in runs]
    call_samples: list[float] = []
    for _ in range(max(1, rounds)):
        for i, sampler in enumerate(samplers):
            samples[i].append(sampler())
        call_samples.append(call())
        if on_round is not None:
            on_round()
    steps = [StepTime(step.name, statistics.median(s), isinstance(step, NativeStep),
                      step.reason if isinstance(step, HostStep) else "")
             for step, s in zip(executable.steps, samples)]
    return Profile(steps, statistics.median(call_samples))


def _numel(v: Value) -> int:
    return math.prod(int(d) for d in v.shape)


def group_work(group: KernelGroup) -> tuple[float, float]:
    """(FLOPs, bytes) ``group`` must do at least (module docstring)."""
    flops = 0.0
    for node in group.nodes:
        if node.op.name == "matmul" or node.op in INTEGER_PRODUCTS:
            k = int(node.inputs[0].shape[-1]) if node.inputs[0].type.rank else 1
            flops += 2.0 * _numel(node.outputs[0]) * k
        elif node.op.name == "attention":
            flops += attention_flops([v.shape for v in node.inputs])
        elif node.op.kind is not OpKind.MOVEMENT and op_cost(node):
            widest = max([_numel(v) for v in (*node.inputs, *node.outputs)], default=0)
            flops += op_cost(node) * widest
    moved = sum(_numel(v) * v.dtype.itemsize for v in (*group.inputs, *group.outputs))
    if len(group.nodes) == 1 and group.nodes[0].op.name in ("take", "take_along_axis"):
        # a gather reads the rows its indices name, not its whole table: no more elements
        # than it writes (a 30k-row embedding table read for 37 tokens is 37 rows)
        table, out = group.nodes[0].inputs[0], group.nodes[0].outputs[0]
        moved -= max(0, _numel(table) - _numel(out)) * table.dtype.itemsize
    return flops, float(moved)


__all__ = ["Profile", "StepTime", "group_work", "profile_steps", "step_calls"]
