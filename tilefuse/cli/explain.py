"""``tilefuse explain MODEL``: per kernel, the work it must do, the time it takes, and how close
that is to the machine's roofline bound.

For each step of the compiled launch sequence: FLOPs and compulsory bytes
(:func:`tilefuse.runtime.profile.group_work`), measured median time
(:func:`tilefuse.runtime.profile.profile_steps`, in place in the real executable), the roofline
bound ``max(FLOPs / peak FLOP/s, bytes / bytes/s of the cache level the bytes fit in, DRAM past
L3)``, which bounds it (compute, or L1/L2/L3/DRAM), and the
percent of the bound reached (100% = at the roofline). The peaks are the tuner's
(:class:`tilefuse.tune.roofline.MeasuredRoofline`: NumPy's sgemm and a large copy, measured once
and kept in the tuning database) unless ``--peak-gflops``/``--peak-gbps`` give them.
``--plot`` draws the roofline chart (matplotlib).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tilefuse.cli.common import add_model_arguments, note, show_progress, subparser
from tilefuse.cli.models import CliError, load_model, parse_inputs, quiet_torch_warnings
from tilefuse.cli.progress import Bar
from tilefuse.cli.timing import format_seconds
from tilefuse.log import get_logger
from tilefuse.tune.roofline import Peaks

EXAMPLE = """  tilefuse explain model.onnx
  tilefuse explain mypkg.layers:ffn --input x=512x768 --plot roofline.png --json explain.json
  tilefuse explain model.onnx --peak-gflops 330 --peak-gbps 30   # known peaks, none measured"""


def add_parser(sub: Any) -> None:
    parser = subparser(sub, "explain", "per kernel: FLOPs, bytes, time, roofline bound",
                       EXAMPLE, __doc__.split("\n\n")[1])
    add_model_arguments(parser)
    parser.add_argument("--rounds", type=int, default=7, help="timing rounds (median; 7)")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG",
                        help="draw the roofline chart with every kernel on it")
    parser.add_argument("--json", type=Path, default=None, help="write the table as JSON")
    parser.add_argument("--peak-gflops", type=float, default=None,
                        help="the FLOP/s peak in GFLOP/s (default: measured once, stored)")
    parser.add_argument("--peak-gbps", type=float, default=None,
                        help="the memory peak in GB/s, read + write (default: measured)")
    parser.add_argument("--db", type=Path, default=None,
                        help="tuning database holding the measured peaks (default as tune)")
    parser.set_defaults(func=run)


@dataclass(frozen=True)
class KernelRow:
    name: str
    kind: str
    ops: str
    flops: float
    bytes: float
    seconds: float
    bound_seconds: float
    bound_by: str
    native: bool
    note: str = ""

    @property
    def percent_of_bound(self) -> float:
        return 100.0 * self.bound_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0


def peaks_for(args: argparse.Namespace) -> Peaks:
    """The given peaks, else the tuning database's (measured there the first time)."""
    given = (args.peak_gflops, args.peak_gbps)
    if all(p is not None for p in given):
        if min(given) <= 0:
            raise CliError("--peak-gflops and --peak-gbps must be positive")
        return Peaks(args.peak_gflops * 1e9, args.peak_gbps * 1e9)
    if any(p is not None for p in given):
        raise CliError("give both --peak-gflops and --peak-gbps, or neither")
    from tilefuse.codegen.target import host_target
    from tilefuse.tune.api import open_database
    from tilefuse.tune.roofline import MeasuredRoofline
    from tilefuse.tune.tuner import target_string

    db = open_database(args.db)
    try:
        return MeasuredRoofline(db, target_string(host_target())).peaks
    finally:
        db.close()


def kernel_rows(lowered: Any, arrays: list[Any], peaks: Peaks, rounds: int,
                progress: bool | None) -> tuple[list[KernelRow], float]:
    """One row per step of the launch sequence, and a whole call's median seconds."""
    from tilefuse.driver import plan_kernels
    from tilefuse.runtime.native import NativeExecutable
    from tilefuse.runtime.profile import group_work, profile_steps

    executable = lowered.executable
    if not isinstance(executable, NativeExecutable):
        raise CliError(f"explain needs the native CPU executable, got {type(executable).__name__}")
    plan = executable.kernel_plan or plan_kernels(lowered.optimized)
    groups = {g.name: g for g in plan.groups}
    with Bar("timing kernels", rounds, show=progress) as bar:
        profile = profile_steps(executable, arrays, rounds=rounds, on_round=bar.step)
    rows = []
    for step in profile.steps:
        group = groups.get(step.name)
        if group is None:
            raise CliError(f"kernel {step.name} of the executable is not in the kernel plan")
        flops, nbytes = group_work(group)
        level = peaks.level_for(nbytes)   # the cache level the working set fits in
        compute, memory = flops / peaks.flops, nbytes / level.bandwidth
        rows.append(KernelRow(step.name, group.kind.value,
                              "+".join(n.op.name for n in group.nodes), flops, nbytes,
                              step.seconds, max(compute, memory),
                              "compute" if compute >= memory else level.name, step.native,
                              "" if step.native else f"HOST FALLBACK: {step.reason}"))
    return rows, profile.call_seconds


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def table(rows: list[KernelRow], call_seconds: float, peaks: Peaks) -> str:
    head = (f"{'kernel':<6} {'kind':<14} {'FLOPs':>10} {'bytes':>10} {'time':>10} "
            f"{'bound':>10} {'bound by':>8} {'% bound':>7}  ops")
    levels = "".join(f"; {lv.name} (<= {_si(lv.capacity, 'B')}) {lv.bandwidth / 1e9:.0f} GB/s"
                     for lv in peaks.levels)
    lines = [f"peaks: {peaks.flops / 1e9:.1f} GFLOP/s, {peaks.bytes / 1e9:.1f} GB/s"
             + (f" DRAM{levels}" if levels else ""), head,
             "-" * len(head)]
    for r in sorted(rows, key=lambda r: -r.seconds):
        ops = r.ops if len(r.ops) <= 48 else r.ops[:45] + "..."
        lines.append(f"{r.name:<6} {r.kind:<14} {_si(r.flops, ''):>10} {_si(r.bytes, 'B'):>10} "
                     f"{format_seconds(r.seconds):>10} {format_seconds(r.bound_seconds):>10} "
                     f"{r.bound_by:>8} {r.percent_of_bound:6.1f}%  {ops}"
                     + (f"  [{r.note}]" if r.note else ""))
    total = sum(r.seconds for r in rows)
    bound = sum(r.bound_seconds for r in rows)
    lines.append(f"{'all':<6} {'':<14} {_si(sum(r.flops for r in rows), ''):>10} "
                 f"{_si(sum(r.bytes for r in rows), 'B'):>10} {format_seconds(total):>10} "
                 f"{format_seconds(bound):>10} {'':>8} "
                 f"{100 * bound / total if total else 0:6.1f}%")
    lines.append(f"a whole call: {format_seconds(call_seconds)} (kernels run one by one: "
                 f"{format_seconds(total)})")
    return "\n".join(lines)


