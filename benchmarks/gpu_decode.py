"""Where the Llama-style decode step's time goes, on the GPU (needs one).

    python benchmarks/gpu_decode.py [--out DIR] [--calls 20] [--ab NAME=VALUE]

One script for one device call: the decode step of ``benchmarks/gpu_zoo.py`` (``llama_decode``)
compiled by tilefuse (first call under cProfile: where the compile time goes) and by Inductor
with ``mode="reduce-overhead"``; both timed (CUDA events, median of rounds, interleaved) and
profiled per kernel (``benchmarks/gpu_profile.py``); the Python work per call of
``tilefuse.jit`` on a tiny function under cProfile (where the host microseconds go). Tables go
to ``DIR``; a short summary is printed last. ``--ab NAME=VALUE`` also builds the step with that
environment variable set and times it interleaved with the others (one switch's A/B in the
same call).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _stats(prof: cProfile.Profile, key: str, n: int = 45) -> str:
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(key).print_stats(n)
    return out.getvalue()


def _median_ms(fn: Any, rounds: int = 7, repeats: int = 20) -> float:
    import torch

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


def decode(out: Path, calls: int, summary: dict[str, Any], ab_env: str = "") -> None:
    import torch
    from gpu_profile import profile, report
    from gpu_zoo import _models

    import tilefuse.torch

    torch.manual_seed(0)
    wrapped, inputs = _models(["llama_decode"])["llama_decode"]()
    module = wrapped.module
    with torch.no_grad():
        want = module(*inputs)
        tf = torch.compile(module, backend=tilefuse.torch.backend)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        got = tf(*inputs)
        torch.cuda.synchronize()
        prof.disable()
        summary["tilefuse_first_s"] = round(time.perf_counter() - t0, 2)
        (out / "first_call_cum.txt").write_text(_stats(prof, "cumulative", 80))
        (out / "first_call_tot.txt").write_text(_stats(prof, "tottime", 60))
        scale = float(want.float().abs().max())
        summary["max_abs_diff_rel"] = float((got.float() - want.float()).abs().max()) / scale
        ind = torch.compile(module, mode="reduce-overhead")
        t0 = time.perf_counter()
        ind(*inputs)
        torch.cuda.synchronize()
        summary["inductor_first_s"] = round(time.perf_counter() - t0, 2)
        systems = {"tilefuse": lambda: tf(*inputs), "inductor": lambda: ind(*inputs),
                   "eager": lambda: module(*inputs)}
        if ab_env:   # the same model built with one switch off, timed interleaved
            name, value = ab_env.split("=")
            os.environ[name] = value
            other = torch.compile(module, backend=tilefuse.torch.backend)
            got = other(*inputs)
            summary[f"ab_{ab_env}_max_abs_diff_rel"] = \
                float((got.float() - want.float()).abs().max()) / scale
            del os.environ[name]
            systems[f"tilefuse_{ab_env}"] = lambda: other(*inputs)
        for fn in systems.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        for _ in range(2):
            for key, fn in systems.items():
                summary.setdefault(f"{key}_ms", []).append(round(_median_ms(fn), 4))
        # host time per call (no sync inside the loop; the GPU work queues behind)
        for key, fn in list(systems.items())[:2]:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                fn()
            summary[f"{key}_host_us_per_call"] = round((time.perf_counter() - t0) / 50 * 1e6, 1)
            torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            tf(*inputs)
        prof.disable()
        torch.cuda.synchronize()
        (out / "decode_call_profile.txt").write_text(_stats(prof, "tottime", 40))
        lines: list[str] = []
        for key, fn in list(systems.items())[:2]:
            rows = profile(fn, calls)
            print(report(key, rows, calls, 25, lines), flush=True)
        (out / "decode_kernels.txt").write_text("\n".join(lines) + "\n")
        fresh = [torch.randint_like(t, 0, 1000) if not t.is_floating_point()
                 else torch.randn_like(t) for t in inputs]
        want, got = module(*fresh), tf(*fresh)
        summary["replay_max_abs_diff_rel"] = float((got.float() - want.float()).abs().max()) \
            / float(want.float().abs().max())


def launch(out: Path, summary: dict[str, Any]) -> None:
    """The Python work per call of a tiny jitted function on torch CUDA tensors."""
    import torch
    from gpu_launch import host_us, tiny

    import tilefuse

    os.environ["TILEFUSE_CUDA_GRAPHS"] = "1"
    x = torch.randn(16, 64, device="cuda")
    y = torch.randn(16, 64, device="cuda")
    jitted = tilefuse.jit(tiny, target="cuda")
    jitted(x, y)
    summary["tiny_host_us"] = round(host_us(lambda: jitted(x, y)), 2)
    ex = next(iter(jitted._cache.values())).executable
    o = jitted(x, y)
    summary["tiny_run_device_us"] = round(
        host_us(lambda: ex.run_device([x.data_ptr(), y.data_ptr()], [o.data_ptr()], 0)), 2)
    summary["torch_eager_tiny_us"] = round(host_us(lambda: torch.tanh(x * 2.0 + y).sum(-1)), 2)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20000):
        jitted(x, y)
    prof.disable()
    torch.cuda.synchronize()
    (out / "tiny_call_profile.txt").write_text(_stats(prof, "tottime", 40))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--skip", default="")
    parser.add_argument("--ab", default="", help="NAME=VALUE: also time a build with it set")
    args = parser.parse_args(argv)
    summary: dict[str, Any] = {}
    for name, fn in (("launch", lambda: launch(args.out, summary)),
                     ("decode", lambda: decode(args.out, args.calls, summary, args.ab))):
        if name in args.skip.split(","):
            continue
        try:
            fn()
        except Exception:   # a failure is a finding: report and go on
            import traceback
            summary[f"{name}_error"] = traceback.format_exc()[-1500:]
        print(json.dumps(summary), flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
