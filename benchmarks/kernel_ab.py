"""One schedule change against the default, kernel by kernel: every contraction kernel of a model
built twice (its default schedule, and the default with ``--prefetch`` pairs added), both
checked against the reference, then timed alternately in the tuner's conditions.

A default-rule change is worth making when it wins on the kernels it would touch. This builds
each kernel alone as the tuner does (``TuneTask.build``), runs every call after the runner's
``before_each_call`` work (a 16 MiB flush, the inputs written again, the thread pool woken: a
kernel as it finds the machine inside a model), and alternates the two builds call by call for
``--rounds`` rounds of ``--calls`` calls, so a slow spell of this shared host falls on both.

    .venv/bin/python benchmarks/kernel_ab.py resnet50 --prefetch C_next=1
    .venv/bin/python benchmarks/kernel_ab.py bert --prefetch C_next=1 --only k3,k9

Columns: each build's median time, their ratio (default / variant: above 1 the variant is
faster), and the variant's GFLOP/s.
"""

from __future__ import annotations

import os

from tilefuse.codegen.target import SPIN_COUNT

os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))  # before any OpenMP runtime loads

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tuned_ab import _model

from tilefuse.codegen.pool import thread_pool
from tilefuse.codegen.target import host_target
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.schedule import Schedule, ScheduleError, default_schedule, validate
from tilefuse.testing import assert_close
from tilefuse.tune.task import named_tasks

FLUSH_FLOATS = 4 << 20   # 16 MiB, as the tuner's MeasureOptions.flush_bytes


def _variant(schedule: Schedule, pairs: dict[str, int]) -> Schedule:
    prefetch = dict(schedule.prefetch) | pairs
    return dataclasses.replace(schedule, prefetch=tuple(p for p in prefetch.items() if p[1]))


def _builds(model: str, pairs: dict[str, int], only: set[str] | None) -> list[dict]:
    graph, _, _ = _model(model, Path(tempfile.mkdtemp()))
    target, rng, rows = host_target(), np.random.default_rng(0), []
    for name, task in named_tasks(graph):
        if task.kind is not KernelKind.CONTRACTION or (only and name not in only):
            continue
        default = default_schedule(task.group, target)
        variant = _variant(default, pairs)
        if variant == default:
            continue
        try:
            validate(variant, task.extents())
        except ScheduleError as e:
            print(f"{name}: the variant does not fit ({e}); skipped", file=sys.stderr)
            continue
        inputs = task.random_inputs(rng)
        expected = task.reference(inputs)
        built = {}
        for label, schedule in (("default", default), ("variant", variant)):
            build = task.build(schedule, inputs)
            build.run()
            for got, want in zip(build.outputs, expected):
                assert_close(got, want, reduction=True, msg=f"{name} {label}")
            built[label] = build
        written = list(zip(built["default"].arrays, [inputs[v] for v in task.graph.inputs]))
        written += list(zip(built["variant"].arrays, [inputs[v] for v in task.graph.inputs]))
        rows.append({"name": name, "extents": task.extents(), "flops": task.work()[0],
                     "default": built["default"], "variant": built["variant"],
                     "written": written, "schedule": variant})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="bert, resnet50, or an .onnx file")
    parser.add_argument("--prefetch", required=True,
                        help="pairs added to each default schedule's prefetch: C_next=1,B=8 "
                             "(0 removes one)")
    parser.add_argument("--only", help="comma-separated kernel names (kernels.plan's k3, ...)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args(argv)
    pairs = {k: int(v) for k, v in (p.split("=") for p in args.prefetch.split(","))}
    rows = _builds(args.model, pairs, set(args.only.split(",")) if args.only else None)
    scratch, pool = np.empty(FLUSH_FLOATS, np.float32), thread_pool()
    times = {r["name"]: {"default": [], "variant": []} for r in rows}
    for round_ in range(args.rounds):
        for row in rows:
            order = ("default", "variant") if round_ % 2 == 0 else ("variant", "default")
            for _ in range(args.calls):
                for label in order:
                    scratch.fill(1.0)
                    for dst, src in row["written"]:
                        np.copyto(dst, src)
                    pool.wake()
                    start = time.perf_counter()
                    row[label].run()
                    times[row["name"]][label].append(time.perf_counter() - start)
    ratios = []
    print(f"{'kernel':7s} {'M x N x K':>16s} {'default':>9s} {'variant':>9s} {'ratio':>6s} "
          f"{'GF/s':>5s}  variant schedule")
    for row in rows:
        med = {k: statistics.median(v) for k, v in times[row["name"]].items()}
        ratio = med["default"] / med["variant"]
        ratios.append(ratio)
        e = row["extents"]
        shape = "x".join(str(e.get(a)) for a in "mnk")
        print(f"{row['name']:7s} {shape:>16s} {med['default'] * 1e6:8.0f}u "
              f"{med['variant'] * 1e6:8.0f}u {ratio:5.3f}x "
              f"{row['flops'] / med['variant'] / 1e9:5.0f}  {row['schedule']}")
    if ratios:
        print(f"median ratio {statistics.median(ratios):.3f}x over {len(ratios)} kernels "
              f"(geometric mean {float(np.exp(np.mean(np.log(ratios)))):.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
