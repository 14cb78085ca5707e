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
import logging
import math
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


def _g8_graph(shape: tuple[int, ...], dtype: DType) -> Graph:
    batch, heads, seq, d = shape
    b = GraphBuilder("g8")
    q, k, v = (b.input(((batch, heads, seq, d), dtype), name) for name in "qkv")
    return b.build([b.add1("attention", [q, k, v], {"scale": 1 / math.sqrt(d)})])


def _g8_torch(q, k, v):  # type: ignore[no-untyped-def]
    import torch
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


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
    GpuWorkload("G8", "attention B8 H16 S2048 D64 bf16", (8, 16, 2048, 64), DType.bf16,
                _g8_graph, _g8_torch, True, 0.35),
]


def _flops(name: str, shape: tuple[int, ...]) -> float:
    if name == "G1":
        return 2.0 * shape[0] * shape[1] * shape[2]
    if name == "G8":
        batch, heads, seq, d = shape
        return 4.0 * batch * heads * seq * seq * d
    return 0.0


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


def _executable(w: GpuWorkload, shape: tuple[int, ...], target: GpuTarget,
                arrays: list[np.ndarray] | None, database=None):  # type: ignore[no-untyped-def]
    from tilefuse.runtime.gpu import CudaExecutable, build_gpu_program

    graph = w.graph(shape, w.dtype)
    executable = CudaExecutable(build_gpu_program(graph, target, database=database))
    if arrays is None:
        rng = np.random.default_rng(0)
        arrays = [rng.standard_normal(tuple(v.shape), dtype=np.float32).astype(v.dtype.np)
                  for v in graph.inputs]
    for value, a in zip(executable.graph.inputs, arrays):
        executable._buffers[value].copy_from(a)   # inputs stay on the device while timing
    return executable, arrays


def _output(executable) -> np.ndarray:  # type: ignore[no-untyped-def]
    out = executable.graph.outputs[0]
    buf = executable._buffer(out)
    buf.copy_from(np.full(out.shape, np.nan, out.dtype.np))  # poison: every element written
    executable.launch_all()
    executable.context.synchronize()
    return buf.copy_to(np.empty(out.shape, out.dtype.np))


