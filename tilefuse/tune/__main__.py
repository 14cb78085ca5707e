"""``python -m tilefuse.tune``: tune a function's kernels into the tuning database.

    python -m tilefuse.tune --demo --trials 200 --db /tmp/tune.sqlite
    python -m tilefuse.tune mypkg.model:forward --arg 512x768 --arg 768x3072:f32 --trials 100

``--demo`` tunes W1 (``gelu(x @ w + b)``, 512×768×3072, the weight and bias constant).
``module:function`` is imported and traced on random arrays of the ``--arg`` shapes (one per
positional argument, ``AxBxC[:dtype]``, f32 by default). The report table goes to stdout, the
progress to stderr. Then ``TILEFUSE_TUNE_DB=<db>`` makes builds use the tuned schedules.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tilefuse.tune.api import TuneReport, tune
from tilefuse.tune.runner import InProcessRunner, LocalRunner, Runner
from tilefuse.tune.task import TuneError
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
    """The cost model's top-k recall on each tuned kernel's later measurements."""
    for k in report.kernels:
        if k.result is None:
            continue
        parts = []
        for top in (3, 5):
            r = held_out_recall(k.result, top)
            parts.append(f"top-{top} {'n/a' if r is None else f'{r:.2f}'}")
        print(f"{k.name}: LightGBM recall on held-out measurements: {', '.join(parts)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilefuse.tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("function", nargs="?", help="module:function to trace and tune")
    parser.add_argument("--demo", action="store_true", help="tune W1 (512x768x3072 + gelu)")
    parser.add_argument("--arg", action="append", default=[], metavar="AxB[:dtype]",
                        help="shape of one positional argument (repeat, in order)")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--time-budget", type=float, default=600.0, metavar="SECONDS")
    parser.add_argument("--db", type=Path, default=None,
                        help="database (default $TILEFUSE_TUNE_DB, ~/.cache/tilefuse/tune.sqlite)")
    parser.add_argument("--margin", type=float, default=None,
                        help="stop a kernel within this share of its roofline bound (default: "
                        "never; the bound's peak is NumPy's sgemm, which can be beaten)")
    parser.add_argument("--in-process", action="store_true",
                        help="measure in this process (no isolation from crashing candidates)")
    parser.add_argument("--recall", action="store_true",
                        help="print the cost model's top-k recall on held-out measurements")
    args = parser.parse_args(argv)
    if args.demo == bool(args.function):
        parser.error("give either --demo or module:function")
    rng = np.random.default_rng(0)
    try:
        if args.demo:
            source: Any = w1_graph()
            inputs: list[np.ndarray] = []
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
    if args.recall or args.demo:
        print_recall(report)
    print(f"use it: TILEFUSE_TUNE_DB={report.db}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
