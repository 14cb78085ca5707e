"""``python -m tilefuse.tune``: tune a model's kernels into the tuning database, or report the
cost model's recall.

    python -m tilefuse.tune --demo --trials 200 --db /tmp/tune.sqlite
    python -m tilefuse.tune --demo bert --trials 200 --db /tmp/tune.sqlite
    python -m tilefuse.tune --recall --trials 120 --db /tmp/tune.sqlite
    python -m tilefuse.tune mypkg.model:forward --arg 512x768 --arg 768x3072:f32 --trials 100

``--demo`` (or ``--demo w1``) tunes W1 (``gelu(x @ w + b)``, 512×768×3072, the weight and bias
constant); ``--demo bert`` the BERT-base encoder layer of :mod:`tilefuse.zoo` (batch 1, 128
tokens) through the torch path. The report gives the wall time for the trials, each kernel's
default and tuned time, speed-up and percent of its roofline bound, the total, and the cost
model's top-5 recall on held-out folds of each tuned kernel's measurements.

``--recall`` reports LightGBM's top-5 recall on held-out W1 candidates: the W1 measurements
already in ``--db`` (from a ``--demo`` run), topped up with random candidates to ``--trials``.

``module:function`` is imported and traced on random arrays of the ``--arg`` shapes (one per
positional argument, ``AxBxC[:dtype]``, f32 by default). The report goes to stdout, the
progress to stderr. Then ``TILEFUSE_TUNE_DB=<db>`` makes builds use the tuned schedules.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.tune.api import TuneReport, open_database, tune
from tilefuse.tune.runner import InProcessRunner, LocalRunner, Runner
from tilefuse.tune.task import TuneError, tasks_from_graph
from tilefuse.tune.tuner import held_out_recall, w1_graph


def parse_arg_spec(spec: str, rng: np.random.Generator) -> np.ndarray:
    """A random array for ``512x768`` or ``512x768:f16`` (``scalar`` shape: ``:f32`` alone)."""
    dims, _, dtype = spec.partition(":")
    try:
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
        np_dtype = np.dtype({"f32": "float32", "f64": "float64", "f16": "float16",
                             "i32": "int32", "i64": "int64"}.get(dtype or "f32", dtype))
    except (ValueError, TypeError):
        raise TuneError(f"bad --arg {spec!r}: expected AxBxC[:dtype], e.g. 512x768:f32") from None
    if np_dtype.kind in "iu":
        return rng.integers(0, 8, shape).astype(np_dtype)
    return rng.standard_normal(shape).astype(np_dtype)


def load_function(target: str) -> Any:
    """``module:function`` imported."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise TuneError(f"expected module:function, got {target!r}")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise TuneError(f"cannot load {target}: {err}") from None


def print_recall(report: TuneReport) -> None:
    """The cost model's top-5 recall on held-out folds of each tuned kernel's measurements."""
    for k in report.kernels:
        if k.result is None:
            continue
        r = held_out_recall(k.result, 5)
        shown = "n/a (too few measurements)" if r is None else f"{r:.2f}"
        print(f"{k.name}: LightGBM top-5 recall on held-out folds of its "
              f"{len(k.result.history.seconds)} measurements: {shown}")


def demo_source(name: str) -> tuple[Any, list[Any]]:
    """The model and inputs of ``--demo NAME`` (w1 or bert)."""
    if name == "w1":
        return w1_graph(), []
    if name == "bert":
        from tilefuse.zoo import bert_inputs, bert_layer

        return bert_layer().eval(), bert_inputs()
    raise TuneError(f"unknown demo {name!r}: w1 or bert")


def run_recall(args: argparse.Namespace) -> None:
    """``--recall``: W1's held-out recall from ``--db`` topped up to ``--trials``."""
    from tilefuse.tune.recall import recall_report, top_up

    [task] = tasks_from_graph(w1_graph())
    db = open_database(args.db)
    runner = InProcessRunner() if args.in_process else LocalRunner()
    with runner:
        measured = top_up(task, db, runner, args.trials,
                          on_measured=lambda n: print(f"\r{n} candidates measured", end="",
                                                      file=sys.stderr, flush=True))
    print(file=sys.stderr)
    print(f"W1 512x768x3072 + bias + gelu, database {db.path}")
    print(recall_report(task, measured))
    print("(timings on a shared, busy machine are noisy: the measured order near the best is "
          "partly noise)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefuse.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("function", nargs="?", help="module:function to trace and tune")
    parser.add_argument("--demo", nargs="?", const="w1", default=None, metavar="w1|bert",
                        help="tune a demo model (default w1: 512x768x3072 matmul + gelu)")
    parser.add_argument("--recall", action="store_true",
                        help="report the cost model's top-5 recall on held-out W1 candidates")
    parser.add_argument("--arg", action="append", default=[], metavar="AxB[:dtype]",
                        help="shape of one positional argument (repeat, in order)")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--time-budget", type=float, default=600.0, metavar="SECONDS")
    parser.add_argument("--db", type=Path, default=None,
                        help="database (default $TILEFUSE_TUNE_DB, ~/.cache/tilefuse/tune.sqlite)")
    parser.add_argument("--margin", type=float, default=0.1,
                        help="stop a kernel within this share of its roofline bound (0.1)")
    parser.add_argument("--in-process", action="store_true",
                        help="measure in this process (no isolation from crashing candidates)")
    args = parser.parse_args(argv)
    if sum((args.demo is not None, bool(args.function), args.recall)) != 1:
        parser.error("give one of --demo, --recall or module:function")
    try:
        if args.recall:
            run_recall(args)
            return 0
        rng = np.random.default_rng(0)
        if args.demo is not None:
            source, inputs = demo_source(args.demo)
        else:
            source = load_function(args.function)
            inputs = [parse_arg_spec(s, rng) for s in args.arg]
        runner: Runner = InProcessRunner() if args.in_process else LocalRunner()
        with runner:
            report = tune(source, *inputs, trials=args.trials, time_budget=args.time_budget,
                          db=args.db, runner=runner, progress=True, margin=args.margin)
    except TuneError as err:
        parser.exit(2, f"error: {err}\n")
    print(report)
    print_recall(report)
    print(f"use it: TILEFUSE_TUNE_DB={report.db}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
