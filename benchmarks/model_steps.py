"""Where a whole model's time goes, per step and per kind of step, robust to a busy machine.

    python benchmarks/model_steps.py resnet50 --rounds 15
    python benchmarks/model_steps.py densenet121 bert --top 15

``tilefuse explain`` times each step by its median; on a shared 2-core host a parallel kernel
whose worker thread is preempted takes a whole scheduler slice (10x its time), often enough to
move a median. Here each step's time is its **minimum** over rounds (the time it takes when it
gets its cores), set against the roofline bound of :class:`tilefuse.tune.roofline.Peaks`, and
the steps are summed per kind: convolutions and matmuls (contractions) against the compute
roof, and the rest (movement: layout changes, concats, pads; pooling and other reductions; row
kernels) against the bandwidth of the cache level their bytes fit in. Models come from
``onnx_light.py`` (random weights): the light set by short name and ``bert``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from onnx_light import light_models, load_case

from tilefuse.cli.timing import format_seconds


def profile(name: str, rounds: int, top: int, gflops: float | None) -> None:
    import tilefuse.onnx
    from tilefuse.codegen.target import host_target
    from tilefuse.driver import plan_kernels
    from tilefuse.runtime.profile import group_work, step_calls
    from tilefuse.tune.api import open_database
    from tilefuse.tune.roofline import MeasuredRoofline, Peaks
    from tilefuse.tune.tuner import target_string

    proto, arrays = load_case(name, light_models().get(name), 0)
    model = tilefuse.onnx.load(proto)
    lowered = model.lower(*arrays)
    executable = lowered.executable
    plan = executable.kernel_plan or plan_kernels(lowered.optimized)
    groups = {g.name: g for g in plan.groups}
    db = open_database(None)
    try:
        peaks: Peaks = MeasuredRoofline(db, target_string(host_target())).peaks
    finally:
        db.close()
    if gflops:
        peaks = Peaks(gflops * 1e9, peaks.bytes, peaks.levels)
    calls = step_calls(executable, arrays)
    best = [float("inf")] * len(calls)
    whole = float("inf")
    feed = dict(zip(model.input_names, arrays))
    for _ in range(rounds):
        for i, (_, run) in enumerate(calls):
            start = time.perf_counter()
            run()
            best[i] = min(best[i], time.perf_counter() - start)
        start = time.perf_counter()
        model.run(None, feed)
        whole = min(whole, time.perf_counter() - start)
    rows = []
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for (step, _), seconds in zip(calls, best):
        group = groups[step]
        flops, nbytes = group_work(group)
        bound = max(flops / peaks.flops, nbytes / peaks.level_for(nbytes).bandwidth)
        ops = "+".join(n.op.name for n in group.nodes)
        kind = group.kind.value
        rows.append((seconds - bound, step, kind, flops, nbytes, seconds, bound, ops))
        entry = by_kind[kind]
        entry[0] += seconds
        entry[1] += bound
        entry[2] += 1
    total = sum(best)
    print(f"== {name}: {len(rows)} steps, sum of step minima {format_seconds(total)}, "
          f"whole call (min) {format_seconds(whole)}; peaks {peaks.flops / 1e9:.0f} GFLOP/s")
    for kind, (seconds, bound, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"  {kind:<14} {count:>4} steps {format_seconds(seconds):>9} "
              f"({100 * seconds / total:4.1f} %), bound {format_seconds(bound):>9} "
              f"({100 * bound / seconds:4.1f} % of bound)")
    fast = [r for r in rows if r[5] < 0.8 * r[6]]
    if fast:
        shown = ", ".join(f"{r[1]} {format_seconds(r[5])} vs {format_seconds(r[6])}"
                          for r in fast[:8])
        print(f"  {len(fast)} steps under 80 % of their bound (the roof is low): {shown}")
    print(f"  worst {top} by time over bound:")
    for _lost, step, kind, flops, nbytes, seconds, bound, ops in sorted(rows, reverse=True)[:top]:
        print(f"  {step:<6} {kind:<12} {flops / 1e6:8.1f} MFLOP {nbytes / 1e6:7.2f} MB "
              f"{format_seconds(seconds):>9} bound {format_seconds(bound):>9} "
              f"({100 * bound / seconds:5.1f} %)  {ops[:70]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--peak-gflops", type=float, default=None)
    args = parser.parse_args(argv)
    for name in args.models:
        profile(name, args.rounds, args.top, args.peak_gflops)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
