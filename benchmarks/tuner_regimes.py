"""How the tuner's timing conditions compare with a kernel's time inside the model's call.

For each named kernel of a model's default build: its time in the model's own call (the launch
sequence run step by step, a timestamp around each step) and its time built alone as the tuner
builds it (``TuneTask.build``), each call after one of four preparations: a 16 MiB flush; the
flush and a thread-pool wake; the flush, its inputs written again and a wake (what
``tilefuse.tune.runner.before_each_call`` does); nothing (warm, back to back). Rounds alternate
all of them; medians in µs.

    .venv/bin/python benchmarks/tuner_regimes.py resnet50 k17,k31,k30,k3 --rounds 21
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tuned_ab import _model

from tilefuse.codegen.pool import thread_pool
from tilefuse.codegen.target import host_target
from tilefuse.kernel.schedule import default_schedule
from tilefuse.runtime.kernel_cache import KernelCache
from tilefuse.runtime.native import NativeExecutable
from tilefuse.runtime.profile import step_calls
from tilefuse.runtime.schedules import ScheduleSource
from tilefuse.tune.task import BuiltKernel, named_tasks

REGIMES = ("flush", "flush+wake", "flush+inputs+wake", "warm")


def _timed_alone(built: BuiltKernel, saved: list[np.ndarray], scratch: np.ndarray,
                 regime: str) -> float:
    if regime != "warm":
        scratch.fill(1.0)
    if regime == "flush+inputs+wake":
        for dst, src in zip(built.arrays, saved):
            np.copyto(dst, src)
    if regime != "flush" and regime != "warm":
        thread_pool().wake()
    start = time.perf_counter()
    built.run()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="bert, resnet50, or an .onnx file")
    parser.add_argument("kernels", help="comma-separated kernel names (kernels.plan's k3, ...)")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args(argv)
    graph, arrays, _ = _model(args.model, Path(tempfile.mkdtemp()))
    target = host_target()
    exe = NativeExecutable(graph, schedules=ScheduleSource(target, env={}),
                           cache=KernelCache(None, target))
    exe(*arrays)
    steps = step_calls(exe, arrays)
    tasks = dict(named_tasks(exe.graph))
    names = args.kernels.split(",")
    built, saved = {}, {}
    for name in names:
        task = tasks[name]
        inputs = task.random_inputs(np.random.default_rng(0))
        built[name] = task.build(default_schedule(task.group, target), inputs)
        saved[name] = [inputs[v] for v in task.graph.inputs]
    scratch = np.empty(4 << 20, np.float32)   # 16 MiB, as the tuner's MeasureOptions
    times: dict[str, dict[str, list[float]]] = {n: {r: [] for r in (*REGIMES, "model")}
                                                for n in names}
    for _ in range(args.rounds):
        for name, run in steps:
            start = time.perf_counter()
            run()
            if name in times:
                times[name]["model"].append(time.perf_counter() - start)
        for name in names:
            for regime in REGIMES:
                times[name][regime].append(_timed_alone(built[name], saved[name], scratch,
                                                        regime))
    print(f"{'kernel':8s}" + "".join(f"{r:>19s}" for r in (*REGIMES, "model")))
    for name in names:
        print(f"{name:8s}" + "".join(f"{statistics.median(v) * 1e6:19.0f}"
                                     for v in times[name].values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
