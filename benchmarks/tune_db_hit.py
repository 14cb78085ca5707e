"""What a tuning-database hit adds to a build (issue 6: ≤ 10 ms): W1 built again and again in
one process, alternately without a database and with one that holds W1's tuned schedule, the
kernels' machine code coming from the warm disk cache both times; medians.

    .venv/bin/python -m tilefuse.tune --demo --trials 50 --db /tmp/w1.sqlite   # make a hit
    .venv/bin/python benchmarks/tune_db_hit.py /tmp/w1.sqlite
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tilefuse.codegen.target import host_target
from tilefuse.runtime.native import NativeExecutable
from tilefuse.runtime.schedules import ScheduleSource
from tilefuse.tune.tuner import w1_graph


def build_seconds(graph: object, env: dict[str, str]) -> tuple[float, ScheduleSource]:
    start = time.perf_counter()
    source = ScheduleSource(host_target(), env=env)
    NativeExecutable(graph, schedules=source)
    return time.perf_counter() - start, source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", help="a tuning database holding W1's schedule")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    graph = w1_graph()
    with_db = {"TILEFUSE_TUNE_DB": args.db}
    for env in ({}, with_db):
        build_seconds(graph, env)  # both schedules' code into the disk cache
    times: dict[str, list[float]] = {"none": [], "hit": []}
    for _ in range(args.rounds):
        times["none"].append(build_seconds(graph, {})[0])
        seconds, source = build_seconds(graph, with_db)
        times["hit"].append(seconds)
    if not source.tuned:
        print(f"{args.db} holds no schedule for W1's kernel", file=sys.stderr)
        return 1
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"build without a database {med['none']:.1f} ms, with a hit {med['hit']:.1f} ms: "
          f"the hit adds {med['hit'] - med['none']:+.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
