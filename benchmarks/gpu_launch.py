"""Launch overhead of the cuda target through the user's own call (needs a GPU).

    python benchmarks/gpu_launch.py [--json out.json]

Rows: (1) host microseconds per call of ``tilefuse.jit(fn, target="cuda")`` on torch CUDA
tensors for a tiny function (the Python work per call: keying, checks, output allocation,
the copies into the captured buffers and one ``cuGraphLaunch``; ``run_device`` alone is the
replay's own share), with CUDA graphs and with
``TILEFUSE_CUDA_GRAPHS=0`` (step-by-step launches), next to torch eager's call of the same
function; (2) the issue's logsumexp over 8192x8192 f32 with the data on the device (CUDA events,
median of rounds), tilefuse against torch, and the same through NumPy (copy in and out per call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tiny(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.tanh(x * 2.0 + y).sum(axis=-1)


def lse(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    return np.log(np.sum(np.exp(x - m), axis=-1)) + m[..., 0]


def host_us(fn: Callable[[], Any], calls: int = 2000) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def device_ms(fn: Callable[[], Any], repeats: int = 20, rounds: int = 5) -> float:
    import torch
    fn()
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / repeats)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    import torch

    import tilefuse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows: dict[str, Any] = {}
    x = torch.randn(16, 64, device="cuda")
    y = torch.randn(16, 64, device="cuda")
    for graphs in ("1", "0"):
        os.environ["TILEFUSE_CUDA_GRAPHS"] = graphs
        jitted = tilefuse.jit(tiny, target="cuda")
        out = jitted(x, y)
        want = torch.tanh(x * 2.0 + y).sum(-1)
        rows[f"tiny_max_abs_err_graphs{graphs}"] = float((out - want).abs().max())
        rows[f"tiny_host_us_graphs{graphs}"] = round(host_us(lambda j=jitted: j(x, y)), 2)
        ex = next(iter(jitted._cache.values())).executable
        ptrs, outs = [x.data_ptr(), y.data_ptr()], [out.data_ptr()]
        rows[f"tiny_run_device_us_graphs{graphs}"] = round(
            host_us(lambda e=ex, p=ptrs, o=outs: e.run_device(p, o, 0)), 2)
    os.environ["TILEFUSE_CUDA_GRAPHS"] = "1"
    rows["tiny_host_us_torch_eager"] = round(host_us(lambda: torch.tanh(x * 2.0 + y).sum(-1)), 2)

    big = torch.randn(8192, 8192, device="cuda")
    jitted = tilefuse.jit(lse, target="cuda")
    got = jitted(big)
    want = torch.logsumexp(big, -1)
    rows["lse_rel_err"] = float((got - want).abs().max() / want.abs().max())
    rows["lse_tilefuse_device_ms"] = round(device_ms(lambda: jitted(big)), 4)
    rows["lse_torch_ms"] = round(device_ms(lambda: torch.logsumexp(big, -1)), 4)
    host = big.cpu().numpy()
    t0 = time.perf_counter()
    for _ in range(5):
        jitted(host)
    rows["lse_tilefuse_numpy_ms"] = round((time.perf_counter() - t0) / 5 * 1e3, 3)
    print(json.dumps(rows), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
