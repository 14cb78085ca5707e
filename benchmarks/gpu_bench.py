"""GPU workloads on the ``cuda`` target against torch eager and torch.compile on the same device.

    python benchmarks/gpu_bench.py [--quick] [--json out.json]

Each workload is built as a tilefuse graph and as a torch function; inputs live on the device
for both (tilefuse's per-call host<->device copies are not timed: ``launch_all`` only, the
kernels as torch runs them). Timing: CUDA events around ``repeats`` back-to-back runs after a
warm-up, the median of several such samples, interleaved between the systems. Correctness:
every tilefuse output is compared with torch eager's on the same inputs before timing.
Bandwidth: the bytes each workload must move (inputs read once, outputs written once) over the
time, against the copy peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilefuse.codegen.llvm_nvptx import GpuTarget
from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph
from tilefuse.testing import assert_close


@dataclass(frozen=True)
class GpuWorkload:
    name: str
    title: str
    shape: tuple[int, ...]
    dtype: DType
    graph: Callable[[tuple[int, ...], DType], Graph]
    torch_fn: Callable[..., object]
    reduction: bool
    target_ms: float | None


def _g7_graph(shape: tuple[int, ...], dtype: DType) -> Graph:
    b = GraphBuilder("g7")
    x = b.input((shape, dtype), "x")
    two = b.add1("constant", [], {"value": np.array(2, dtype.np)})
    one = b.add1("constant", [], {"value": np.array(1, dtype.np)})
    y = b.add1("relu", [b.add1("add", [b.add1("mul", [x, two]), one])])
    return b.build([b.add1("mul", [y, b.add1("sigmoid", [x])])])


def _g2_graph(shape: tuple[int, ...], dtype: DType) -> Graph:
    b = GraphBuilder("g2")
    x = b.input((shape, dtype), "x")
    g = b.input(((shape[-1],), dtype), "g")
    beta = b.input(((shape[-1],), dtype), "beta")
    return b.build([b.add1("layer_norm", [x, g, beta], {"eps": 1e-5})])


def _g3_graph(shape: tuple[int, ...], dtype: DType) -> Graph:
    b = GraphBuilder("g3")
    x = b.input((shape, dtype), "x")
    return b.build([b.add1("softmax", [x], {"axis": -1})])


def _g1_graph(shape: tuple[int, ...], dtype: DType) -> Graph:
    m, k, n = shape
    b = GraphBuilder("g1")
    x = b.input(((m, k), dtype), "x")
    w = b.input(((k, n), dtype), "w")
    bias = b.input(((n,), dtype), "b")
    y = b.add1("add", [b.add1("matmul", [x, w]), bias])
    return b.build([b.add1("gelu", [y])])


def _g1_torch(x, w, b):  # type: ignore[no-untyped-def]
    import torch
    return torch.nn.functional.gelu(x @ w + b)


def _g7_torch(x):  # type: ignore[no-untyped-def]
    import torch
    return torch.relu(2 * x + 1) * torch.sigmoid(x)


def _g2_torch(x, g, beta):  # type: ignore[no-untyped-def]
    import torch
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), g, beta, 1e-5)


def _g3_torch(x):  # type: ignore[no-untyped-def]
    import torch
    return torch.softmax(x, dim=-1)


WORKLOADS = [
    GpuWorkload("G1", "gelu(x@w+b) bf16 8192x4096x16384", (8192, 4096, 16384), DType.bf16,
                _g1_graph, _g1_torch, True, 1.86),
    GpuWorkload("G7", "relu(2x+1)*sigmoid(x) f32 256M", (256 * 1024 * 1024,), DType.f32,
                _g7_graph, _g7_torch, False, 0.53),
    GpuWorkload("G2", "layer_norm f32 [32768,4096]", (32768, 4096), DType.f32, _g2_graph,
                _g2_torch, True, None),
    GpuWorkload("G2b", "layer_norm bf16 [32768,4096]", (32768, 4096), DType.bf16, _g2_graph,
                _g2_torch, True, 0.186),
    GpuWorkload("G3", "softmax f32 [16,16,1024,1024]", (16, 16, 1024, 1024), DType.f32,
                _g3_graph, _g3_torch, True, None),
    GpuWorkload("G3b", "softmax bf16 [16,16,1024,1024]", (16, 16, 1024, 1024), DType.bf16,
                _g3_graph, _g3_torch, True, 0.255),
]


def _torch_time(fn: Callable[[], object], repeats: int) -> float:
    import torch
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / repeats


def _copy_peak(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second)."""
    import torch
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    ms = statistics.median(_torch_time(lambda: b.copy_(a), 10) for _ in range(5))
    return 2 * nbytes / (ms * 1e-3)


