"""Runs the compass workloads with tilefuse and its peers in one process, interleaved, and prints
medians and ratios.

    python benchmarks/run.py [--only W1,W3] [--rounds 15] [--json out.json]

Peers: NumPy (the function itself), torch eager, torch.compile (Inductor) and onnxruntime, each
skipped with a note when not installed. Weights are constants for tilefuse (closed over, so they
can be packed at compile time) and initializers for onnxruntime. Every implementation's output is
checked against NumPy's before timing. Times are medians over rounds; in each round every
implementation runs once (or a batch of calls for microsecond workloads), in turn, so that noise
from the shared machine hits all of them alike. NumPy alone is timed in rounds of its own (see
SEPARATE below).

Thread pools: tilefuse (libgomp), torch (its own OpenMP runtime) and onnxruntime (its own pool) live
in one process here. By default each keeps its idle threads spinning for a while after a parallel
region, so on 2 cores whichever runs next in a round finds its cores taken by another runtime's
spinning threads. The harness therefore shortens the spin: GOMP_SPINCOUNT=20000 (set before any
runtime loads, read by both OpenMP runtimes: threads stay hot between back-to-back calls but sleep
within microseconds), and onnxruntime's `session.intra_op.allow_spinning=0`. Sleeping pools
(OMP_WAIT_POLICY=PASSIVE) were tried and rejected: they cost torch eager ~1 ms per call on W5.
"""

from __future__ import annotations

import os

os.environ.setdefault("GOMP_SPINCOUNT", "20000")  # before any OpenMP runtime loads; see above

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import WORKLOADS, Workload

import tilefuse
from tilefuse.testing import assert_close


def _peers(w: Workload, inputs: list[np.ndarray]) -> dict[str, Callable[[], Any]]:
    dyn, weights = inputs[:w.dynamic], inputs[w.dynamic:]
    impls: dict[str, Callable[[], Any]] = {}
    jitted = tilefuse.jit(lambda *a: w.numpy_fn(*a, *weights))
    impls["tilefuse"] = lambda: jitted(*dyn)
    impls["numpy"] = lambda: w.numpy_fn(*inputs)
    try:
        import torch
        torch.set_num_threads(2)
        targs = [torch.from_numpy(a) for a in inputs]
        impls["torch"] = lambda: w.torch_fn(*targs)
        compiled = torch.compile(w.torch_fn)
        impls["inductor"] = lambda: compiled(*targs)
    except ImportError:
        print("  (torch not installed: torch eager and torch.compile skipped)")
    try:
        import onnxruntime as ort
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(w.onnx_model(inputs).SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        feed = {"x": dyn[0]}
        impls["onnxruntime"] = lambda: session.run(None, feed)[0]
    except ImportError:
        print("  (onnxruntime not installed: skipped)")
    return impls


# Timed in rounds of their own, after the interleaved ones: NumPy's BLAS (OpenBLAS) keeps its
# threads busy-waiting after every call with no setting to stop it, which halved the speed of
# whatever ran next on 2 cores (tilefuse's W1 went from 8 to 18 ms interleaved with it).
SEPARATE = ("numpy",)


def _as_numpy(out: Any) -> np.ndarray:
    return out.numpy() if hasattr(out, "numpy") else np.asarray(out)


def _calls_per_sample(fn: Callable[[], Any]) -> int:
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    return max(1, int(2e-3 / max(once, 1e-7)))  # at least ~2 ms per sample


def run_workload(w: Workload, rounds: int, rng: np.random.Generator) -> dict[str, Any]:
    inputs = w.make_inputs(rng)
    impls = _peers(w, inputs)
    expected = w.numpy_fn(*inputs)
    for name, fn in impls.items():   # warm up (compiles) and check every output
        assert_close(_as_numpy(fn()).reshape(expected.shape), expected.astype(np.float32),
                     reduction=w.reduction, msg=f"{w.name} {name}")
    batch = {name: _calls_per_sample(fn) for name, fn in impls.items()}
    samples: dict[str, list[float]] = {name: [] for name in impls}
    interleaved = [name for name in impls if name not in SEPARATE]
    for group in (interleaved, *([n] for n in SEPARATE if n in impls)):
        for _ in range(rounds):
            for name in group:
                fn, n = impls[name], batch[name]
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples[name].append((time.perf_counter() - t0) / n)
    medians = {name: statistics.median(s) for name, s in samples.items()}
    return {"workload": w.name, "title": w.title, "median_s": medians,
            "gflops": {k: w.flops(inputs) / v / 1e9 for k, v in medians.items()},
            "gbps": {k: w.bytes_moved(inputs) / v / 1e9 for k, v in medians.items()}}


def _fmt_time(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def table(results: list[dict[str, Any]]) -> str:
    peers = ["numpy", "torch", "inductor", "onnxruntime"]
    head = "| workload | tilefuse | " + " | ".join(peers) + " | best peer / tilefuse |"
    rows = [head, "|" + "---|" * (len(peers) + 3)]
    for r in results:
        m = r["median_s"]
        cells = [_fmt_time(m[p]) if p in m else "n/a" for p in peers]
        best = min((m[p] for p in peers if p in m), default=float("nan"))
        rows.append(f"| {r['workload']} {r['title']} | {_fmt_time(m['tilefuse'])} | "
                    + " | ".join(cells) + f" | {best / m['tilefuse']:.2f}x |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    wanted = {n.strip() for n in args.only.split(",") if n.strip()}
    rng = np.random.default_rng(0)
    results = []
    for w in WORKLOADS:
        if wanted and w.name not in wanted:
            continue
        print(f"{w.name}: {w.title}", flush=True)
        results.append(run_workload(w, args.rounds, rng))
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
