"""``tilefuse tune MODEL``: search kernel schedules by measurement into the tuning database,
through :func:`tilefuse.tune.tune` (the same API as ``python -m tilefuse.tune``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tilefuse.cli.common import add_model_arguments, show_progress, subparser
from tilefuse.cli.models import CliError, load_model, parse_inputs, quiet_torch_warnings

EXAMPLE = """  tilefuse tune model.onnx --trials 200 --time-budget 300
  tilefuse tune model.onnx --trials 400 --ray auto        # on the Ray cluster of this machine
  tilefuse tune mypkg.layers:ffn --input x=512x768 --trials 50 --db /tmp/tune.sqlite
  TILEFUSE_TUNE_DB=/tmp/tune.sqlite tilefuse bench mypkg.layers:ffn --input x=512x768"""

DETAILS = """The trials go to the kernels by their share of the default time (hottest first; kernels
of the same computation are tuned once; those under 1%, and the cold ones after the hottest
90%, keep their default). Later builds use the tuned schedules: the default database is
tune.sqlite in the kernel cache directory, where builds look; another --db is used through
TILEFUSE_TUNE_DB. docs/TUNING.md says more."""


def add_parser(sub: Any) -> None:
    parser = subparser(sub, "tune", "search kernel schedules for MODEL by measurement",
                       EXAMPLE, DETAILS)
    add_model_arguments(parser)
    parser.add_argument("--trials", type=int, default=200, help="measurements in all (200)")
    parser.add_argument("--time-budget", type=float, default=600.0, metavar="SECONDS",
                        help="wall-clock limit, measuring included (600)")
    parser.add_argument("--db", type=Path, default=None,
                        help="the database (default $TILEFUSE_TUNE_DB, else tune.sqlite in "
                        "the kernel cache directory)")
    parser.add_argument("--margin", type=float, default=0.1,
                        help="stop a kernel within this share of its roofline bound (0.1)")
    parser.add_argument("--in-process", action="store_true",
                        help="measure in this process (faster to start, no isolation from a "
                        "crashing candidate)")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="measure on a Ray cluster: 'auto' (the one `ray start` runs on this "
                        "machine) or its address, host:port (needs ray: the tune extra; its "
                        "workers must import tilefuse)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tilefuse.tune.api import tune
    from tilefuse.tune.runner import InProcessRunner, LocalRunner, Runner

    quiet_torch_warnings()
    if args.ray is not None and args.in_process:
        raise CliError("--ray and --in-process exclude each other: candidates are measured "
                       "either on the Ray cluster or in this process")
    model = load_model(args.model, args.quantize)
    arrays = parse_inputs(model, args.input, args.seed)
    source = model.tune_source(arrays)
    runner: Runner
    if args.ray is not None:
        from tilefuse.tune.runner_ray import RayRunner

        runner = RayRunner(address=args.ray)
    else:
        runner = InProcessRunner() if args.in_process else LocalRunner()
    with runner:
        report = tune(source, *arrays, trials=args.trials, time_budget=args.time_budget,
                      db=args.db, runner=runner, progress=show_progress(args),
                      margin=args.margin)
    print(report)
    print(f"builds use it {'by default' if args.db is None else 'with'}"
          f"{'' if args.db is None else f' TILEFUSE_TUNE_DB={report.db}'}")
    return 0