def quantized_kernels(graph: Any, rows: list[KernelRow]) -> str:
    """Which kernels run quantized products and the weight bytes quantization saved."""
    from tilefuse.ops.quant import WEIGHT_QUANTIZED
    from tilefuse.passes.quantize import quantization_summary

    summary = quantization_summary(graph)
    names = [r.name for r in rows if any(op.name in r.ops.split("+") for op in WEIGHT_QUANTIZED)]
    kernels = f" (kernels {', '.join(names)})" if names else ""
    return f"quantization: {summary}{kernels}"


def plot(rows: list[KernelRow], peaks: Peaks, path: Path) -> int:
    """Draws the roofline and the kernels that do FLOPs; returns how many it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [r for r in rows if r.flops > 0 and r.bytes > 0 and r.seconds > 0]
    ridge = peaks.flops / peaks.bytes
    low = min([r.intensity for r in drawn] + [ridge / 100]) / 2
    high = max([r.intensity for r in drawn] + [ridge * 10]) * 2
    xs = [low * (high / low) ** (i / 200) for i in range(201)]
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.loglog(xs, [min(peaks.flops, peaks.bytes * x) / 1e9 for x in xs], color="black",
              label=f"roofline ({peaks.flops / 1e9:.0f} GFLOP/s, DRAM "
                    f"{peaks.bytes / 1e9:.0f} GB/s)")
    for level in peaks.levels:   # the cache levels' roofs, dashed
        ax.loglog(xs, [min(peaks.flops, level.bandwidth * x) / 1e9 for x in xs], "--",
                  alpha=0.6, label=f"{level.name} roof ({level.bandwidth / 1e9:.0f} GB/s, "
                                   f"working set <= {_si(level.capacity, 'B')})")
    for r in drawn:
        ax.loglog([r.intensity], [r.flops / r.seconds / 1e9], "o")
        ax.annotate(f"{r.name} {r.percent_of_bound:.0f}%", (r.intensity, r.flops / r.seconds / 1e9),
                    textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title("tilefuse kernels against the roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as err:
        raise CliError(f"cannot write {path}: {err.strerror}") from None
    finally:
        plt.close(fig)
    return len(drawn)


@contextlib.contextmanager
def pass_figures() -> Iterator[None]:
    """The pass manager computes per-pass kernel and byte figures only when its log topic is
    on (they cost a kernel formation per changed pass): turn the topic on for this compile,
    without printing its lines (they go in the report)."""
    logger = get_logger("passes")
    saved = logger.level, logger.propagate, list(logger.handlers)
    quiet = logging.NullHandler()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.handlers = [quiet]
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def run(args: argparse.Namespace) -> int:
    quiet_torch_warnings()
    model = load_model(args.model, args.quantize)
    arrays = parse_inputs(model, args.input, args.seed)
    peaks = peaks_for(args)
    note(args, f"compiling {args.model} ...")
    with pass_figures():
        lowered = model.lower(arrays)
    rows, call_seconds = kernel_rows(lowered, arrays, peaks, args.rounds, show_progress(args))
    print(table(rows, call_seconds, peaks))
    print(quantized_kernels(lowered.optimized, rows))
    print(f"\ngraph passes (what each changed: nodes, kernels, bytes moved, rules fired):\n"
          f"{lowered.report}")
    if args.json is not None:
        data = {"peaks": asdict(peaks), "call_seconds": call_seconds,
                "kernels": [asdict(r) | {"percent_of_bound": r.percent_of_bound}
                            for r in rows]}
        args.json.write_text(json.dumps(data, indent=2))
    if args.plot is not None:
        drawn = plot(rows, peaks, args.plot)
        skipped = len(rows) - drawn
        print(f"roofline chart: {args.plot} ({drawn} kernel(s)"
              + (f"; {skipped} without FLOPs not drawn" if skipped else "") + ")")
    if any(math.isinf(r.seconds) for r in rows):
        raise CliError("a kernel could not be timed")
    return 0
