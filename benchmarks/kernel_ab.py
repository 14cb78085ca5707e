"""One schedule change against the default, kernel by kernel: every contraction kernel of a model
built twice (its default schedule, and the default with ``--prefetch`` pairs added or with its
threads over ``--parallel`` N or M), both checked against the reference, then timed alternately
in the tuner's conditions.

A default-rule change is worth making when it wins on the kernels it would touch. This builds
each kernel alone as the tuner does (``TuneTask.build``), runs every call after the runner's
``before_each_call`` work (a 16 MiB flush, the inputs written again, the thread pool woken: a
kernel as it finds the machine inside a model), and alternates the two builds call by call for
``--rounds`` rounds of ``--calls`` calls, so a slow spell of this shared host falls on both.

    .venv/bin/python benchmarks/kernel_ab.py resnet50 --prefetch B=8
    .venv/bin/python benchmarks/kernel_ab.py bert --prefetch B_next=0 --only k3,k9
    .venv/bin/python benchmarks/kernel_ab.py resnet50 --parallel n
    .venv/bin/python benchmarks/kernel_ab.py resnet50 --tile 8x48     # another register tile

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

from tilefuse.codegen.target import host_target
from tilefuse.kernel.fusion import KernelKind
from tilefuse.kernel.schedule import (
    Schedule,
    ScheduleError,
    as_cpu_target,
    default_schedule,
    validate,
)
from tilefuse.testing import assert_close
from tilefuse.tune.runner import as_in_a_model
from tilefuse.tune.task import named_tasks

FLUSH_FLOATS = 4 << 20   # 16 MiB, as the tuner's MeasureOptions.flush_bytes


def _variant(schedule: Schedule, pairs: dict[str, int], parallel: str | None,
             extents: dict[str, int | None], threads: int,
             tile: tuple[int, int] | None = None) -> Schedule:
    """The default with ``pairs`` merged into its prefetch (a distance of 0 removes one),
    given ``tile``, that MR x NR register tile (the M and N cache blocks rounded up to
    multiples of it within their extents, NR cut to N's vectors), and given ``parallel``, its
    threads over that axis, the axis's cache block cut to one share of register tiles per
    thread (or left where it is already smaller)."""
    prefetch = dict(schedule.prefetch) | pairs
    variant = dataclasses.replace(schedule,
                                  prefetch=tuple(p for p in prefetch.items() if p[1]))
    if tile is not None and schedule.micro_tile is not None:
        lanes = schedule.vector_width
        n = extents.get("n") or tile[1]
        mr = max(1, min(tile[0], extents.get("m") or tile[0]))
        nr = max(lanes, min(tile[1], n // lanes * lanes))
        unit = {"m": mr, "n": nr}
        tiles = tuple((a, min(-(-t // unit[a]) * unit[a], extents.get(a) or t)
                       if a in unit and t else t) for a, t in variant.tiles)
        variant = dataclasses.replace(variant, micro_tile=(mr, nr), tiles=tiles)
    if parallel is None or schedule.parallel_axes == (parallel,):
        return variant
    unit = schedule.micro_tile[0 if parallel == "m" else 1]
    share = -(-(extents[parallel] or 1) // threads // unit) * unit
    tiles = tuple((a, min(t, max(share, unit)) if a == parallel else t)
                  for a, t in schedule.tiles)
    return dataclasses.replace(variant, parallel_axes=(parallel,), tiles=tiles)


def _builds(model: str, pairs: dict[str, int], parallel: str | None,
            only: set[str] | None, tile: tuple[int, int] | None = None) -> list[dict]:
    graph, _, _ = _model(model, Path(tempfile.mkdtemp()))
    target, rng, rows = host_target(), np.random.default_rng(0), []
    for name, task in named_tasks(graph):
        if task.kind is not KernelKind.CONTRACTION or (only and name not in only):
            continue
        default = default_schedule(task.group, target)
        variant = _variant(default, pairs, parallel, task.extents(), as_cpu_target(target).cores,
                           tile)
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
        sources = [inputs[v] for v in task.graph.inputs]
        written = [pair for b in built.values() for pair in zip(b.arrays, sources)]
        rows.append({"name": name, "extents": task.extents(), "flops": task.work()[0],
                     **built, "written": written, "schedule": variant})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="bert, resnet50, or an .onnx file")
    parser.add_argument("--prefetch", default="",
                        help="pairs added to each default schedule's prefetch: B=8,B_next=1 "
                             "(0 removes one)")
    parser.add_argument("--parallel", choices=("n", "m"),
                        help="threads over this axis (where the default splits the other)")
    parser.add_argument("--tile", default=None, metavar="MRxNR",
                        help="the register tile of the variant (6x64, 8x48, 12x32, ...)")
    parser.add_argument("--only", help="comma-separated kernel names (kernels.plan's k3, ...)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=15)
    args = parser.parse_args(argv)
    pairs = {k: int(v) for k, v in (p.split("=") for p in args.prefetch.split(",") if p)}
    tile = tuple(int(v) for v in args.tile.lower().split("x")) if args.tile else None
    rows = _builds(args.model, pairs, args.parallel,
                   set(args.only.split(",")) if args.only else None, tile)
    scratch = np.empty(FLUSH_FLOATS, np.float32)
    times = {r["name"]: {"default": [], "variant": []} for r in rows}
    for round_ in range(args.rounds):
        for row in rows:
            order = ("default", "variant") if round_ % 2 == 0 else ("variant", "default")
            prepare = as_in_a_model(scratch, row["written"])
            for _ in range(args.calls):
                for label in order:
                    prepare()
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