def run_workload(w: GpuWorkload, rounds: int, repeats: int, quick: bool,
                 targets: dict[str, GpuTarget], database=None  # type: ignore[no-untyped-def]
                 ) -> dict[str, object]:
    """Times ``w`` on every target variant of ``targets`` (the first is the default), torch
    eager and Inductor, interleaved; every variant's output is checked against eager first."""
    import torch

    shape = tuple(max(1, s // 16) for s in w.shape[:1]) + w.shape[1:] if quick else w.shape
    executables = {}
    arrays = None
    for name, target in targets.items():
        executables[name], arrays = _executable(w, shape, target, arrays)
    if database is not None:  # the schedules tune_gpu measured for this workload
        from tilefuse.tune.gpu import tune_gpu

        for t in tune_gpu(w.graph(shape, w.dtype), database, repeats=repeats, rounds=3):
            print(f"  {w.name} tuned {t.kernel}: {dict(t.schedule.unroll)} {t.ms:.3f} ms "
                  f"(default {t.default_ms:.3f} ms, {t.candidates} candidates)")
        executables["tuned"], _ = _executable(w, shape, GpuTarget(), arrays, database)
    assert arrays is not None
    tdtype = torch.bfloat16 if w.dtype is DType.bf16 else torch.float32
    tensors = [torch.from_numpy(a.astype(np.float32)).to("cuda", tdtype) for a in arrays]
    eager = w.torch_fn(*tensors)
    want = eager.float().cpu().numpy()
    for executable in executables.values():
        got = _output(executable)
        assert_close(got, want.astype(got.dtype), reduction=w.reduction)
    del eager
    compiled = torch.compile(w.torch_fn)
    compiled(*tensors)
    samples: dict[str, list[float]] = {"eager": [], "inductor": []}
    for _ in range(rounds):
        for name, ex in executables.items():
            samples.setdefault(name, []).append(ex.context.time_ms(ex.launch_all, repeats))
        samples["eager"].append(_torch_time(lambda: w.torch_fn(*tensors), repeats))
        samples["inductor"].append(_torch_time(lambda: compiled(*tensors), repeats))
    times = {k: statistics.median(v) for k, v in samples.items()}
    times["tilefuse"] = times[next(iter(targets))]
    program = executables[next(iter(targets))].program
    out = program.graph.outputs[0]
    nbytes = sum(a.nbytes for a in arrays) + int(np.prod(out.shape)) * out.dtype.itemsize
    flops = _flops(w.name, shape)
    steps = [type(s).__name__ for s in program.steps]
    return {"name": w.name, "title": w.title, "shape": list(shape), "ms": times,
            "bytes": nbytes, "flops": flops, "steps": steps, "target_ms": w.target_ms}


def g1_parts(repeats: int = 10, rounds: int = 5) -> dict[str, float]:
    """Where G1's time goes: cuBLAS alone (with and without a workspace), the generated
    epilogue alone, torch's matmul and addmm alone (medians of ``rounds`` event timings)."""
    import torch

    from tilefuse.runtime.cublas import Cublas
    from tilefuse.runtime.gpu import GemmStep, GpuKernel

    w = WORKLOADS[0]
    ex, arrays = _executable(w, w.shape, GpuTarget(), None)
    gemm = next(s for s in ex.program.steps if isinstance(s, GemmStep))
    epi = next(s for s in ex.program.steps if isinstance(s, GpuKernel))
    bare = Cublas(ex.context, workspace_bytes=0)
    a, b, c = ex._buffer(gemm.a).ptr, ex._buffer(gemm.b).ptr, ex._buffer(gemm.out).ptr
    _, fn = ex._functions[epi.fn.name]
    assert gemm.mma is not None
    mma_fn = ex.context.load_ptx(gemm.mma.ptx).function(gemm.mma.name)
    args = [ex._buffer(v).ptr for v in epi.bindings]
    x, wt, bias = [torch.from_numpy(t.astype(np.float32)).to("cuda", torch.bfloat16)
                   for t in arrays]
    prod = x @ wt
    runs: dict[str, Callable[[], object]] = {
        "cublas (workspace)": lambda: ex._cublas.gemm(gemm.shape, a, b, c),
        "cublas (no workspace)": lambda: bare.gemm(gemm.shape, a, b, c),
        "epilogue kernel": lambda: ex.context.launch(fn, ex._grids[epi.fn.name], epi.block, args),
        "tilefuse G1": ex.launch_all,
        "generated mma product": lambda: ex.context.launch(
            mma_fn, gemm.mma.grid, gemm.mma.block, [a, b, c]),
        "torch x@w": lambda: x @ wt,
        "torch addmm": lambda: torch.addmm(bias, x, wt),
        "torch gelu(prod+b)": lambda: torch.nn.functional.gelu(prod + bias),
    }
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for run in runs.values():
        run()
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(ex.context.time_ms(run, repeats))
    return {k: statistics.median(v) for k, v in samples.items()}


def g8_configs(specs: str, repeats: int = 10, rounds: int = 7) -> dict[str, float]:
    """G8's fused kernel alone under other blockings (``block_m x block_n x warps x
    min_blocks[ x sum_mma x pipeline x exp_pairs]``, comma-separated), each checked against
    eager SDPA first, then timed
    interleaved with the default and eager (median ms)."""
    import torch

    from tilefuse.codegen.nvptx_attention import FlashConfig, FlashShape, flash_attention
    from tilefuse.codegen.nvptx_wgmma_attention import WGMMA_CONFIG
    from tilefuse.runtime.cuda_driver import CudaContext

    batch, heads, seq, d = WORKLOADS[-1].shape
    shape = FlashShape(batch * heads, seq, seq, d, d, 1 / math.sqrt(d))
    ctx = CudaContext()
    q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    want = _g8_torch(q, k, v).float()
    runs: dict[str, Callable[[], object]] = {"eager sdpa": lambda: _g8_torch(q, k, v)}
    outs = []   # alive while the launches write them
    for spec in ["128x64x4x2", *filter(None, specs.split(","))]:
        config = WGMMA_CONFIG if spec == "wgmma" else \
            FlashConfig(*(int(x) for x in spec.split("x")))
        kernel = flash_attention(shape, config)
        fn = ctx.load_ptx(kernel.ptx).function(kernel.name)
        out = torch.full_like(q, float("nan"))
        outs.append(out)
        args = [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()]

        def run(fn=fn, kernel=kernel, args=args):  # type: ignore[no-untyped-def]
            ctx.launch(fn, kernel.grid, kernel.block, args)

        run()
        torch.cuda.synchronize()
        err = ((out.float() - want).norm() / want.norm()).item()
        print(f"  G8 config {spec}: relative error {err:.2e} vs eager")
        if not err < 1e-2:
            continue
        runs[spec] = run
    samples: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(_torch_time(run, repeats))
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1/16 of each size, 3 rounds")
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--variants", default="",
                        help="extra tilefuse variants timed beside the default: "
                             "name:field=value+field=value,... (GpuTarget fields)")
    parser.add_argument("--g1-parts", action="store_true", help="time G1's pieces alone")
    parser.add_argument("--g8-configs", default=None, help="time G8's fused kernel under "
                        "these FlashConfigs too (MxNxWARPSxMINBLOCKS"
                        "[xSUMxPIPExSWIZxQSHxPAIRSxWGMMA] or 'wgmma', comma-separated), "
                        "then the workloads")
    parser.add_argument("--tune", default="", help="comma-separated workloads to tune first "
                        "(tilefuse.tune.gpu, into --tune-db) and time as variant 'tuned'")
    parser.add_argument("--tune-db", type=Path, default=Path("gpu_tune.sqlite"))
    args = parser.parse_args(argv)
    import torch
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("  [%(name)s] %(message)s"))
    fallback = logging.getLogger("tilefuse.fallback")
    fallback.addHandler(handler)
    fallback.setLevel(logging.INFO)   # which kernels the executables chose
    if args.g1_parts:
        for name, ms in g1_parts().items():
            print(f"  G1 part {name}: {ms:.3f} ms")
    if args.g8_configs is not None:
        flops = _flops("G8", WORKLOADS[-1].shape)
        for name, ms in g8_configs(args.g8_configs).items():
            print(f"  G8 {name}: {ms:.3f} ms {flops / (ms * 1e-3) / 1e12:.0f} TFLOP/s")
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
            database = None
            if w.name in args.tune.split(","):
                from tilefuse.tune.database import SQLiteDatabase
                database = SQLiteDatabase(args.tune_db)
            r = run_workload(w, rounds, repeats, args.quick, _targets(args.variants), database)
        except Exception as exc:  # report and go on: one workload must not hide the others
            print(f"| {w.name} {w.title} | failed: {type(exc).__name__}: {exc} |||||||")
            continue
        t = r["ms"]
        for name, ms in t.items():  # type: ignore[union-attr]
            if name not in ("tilefuse", "eager", "inductor"):
                print(f"  {w.name} variant {name}: {ms:.3f} ms")
        bw = r["bytes"] / (t["tilefuse"] * 1e-3)  # type: ignore[index,operator]
        if r["flops"]:
            rates = ", ".join(f"{k} {r['flops'] / (t[k] * 1e-3) / 1e12:.0f}"  # type: ignore
                              for k in ("tilefuse", "eager", "inductor"))
            print(f"  {w.name}: TFLOP/s {rates} (steps {r['steps']})")
        print(f"| {w.name} {w.title} | {t['tilefuse']:.3f} | {t['eager']:.3f} | "
              f"{t['inductor']:.3f} | {t['inductor'] / t['tilefuse']:.2f}x | {bw / 1e12:.2f} | "
              f"{100 * bw / peak:.0f}% | {w.target_ms or '-'} |")
        results.append(r)
    if args.json:
        args.json.write_text(json.dumps({"copy_peak": peak, "results": results}, indent=1))
    return 0


def _targets(spec: str) -> dict[str, GpuTarget]:
    targets = {"default": GpuTarget()}
    for item in filter(None, spec.split(",")):
        name, _, fields = item.partition(":")
        values = dict(f.split("=") for f in fields.split("+") if f)
        targets[name] = GpuTarget(**{k: int(v) for k, v in values.items()})
    return targets


if __name__ == "__main__":
    raise SystemExit(main())
