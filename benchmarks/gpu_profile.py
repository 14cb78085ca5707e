"""Where a zoo model's GPU time goes: per-kernel device times of tilefuse and Inductor from one
profiled run (needs a GPU).

    python benchmarks/gpu_profile.py [--models resnet50,vit,llama] [--out DIR] [--calls 5]

Each model of ``benchmarks/gpu_zoo.py`` is compiled with tilefuse (the target follows the
data) and with Inductor's default mode, warmed up, then ``--calls`` calls of each are profiled
with ``torch.profiler`` (CUPTI sees the kernels tilefuse launches through the driver API and
those inside its replayed CUDA graph). Printed per system: the device time per call, its split
by kind (tilefuse's own kernels by role: ``prologue`` / ``epilogue`` / other generated;
``gemm`` for cuBLAS / CUTLASS / Triton products; the rest) and the top kernels; the whole
tables go to ``DIR/profile_<model>.txt``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def kind_of(name: str) -> str:
    """A kernel's role from its name (tilefuse's are ``k<N>[_prologue_a|_epilogue]``)."""
    if re.match(r"k\d+_prologue", name):
        return "prologue"
    if re.match(r"k\d+_epilogue", name):
        return "epilogue"
    if re.match(r"(flash|wgmma_attention|attention)", name):
        return "attention"
    if re.match(r"(k\d+|mma_gemm)", name):
        return "generated"
    low = name.lower()
    if any(w in low for w in ("gemm", "xmma", "cutlass", "mm_", "matmul", "gemv", "conv",
                              "cudnn", "implicit")):
        return "gemm/conv"
    if "memcpy" in low or "memset" in low:
        return "copy"
    return "other"


def device_us(event: Any) -> float:
    for attr in ("device_time_total", "cuda_time_total", "self_device_time_total"):
        value = getattr(event, attr, None)
        if value:
            return float(value)
    return 0.0


def profile(fn: Any, calls: int) -> list[tuple[str, int, float]]:
    """(kernel name, launches, total device µs) of ``calls`` calls of ``fn``, largest first."""
    import torch
    from torch.profiler import ProfilerActivity

    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = device_us(e)
        if us > 0 and getattr(e, "device_type", None) is not None and \
                "DeviceType.CUDA" in str(e.device_type):
            rows.append((e.key, e.count, us))
    if not rows:   # older profilers: device time on the events whatever their type
        rows = [(e.key, e.count, device_us(e)) for e in prof.key_averages() if device_us(e)]
    return sorted(rows, key=lambda r: -r[2])


def report(system: str, rows: list[tuple[str, int, float]], calls: int, top: int,
           out: list[str]) -> str:
    total = sum(r[2] for r in rows) / calls
    kinds: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for name, count, us in rows:
        kinds[kind_of(name)] += us / calls
        counts[kind_of(name)] += count // calls
    split = ", ".join(f"{k} {v / 1000:.3f} ms ({counts[k]})" for k, v in
                      sorted(kinds.items(), key=lambda kv: -kv[1]))
    head = f"{system}: {total / 1000:.3f} ms of kernels per call: {split}"
    out.append(head)
    out += [f"  {us / calls / 1000:8.4f} ms x{count // calls:<4d} {name[:110]}"
            for name, count, us in rows]
    lines = [head] + [f"  {us / calls / 1000:8.4f} ms x{count // calls:<4d} {name[:90]}"
                      for name, count, us in rows[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch
    from gpu_zoo import _models

    import tilefuse.torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vit,llama")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--inductor", action="store_true")
    args = parser.parse_args(argv)
    for name, make in _models(args.models.split(",")).items():
        try:
            torch.manual_seed(0)
            wrapped, inputs = make()
            module = wrapped.module
            systems = {"tilefuse": torch.compile(module, backend=tilefuse.torch.backend)}
            if args.inductor:
                systems["inductor"] = torch.compile(module)
            lines: list[str] = []
            with torch.no_grad():
                for system, compiled in systems.items():
                    for _ in range(3):
                        compiled(*inputs)
                    torch.cuda.synchronize()
                    rows = profile(lambda c=compiled, i=inputs: c(*i), args.calls)
                    print(f"== {name}\n" + report(system, rows, args.calls, args.top, lines),
                          flush=True)
            (args.out / f"profile_{name}.txt").write_text("\n".join(lines) + "\n")
        except Exception as err:   # one model's failure is a finding; go on
            print(f"== {name}: {type(err).__name__}: {str(err)[:500]}", flush=True)
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
