"""A model's contraction kernels against the BLAS libraries at the same M x N x K, and against
the roofline bound at peaks measured in the same round.

For each contraction kernel of a model's build: tilefuse's kernel built alone as the tuner
builds it (``TuneTask.build``, with its default schedule, or the one ``--db`` gives it), NumPy's
``matmul`` (its BLAS: OpenBLAS in the wheels) and torch's ``matmul`` (oneDNN/MKL), each of the
bare product of the same shape, so the peers skip the kernel's fused epilogue (bias, batch norm,
residual, ReLU, GELU) and its traffic. Every call follows what the tuner's runner does before
one (``before_each_call``): a 16 MiB flush, then the activations written again (tilefuse's
inputs, the peers' A: in a model the kernel before just wrote them), and for tilefuse a wake of
its thread pool (in a model the kernel before leaves the workers polling; NumPy's OpenBLAS
threads spin 0.1 s by themselves). Each
round also measures the peaks again (:class:`tilefuse.tune.roofline.PeakProbe`: the fastest of
three large products by NumPy and tilefuse, and a 256 MiB copy), so that "% bound" pairs a
kernel's time with the machine's speed in the same minute (this shared host's speed swings
1.6x within the hour). Rounds alternate everything; medians.

    .venv/bin/python benchmarks/contraction_peers.py resnet50 --rounds 7
    .venv/bin/python benchmarks/contraction_peers.py bert --db tune.sqlite

Columns: GFLOP/s of each; "vs BLAS": tilefuse's time over the faster peer's, inverted (above
1: tilefuse faster, though it also does the epilogue); "% bound": the roofline bound at the
round's peaks over tilefuse's time; "BLAS %": the same for the faster peer's bare product (its
bound counts only A, B and C), per round, medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tilefuse.codegen.target import SPIN_COUNT

os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))  # before torch's OpenMP loads

import numpy as np
from tuned_ab import _model

from tilefuse.codegen.target import host_target
from tilefuse.kernel.fusion import KernelKind
from tilefuse.runtime.schedules import ForcedSchedules, ScheduleSource
from tilefuse.tune.roofline import PAIRED_REPEATS, PeakProbe, Peaks, bound_at
from tilefuse.tune.runner import as_in_a_model
from tilefuse.tune.task import named_tasks

FLUSH_FLOATS = 4 << 20   # 16 MiB, as the tuner's MeasureOptions.flush_bytes


def _torch_matmul(a: np.ndarray, b: np.ndarray) -> Callable[[], object] | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    out = torch.empty(a.shape[0], b.shape[1])
    return lambda: torch.matmul(ta, tb, out=out)


SETTLE_SECONDS = 0.2
"""Idle time before each contender's calls: NumPy's OpenBLAS threads busy-wait after a call
(about 2^28 cycles, 0.1 s here) and torch's for GOMP_SPINCOUNT, so on 2 cores whatever ran
right after a peer found a core taken (k29 alone after torch: 59 GFLOP/s, against 128)."""


WARMUP_SECONDS = 0.1
"""Untimed calls before each contender's timed ones, for at least this long: the cores come
back from the settling idle slowly (k29 alone: 67 GFLOP/s over the first 5 calls after it,
115 over 40)."""


def _timed(fn: Callable[[], object], prepare: Callable[[], object], calls: int) -> float:
    """The median seconds of ``calls`` calls of ``fn``, each after ``prepare``, after
    :data:`SETTLE_SECONDS` idle and :data:`WARMUP_SECONDS` of untimed calls."""
    time.sleep(SETTLE_SECONDS)
    warm_until = time.perf_counter() + WARMUP_SECONDS
    while time.perf_counter() < warm_until:
        prepare()
        fn()
    times = []
    for _ in range(calls):
        prepare()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _contenders(model: str, db: str | None, only: set[str] | None) -> list[dict]:
    """Per contraction kernel: its name, shape, work and the three callables."""
    graph, _, _ = _model(model, Path(tempfile.mkdtemp()))
    target = host_target()
    source = (ScheduleSource(target, env={"TILEFUSE_TUNE_DB": db}) if db
              else ForcedSchedules(target, {}))
    rng = np.random.default_rng(0)
    rows = []
    for name, task in named_tasks(graph):
        if task.kind is not KernelKind.CONTRACTION or (only and name not in only):
            continue
        extents = task.extents()
        if any(not isinstance(extents.get(a), int) for a in "mnk") or "b" in extents:
            continue   # the peers' 2-D product would not be the same work
        m, n, k = extents["m"], extents["n"], extents["k"]
        schedule = source.schedule(task.group, task.constants)
        inputs = task.random_inputs(rng)
        built = task.build(schedule, inputs)
        a = rng.standard_normal((m, k), dtype=np.float32)
        a_source = a.copy()
        b = rng.standard_normal((k, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        flops, nbytes = task.work()
        bare = float(a.nbytes + b.nbytes + c.nbytes)   # the peers' product: no epilogue
        rows.append({"name": name, "shape": (m, n, k), "flops": flops, "bytes": nbytes,
                     "bare_bytes": bare,
                     "schedule": schedule, "tilefuse": built.run,
                     "written": {"tilefuse": list(zip(built.arrays,
                                                      [inputs[v] for v in task.graph.inputs])),
                                 "numpy": [(a, a_source)], "torch": [(a, a_source)]},
                     "numpy": lambda a=a, b=b, c=c: np.matmul(a, b, out=c),
                     "torch": _torch_matmul(a, b)})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="bert, resnet50, or an .onnx file")
    parser.add_argument("--db", help="a tuning database: its schedules instead of the defaults")
    parser.add_argument("--only", help="comma-separated kernel names (kernels.plan's k3, ...)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=9, help="timed calls per round")
    args = parser.parse_args(argv)
    rows = _contenders(args.model, args.db, set(args.only.split(",")) if args.only else None)
    if not rows:
        print("no 2-D contraction kernels to compare", file=sys.stderr)
        return 1
    probe, scratch = PeakProbe(), np.empty(FLUSH_FLOATS, np.float32)

    peers = ("tilefuse", "numpy", "torch")
    times: dict[str, dict[str, list[float]]] = {r["name"]: {p: [] for p in peers} for r in rows}
    # bound / time per round: tilefuse's kernel, and the faster peer's bare product
    shares: dict[str, list[float]] = {r["name"]: [] for r in rows}
    peer_shares: dict[str, list[float]] = {r["name"]: [] for r in rows}
    peaks: list[Peaks] = []
    for _ in range(args.rounds):
        time.sleep(SETTLE_SECONDS)
        round_peaks = probe.peaks(PAIRED_REPEATS, _best)
        peaks.append(round_peaks)
        for row in rows:
            for peer in peers:
                if row[peer] is not None:
                    prepare = as_in_a_model(scratch, row["written"][peer],
                                            wake=peer == "tilefuse")
                    times[row["name"]][peer].append(_timed(row[peer], prepare, args.calls))
            took = times[row["name"]]
            bound = bound_at(round_peaks, row["flops"], row["bytes"])
            shares[row["name"]].append(bound / took["tilefuse"][-1])
            peer = min(took[p][-1] for p in ("numpy", "torch") if took[p])
            peer_shares[row["name"]].append(
                bound_at(round_peaks, row["flops"], row["bare_bytes"]) / peer)
    _report(rows, times, shares, peer_shares, peaks)
    return 0


def _best(fn: Callable[[], object], repeats: int) -> float:
    """The least seconds of ``repeats`` calls (warm, back to back: a peak), after
    :data:`WARMUP_SECONDS` of untimed calls (cold, the peaks came out low: kernels beside
    them at up to 118 % of their bound)."""
    warm_until = time.perf_counter() + WARMUP_SECONDS
    while time.perf_counter() < warm_until:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _report(rows: list[dict], times: dict[str, dict[str, list[float]]],
            shares: dict[str, list[float]], peer_shares: dict[str, list[float]],
            peaks: list[Peaks]) -> None:
    flops = statistics.median(p.flops for p in peaks) / 1e9
    bandwidth = statistics.median(p.bytes for p in peaks) / 1e9
    print(f"peaks measured beside the kernels (medians of the rounds): {flops:.0f} GFLOP/s, "
          f"{bandwidth:.1f} GB/s")
    print(f"{'kernel':7s} {'M x N x K':>16s} {'AI':>5s} {'tilefuse':>9s} {'numpy':>7s} "
          f"{'torch':>7s} {'vs BLAS':>8s} {'% bound':>8s} {'BLAS %':>7s}  schedule")
    for row in rows:
        name = row["name"]
        med = {p: statistics.median(v) for p, v in times[name].items() if v}
        rate = {p: row["flops"] / s / 1e9 for p, s in med.items()}
        best_peer = min(s for p, s in med.items() if p != "tilefuse")
        shape = "x".join(map(str, row["shape"]))
        torch_rate = f"{rate['torch']:7.0f}" if "torch" in rate else f"{'-':>7s}"
        bound = statistics.median(shares[name]) * 100
        peer_bound = statistics.median(peer_shares[name]) * 100
        print(f"{name:7s} {shape:>16s} {row['flops'] / row['bytes']:5.0f} "
              f"{rate['tilefuse']:9.0f} {rate['numpy']:7.0f} {torch_rate} "
              f"{best_peer / med['tilefuse']:7.2f}x {bound:7.0f}% {peer_bound:6.0f}%  "
              f"{row['schedule']}")


if __name__ == "__main__":
    sys.exit(main())
