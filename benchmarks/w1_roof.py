"""W1 (gelu(x @ w + b), 512×768×3072) against the FMA roof and OpenVINO, and what the
epilogue costs, interleaved in one process.

    python benchmarks/w1_roof.py [--rounds 41]

Timed, one call each per round in a rotating order: tilefuse's W1 (weights closed over, so B
is packed once at build time), tilefuse's plain ``x @ w`` and ``x @ w + b`` of the same shape
(what the bias and the GELU epilogue add), OpenVINO and onnxruntime on the same ONNX graph;
the FMA roof (:mod:`tilefuse.tune.fma_peak`) is measured between rounds. Printed per
implementation: the minimum and median time, its GFLOP/s at the minimum, the share of the
FMA roof, and the ratio to OpenVINO (minima and the median of per-round ratios); then whether
the target (0.8 × OpenVINO's time) is reachable under the roof at all.
"""

from __future__ import annotations

import os

from tilefuse.codegen.target import SPIN_COUNT

os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))  # before any OpenMP runtime loads

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import WORKLOADS

import tilefuse
from tilefuse.tune.fma_peak import FmaProbe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    from tilefuse.cli.bench import openvino_runner
    w1 = next(w for w in WORKLOADS if w.name == "W1")
    x, w, b = w1.make_inputs(np.random.default_rng(0))
    flops = 2.0 * 512 * 768 * 3072
    gelu = tilefuse.jit(lambda a: w1.numpy_fn(a, w, b))
    plain = tilefuse.jit(lambda a: a @ w)
    bias = tilefuse.jit(lambda a: a @ w + b)
    onnx = w1.onnx_model([x, w, b]).SerializeToString()
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(onnx, opts, providers=["CPUExecutionProvider"])
    impls = {"tilefuse W1": lambda: gelu(x), "tilefuse x@w": lambda: plain(x),
             "tilefuse x@w+b": lambda: bias(x),
             "openvino W1": openvino_runner(onnx, [x], args.threads),
             "onnxruntime W1": lambda: session.run(None, {"x": x})[0]}
    expected = w1.numpy_fn(x, w, b)
    for name in ("tilefuse W1", "openvino W1", "onnxruntime W1"):
        out = impls[name]()
        got = out[0] if isinstance(out, list) else out
        np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(plain(x), x @ w, rtol=2e-3, atol=2e-3)
    probe = FmaProbe()
    times: dict[str, list[float]] = {n: [] for n in impls}
    roofs = []
    names = list(impls)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            start = time.perf_counter()
            impls[name]()
            times[name].append(time.perf_counter() - start)
        roofs.append(probe.flops_per_second(1))
    roof = max(roofs)
    ov = times["openvino W1"]
    print(f"FMA roof {roof / 1e9:.0f} GFLOP/s (best of {len(roofs)}; median "
          f"{statistics.median(roofs) / 1e9:.0f}): W1 takes >= {flops / roof * 1e3:.2f} ms")
    print(f"{'':16}{'min ms':>8}{'median':>8}{'GFLOP/s':>9}{'% roof':>8}{'min/ov':>8}"
          f"{'paired/ov':>10}")
    for name, t in times.items():
        paired = statistics.median(a / o for a, o in zip(t, ov))
        print(f"{name:16}{min(t) * 1e3:8.2f}{statistics.median(t) * 1e3:8.2f}"
              f"{flops / min(t) / 1e9:9.0f}{100 * flops / min(t) / roof:8.1f}"
              f"{min(t) / min(ov):8.2f}{paired:10.2f}")
    target = 0.8 * min(ov)
    print(f"target 0.8 x OpenVINO = {target * 1e3:.2f} ms = {flops / target / 1e9:.0f} GFLOP/s, "
          f"{100 * flops / target / roof:.0f} % of the FMA roof")


if __name__ == "__main__":
    main()