def run_workload(w: GpuWorkload, rounds: int, repeats: int, quick: bool,
                 target: GpuTarget) -> dict[str, object]:
    import torch

    from tilefuse.runtime.gpu import CudaExecutable, build_gpu_program

    shape = tuple(max(1, s // 16) for s in w.shape[:1]) + w.shape[1:] if quick else w.shape
    graph = w.graph(shape, w.dtype)
    program = build_gpu_program(graph, target)
    executable = CudaExecutable(program)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(tuple(v.shape), dtype=np.float32).astype(v.dtype.np)
              for v in graph.inputs]
    for value, a in zip(program.graph.inputs, arrays):
        executable._buffers[value].copy_from(a)   # inputs stay on the device while timing
    tdtype = torch.bfloat16 if w.dtype is DType.bf16 else torch.float32
    tensors = [torch.from_numpy(a.astype(np.float32)).to("cuda", tdtype) for a in arrays]
    eager = w.torch_fn(*tensors)
    executable.launch_all()
    executable.context.synchronize()
    out = program.graph.outputs[0]
    got = executable._buffer(out).copy_to(np.empty(out.shape, out.dtype.np))
    assert_close(got, eager.float().cpu().numpy().astype(out.dtype.np), reduction=w.reduction)
    compiled = torch.compile(w.torch_fn)
    compiled(*tensors)
    samples: dict[str, list[float]] = {"tilefuse": [], "eager": [], "inductor": []}
    for _ in range(rounds):
        samples["tilefuse"].append(executable.context.time_ms(executable.launch_all, repeats))
        samples["eager"].append(_torch_time(lambda: w.torch_fn(*tensors), repeats))
        samples["inductor"].append(_torch_time(lambda: compiled(*tensors), repeats))
    times = {k: statistics.median(v) for k, v in samples.items()}
    nbytes = sum(a.nbytes for a in arrays) + int(np.prod(out.shape)) * out.dtype.itemsize
    flops = 2.0 * shape[0] * shape[1] * shape[2] if w.name == "G1" else 0.0
    steps = [type(s).__name__ for s in program.steps]
    return {"name": w.name, "title": w.title, "shape": list(shape), "ms": times,
            "bytes": nbytes, "flops": flops, "steps": steps, "target_ms": w.target_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1/16 of each size, 3 rounds")
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--row-unroll", type=int, default=GpuTarget().row_unroll,
                        help="accumulators per warp in row kernels")
    args = parser.parse_args(argv)
    import torch
    rounds, repeats = (3, 3) if args.quick else (7, 10)
    peak = _copy_peak()
    print(f"device: {torch.cuda.get_device_name()}  copy peak {peak / 1e12:.2f} TB/s")
    print("| workload | tilefuse ms | eager ms | inductor ms | inductor/tilefuse | tilefuse TB/s "
          "| % of copy peak | target ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    only = set(filter(None, args.only.split(",")))
    for w in WORKLOADS:
        if only and w.name not in only:
            continue
        try:
            r = run_workload(w, rounds, repeats, args.quick,
                             GpuTarget(row_unroll=args.row_unroll))
        except Exception as exc:  # report and go on: one workload must not hide the others
            print(f"| {w.name} {w.title} | failed: {type(exc).__name__}: {exc} |||||||")
            continue
        t = r["ms"]
        bw = r["bytes"] / (t["tilefuse"] * 1e-3)  # type: ignore[index,operator]
        if r["flops"]:
            print(f"  {w.name}: {r['flops'] / (t['tilefuse'] * 1e-3) / 1e12:.0f} TFLOP/s "
                  f"(steps {r['steps']})")
        print(f"| {w.name} {w.title} | {t['tilefuse']:.3f} | {t['eager']:.3f} | "
              f"{t['inductor']:.3f} | {t['inductor'] / t['tilefuse']:.2f}x | {bw / 1e12:.2f} | "
              f"{100 * bw / peak:.0f}% | {w.target_ms or '-'} |")
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps({"copy_peak": peak, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
