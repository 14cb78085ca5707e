"""Weight-only quantized products on the ``cuda`` target against bf16 cuBLAS (torch).

    python benchmarks/gpu_quant.py [--quick] [--ms 1,4,16] [--sweep] [--shapes] [--json out]
                                   [--ptx-out DIR] [--dry]

1. **Products** ``x[M, K] @ W[K, N]``, K = N = 8192, M = 1, 4, 16, bf16 activations: tilefuse's
   ``matmul_wq`` kernel with int4 (group 128), int8 and fp8 weights against torch's bf16
   matmul (cuBLAS); int8 and fp8 at the first and last M only. Each timed call runs
   ``ROTATE`` products with different weights (so the 34 MB of an int4 weight is not served
   from the 50 MB L2), the time is per product: both sides captured as CUDA graphs (10 calls
   each) and replayed between events, the median of 5 samples of 10 replays (Python's launch
   cost, 20-40 µs a launch, is as long as a kernel; the Python-launched time is logged too).
   Before timing, product 0's output is compared with the exact dequantized reference (f32,
   on the device through torch).
2. ``--sweep``: every configuration of :data:`SWEEP` for int4 at each M, checked against the
   exact product (output poisoned first) and timed the same way; ``--shapes`` also at the
   decode step's product shapes (M = 1). ``--ptx-out DIR`` compiles the sweep's kernels on the
   CPU and stops; ``$GPU_QUANT_PTX=DIR`` on the device then skips their compilation.
3. **A Llama-style decode step** (hidden 4096, 32 heads of 128, MLP 11008, a KV cache of 512,
   one token): the same tilefuse graph built in bf16 and with ``quantize="int4"`` for the cuda
   target; each replayed as its CUDA graph (``run_device``), device time per step.

``--dry`` builds every program at small sizes without a GPU (a check that the script runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph, Literal
from tilefuse.ops.quant_gpu import BYTES_PER_K, chunk_lanes, dequantize, pack_tiles

BF16 = DType.bf16
ROTATE = 4


def _const(b: GraphBuilder, array: np.ndarray) -> Any:
    return b.add1("constant", [], {"value": Literal(np.ascontiguousarray(array))})


def random_weight(fmt: str, k: int, n: int, rng: np.random.Generator, group: int = 128
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed, scales, zeros) of random codes: the kernel's speed does not depend on how the
    codes were chosen, and quantizing an 8192² f32 weight would take most of the call."""
    if fmt == "int4":
        codes = rng.integers(0, 16, (k, n), dtype=np.uint8)
        scales = (rng.random((k // group, n), np.float32) * 0.02 + 0.005).astype(np.float32)
        zeros = np.full((k // group, n), 8, np.uint8)
    else:
        if fmt == "int8":
            codes = rng.integers(-127, 128, (k, n), dtype=np.int16).astype(np.int8).view(
                np.uint8)
        else:   # e4m3 codes with |v| <= 2: no NaN
            codes = rng.integers(0, 0x40, (k, n), dtype=np.uint8) | (
                rng.integers(0, 2, (k, n), dtype=np.uint8) << 7)
        scales = (rng.random((1, n), np.float32) * 0.002 + 0.001).astype(np.float32)
        zeros = np.zeros((1, n), np.uint8)
    return pack_tiles(codes, fmt, chunk_lanes(fmt, group)), scales, zeros


def products_graph(m: int, k: int, n: int, fmt: str, weights: list[tuple]) -> Graph:
    b = GraphBuilder(f"wq_{fmt}_m{m}")
    x = b.input(((m, k), BF16), "x")
    outs = [b.add1("matmul_wq", [x, _const(b, p), _const(b, s), _const(b, z),
                                 _const(b, np.zeros(n, np.float32))],
                   {"format": fmt, "group": 128, "zero_points": False, "act": "none"})
            for p, s, z in weights]
    return b.build(outs)


def decode_graph(hidden: int, heads: int, inter: int, cache: int, seed: int = 0) -> Graph:
    """One Llama-style block for one token: RMSNorm, q/k/v projections, attention over the
    cache, output projection and residual, RMSNorm, SiLU-gated MLP and residual (bf16)."""
    d = hidden // heads
    b = GraphBuilder("llama_decode")
    x = b.input(((1, hidden), BF16), "x")
    kc = b.input(((heads, cache, d), BF16), "k_cache")
    vc = b.input(((heads, cache, d), BF16), "v_cache")

    import torch  # bf16 random weights through torch: NumPy's bf16 cast takes ~20 s here

    gen = torch.Generator().manual_seed(seed)

    def weight(rows: int, cols: int) -> Any:
        t = torch.randn(rows, cols, generator=gen, dtype=torch.bfloat16) / float(np.sqrt(rows))
        return _const(b, t.view(torch.int16).numpy().view(BF16.np))

    def norm(v: Any) -> Any:
        return b.add1("rms_norm", [v, _const(b, np.ones(hidden, BF16.np))], {"eps": 1e-6})

    h = norm(x)
    q, k, v = (b.add1("matmul", [h, weight(hidden, hidden)]) for _ in range(3))
    q3 = b.add1("reshape", [q], {"shape": (heads, 1, d)})
    att = b.add1("attention", [q3, kc, vc], {"scale": float(1 / np.sqrt(d))})
    o = b.add1("matmul", [b.add1("reshape", [att], {"shape": (1, hidden)}),
                          weight(hidden, hidden)])
    x2 = b.add1("add", [x, o])
    h2 = norm(x2)
    gate = b.add1("matmul", [h2, weight(hidden, inter)])
    up = b.add1("matmul", [h2, weight(hidden, inter)])
    mlp = b.add1("matmul", [b.add1("mul", [b.add1("silu", [gate]), up]), weight(inter, hidden)])
    return b.build([b.add1("add", [x2, mlp]), k, v])


def _median_ms(time_ms, run, repeats: int, samples: int) -> float:
    run()
    return statistics.median(time_ms(run, repeats) for _ in range(samples))


def graph_ms(ctx: Any, record: Any, inner: int = 10, replays: int = 10,
             samples: int = 5) -> float:
    """Milliseconds per ``record(stream)`` replayed from one CUDA graph holding ``inner``
    copies of it: the device time without Python's launch cost (a few microseconds a launch,
    as much as a 10 µs kernel)."""
    from tilefuse.runtime.cuda_driver import _call
    from tilefuse.runtime.cuda_graph import CudaGraph

    graph = CudaGraph(ctx, lambda stream: [record(stream) for _ in range(inner)])

    def replay() -> None:
        with ctx:
            _call("cuGraphLaunch", graph.exec, 0)
    return _median_ms(ctx.time_ms, replay, replays, samples) / inner


def torch_graph_ms(run: Any, inner: int = 10, replays: int = 10, samples: int = 5) -> float:
    """The same for torch work (cuBLAS), captured with ``torch.cuda.graph``."""
    import torch

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            run()

    def timed(repeats: int) -> float:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
            enable_timing=True)
        start.record()
        for _ in range(repeats):
            graph.replay()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / repeats
    graph.replay()
    return statistics.median(timed(replays) for _ in range(samples)) / inner


def bench_products(args: argparse.Namespace, log: list[dict]) -> None:
    import torch

    from tilefuse.runtime.gpu import CudaExecutable, build_gpu_program

    k = n = args.size
    rng = np.random.default_rng(0)
    dev = torch.device("cuda")
    ws = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) / 90 for _ in range(ROTATE)]

    for fmt in args.formats:
        t0 = time.time()
        weights = [random_weight(fmt, k, n, rng) for _ in range(ROTATE)]
        dense0 = torch.from_numpy(dequantize(*weights[0], fmt=fmt, group=128, k=k)).to(dev)
        built = time.time() - t0
        for m in args.ms if fmt == "int4" else args.ms[::max(1, len(args.ms) - 1)]:
            exe = CudaExecutable(build_gpu_program(products_graph(m, k, n, fmt, weights)))
            x = rng.standard_normal((m, k)).astype(BF16.np)
            got = exe(x)[0]
            want = (torch.from_numpy(x.astype(np.float32)).to(dev) @ dense0).cpu().numpy()
            err = float(np.linalg.norm(got.astype(np.float32) - want) / np.linalg.norm(want))
            xt = torch.from_numpy(x.astype(np.float32)).to(dev).to(torch.bfloat16)
            eager = _median_ms(exe.context.time_ms, exe.launch_all, 50, 5) / ROTATE
            ms_tf = graph_ms(exe.context, lambda s, exe=exe: exe.launch_all(s)) / ROTATE
            ms_cb = torch_graph_ms(lambda xt=xt: [xt @ w for w in ws]) / ROTATE
            chosen = next(f[0].name for f in exe._fused.values())
            wbytes = sum(a.nbytes for a in weights[0])
            row = {"fmt": fmt, "m": m, "k": k, "n": n, "tilefuse_us": ms_tf * 1e3,
                   "tilefuse_eager_us": eager * 1e3,
                   "cublas_bf16_us": ms_cb * 1e3, "speedup": ms_cb / ms_tf, "rel_err": err,
                   "weight_gbs": wbytes / ms_tf / 1e6, "kernel": chosen}
            log.append(row)
            print(f"{fmt:5s} M={m:3d}: tilefuse {ms_tf * 1e3:7.1f} us (Python launches "
                  f"{eager * 1e3:.1f}; {row['weight_gbs']:6.0f} GB/s of weights), cuBLAS bf16 "
                  f"{ms_cb * 1e3:7.1f} us, {row['speedup']:.2f}x, rel err {err:.1e} "
                  f"[{chosen}] (weights built in {built:.1f} s)", flush=True)
            if fmt == "int4" and args.sweep:
                sweep(exe.context, m, k, n, weights, x, want, log, ms_cb)
            del exe


SWEEP = [dict(tiles=2, warps=8, loads=2, prefetch=1, stream=True),
         dict(tiles=2, warps=8, loads=2, stream=True), dict(tiles=2, warps=8, loads=2, stages=2),
         dict(tiles=1, warps=16, loads=2, stream=True),
         dict(tiles=2, warps=16, loads=2, nsplit=2, stream=True),
         dict(tiles=2, warps=16, loads=2, stream=True, min_blocks=2),
         dict(tiles=2, warps=16, loads=2, prefetch=1, stream=True, min_blocks=2),
         dict(tiles=2, warps=8, loads=2, prefetch=1, stream=True, min_blocks=3),
         dict(tiles=2, warps=8, loads=2, stream=True, min_blocks=4),
         dict(tiles=2, warps=8, loads=2, prefetch=1, stream=True, min_blocks=4)]
"""Launch configurations of the int4 kernel the sweep times (prefetch: K steps loaded ahead
into registers; stages: the depth of the cp.async ring; stream: codes past L1; nsplit: column
groups a block; min_blocks: a register cap for more warps an SM): the best of the broader
sweeps in benchmarks/gpu_quant-2026-12-03a.json and -03b.json, and 32 warps an SM with two
tiles (the profile of the best showed 14 warps an SM and half its issue slots idle)."""


def sweep_kernels(m: int, k: int, n: int) -> list[Any]:
    """The sweep's kernels for this shape (those :func:`supports` takes), PTX from
    ``$GPU_QUANT_PTX`` when it holds them (compiled ahead on the CPU: ``--ptx-out``)."""
    import os
    from dataclasses import replace

    from tilefuse.codegen.nvptx_qgemm import QGemmConfig, QGemmKernel, qgemm, supports

    cache = Path(os.environ.get("GPU_QUANT_PTX", "/nonexistent"))
    base = QGemmConfig(m, n, k, BF16, "int4")
    found = []
    for knobs in SWEEP:
        cfg = replace(base, **knobs)
        if supports(cfg) is not None or k // cfg.k_step < cfg.warps:
            continue
        saved = cache / f"{cfg.name}.ptx"
        found.append(QGemmKernel(cfg, saved.read_text()) if saved.exists() else qgemm(cfg))
    return found


def sweep(ctx: Any, m: int, k: int, n: int, weights: list[tuple], x: np.ndarray,
          want: np.ndarray, log: list[dict], cublas_ms: float) -> None:
    """Every launch configuration of the int4 kernel at this shape: product 0 checked against
    the exact dequantized product (output poisoned first), then timed as a CUDA graph on the
    rotated weights."""
    ops = [[ctx.upload(np.ascontiguousarray(a)) for a in (x, *w, np.zeros(n, np.float32))]
           for w in weights]
    out = ctx.alloc(m * n * 2)
    wbytes = sum(a.nbytes for a in weights[0])
    found = []
    for kernel in sweep_kernels(m, k, n):
        fn = ctx.load_ptx(kernel.ptx).function(kernel.name)
        out.copy_from(np.full((m, n), np.nan, np.float32).astype(BF16.np))
        ctx.launch(fn, kernel.grid, kernel.block, [b.ptr for b in ops[0]] + [out.ptr])
        got = out.copy_to(np.empty((m, n), BF16.np)).astype(np.float32)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        ok = bool(np.isfinite(got).all()) and err < 4e-3

        def run(stream: Any, fn=fn, kernel=kernel) -> None:
            for o in ops:
                ctx.launch(fn, kernel.grid, kernel.block, [b.ptr for b in o] + [out.ptr],
                           stream=stream)
        us = graph_ms(ctx, run) / len(ops) * 1e3
        tag = kernel.name.rsplit("_", 1)[-1]
        found.append((us, tag, ok))
        log.append({"sweep": kernel.name, "m": m, "k": k, "n": n, "us": us, "rel_err": err,
                    "ok": ok, "weight_gbs": wbytes / us / 1e3,
                    "speedup": cublas_ms * 1e3 / us})
        if not ok:
            print(f"  WRONG {kernel.name}: rel err {err:.2e}", flush=True)
    found.sort()
    print(f"  sweep M={m} {k}x{n}: " + ", ".join(
        f"{tag} {us:.1f}{'' if ok else '(WRONG)'}" for us, tag, ok in found[:8])
        + f" ... slowest {found[-1][1]} {found[-1][0]:.1f}", flush=True)


def sweep_shapes(args: argparse.Namespace, log: list[dict]) -> None:
    """The decode step's product shapes at M = 1 (q/k/v/o 4096², gate/up 4096x11008, down
    11008x4096): each configuration timed against cuBLAS bf16."""
    import torch

    from tilefuse.runtime.cuda_driver import CudaContext

    ctx = CudaContext()
    rng = np.random.default_rng(1)
    dev = torch.device("cuda")
    for k, n in ((4096, 4096), (4096, 11008), (11008, 4096)):
        rot = 8   # one weight in 8 buffers (> 50 MB: not served from the L2)
        weights = [random_weight("int4", k, n, rng)] * rot
        dense0 = torch.from_numpy(dequantize(*weights[0], fmt="int4", group=128, k=k)).to(dev)
        x = rng.standard_normal((1, k)).astype(BF16.np)
        want = (torch.from_numpy(x.astype(np.float32)).to(dev) @ dense0).cpu().numpy()
        xt = torch.from_numpy(x.astype(np.float32)).to(dev).to(torch.bfloat16)
        ws = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) for _ in range(rot)]
        ms_cb = torch_graph_ms(lambda xt=xt, ws=ws: [xt @ w for w in ws]) / rot
        print(f"shape {k}x{n} M=1: cuBLAS bf16 {ms_cb * 1e3:.1f} us", flush=True)
        sweep(ctx, 1, k, n, weights, x, want, log, ms_cb)
        del ws


def bench_decode(args: argparse.Namespace, log: list[dict]) -> None:
    import torch

    from tilefuse.passes.manager import run_pipeline
    from tilefuse.passes.pipeline import GRAPH_PIPELINE
    from tilefuse.passes.quantize import for_target, parse_quantize, pipeline_for
    from tilefuse.runtime.gpu import CudaExecutable, FusedStep, HostGroup, build_gpu_program

    hidden, heads, inter, cache = args.decode
    graph = decode_graph(hidden, heads, inter, cache)
    dev = torch.device("cuda")
    ins = [torch.randn(*v.shape, device=dev, dtype=torch.bfloat16) for v in graph.inputs]
    import tilefuse.kernel.lower_gpu_qmatmul as lowering

    times, outs = {}, {}
    int4 = for_target(pipeline_for(parse_quantize("int4")), "cuda")
    runs = [("bf16", GRAPH_PIPELINE, None), ("int4", int4, None)]
    runs += [(f"int4 wide={knobs}", int4, knobs) for knobs in args.decode_wide]
    default_wide = lowering.INT4_WIDE
    for name, pipeline, wide in runs:
        t0 = time.time()
        # an experiment: other knobs first for the int4 products of N >= 8192 (gate, up)
        lowering.INT4_WIDE = default_wide if wide is None else (wide, *default_wide)
        try:
            program = build_gpu_program(run_pipeline(graph, pipeline)[0])
        finally:
            lowering.INT4_WIDE = default_wide
        hosted = sum(isinstance(s, HostGroup) for s in program.steps)
        fused = sum(isinstance(s, FusedStep) for s in program.steps)
        exe = CudaExecutable(program)
        res = [torch.empty(*v.shape, device=dev, dtype=torch.bfloat16)
               for v in exe.graph.outputs]

        def run(exe=exe, res=res) -> None:
            exe.run_device([t.data_ptr() for t in ins], [t.data_ptr() for t in res])
        run()
        run()   # the second call replays the captured graph
        torch.cuda.synchronize()
        times[name] = _median_ms(exe.context.time_ms, run, 50, 5)
        outs[name] = res[0].float().cpu().numpy()
        print(f"decode {name}: {times[name] * 1e3:.1f} us a step ({len(program.steps)} steps, "
              f"{fused} fused, {hosted} on the host, CUDA graph "
              f"{exe.graph_nodes} nodes; built in {time.time() - t0:.1f} s)", flush=True)
        del exe
    for name in times:
        if name.startswith("int4 wide"):
            log.append({"decode_variant": name, "us": times[name] * 1e3,
                        "speedup": times["bf16"] / times[name]})
            print(f"decode {name}: {times['bf16'] / times[name]:.2f}x", flush=True)
    err = float(np.linalg.norm(outs["int4"] - outs["bf16"]) / np.linalg.norm(outs["bf16"]))
    cos = float(np.dot(outs["int4"].ravel(), outs["bf16"].ravel()) / (
        np.linalg.norm(outs["int4"]) * np.linalg.norm(outs["bf16"])))
    log.append({"decode_bf16_us": times["bf16"] * 1e3, "decode_int4_us": times["int4"] * 1e3,
                "speedup": times["bf16"] / times["int4"], "rel_diff": err, "cosine": cos})
    print(f"decode int4 vs bf16: {times['bf16'] / times['int4']:.2f}x faster, output "
          f"rel diff {err:.2e}, cosine {cos:.5f}", flush=True)


def dry() -> None:
    """Every program built at small sizes without a GPU."""
    from tilefuse.passes.manager import run_pipeline
    from tilefuse.passes.quantize import for_target, parse_quantize, pipeline_for
    from tilefuse.runtime.gpu import HostGroup, build_gpu_program

    rng = np.random.default_rng(0)
    for fmt in ("int4", "int8", "fp8"):
        weights = [random_weight(fmt, 256, 128, rng) for _ in range(2)]
        assert weights[0][0].shape == (8, BYTES_PER_K[fmt] * 256)
        program = build_gpu_program(products_graph(4, 256, 128, fmt, weights))
        assert not any(isinstance(s, HostGroup) for s in program.steps)
    graph = decode_graph(256, 2, 384, 16)
    pipeline = for_target(pipeline_for(parse_quantize("int4")), "cuda")
    program = build_gpu_program(run_pipeline(graph, pipeline)[0])
    print(program.partition_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="M = 1 and 16, int4 only")
    parser.add_argument("--formats", default="int4,int8,fp8")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dry", action="store_true")
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--no-decode", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="time every int4 launch config")
    parser.add_argument("--shapes", action="store_true",
                        help="sweep the decode step's product shapes too")
    parser.add_argument("--ptx-out", type=Path, help="write the sweep's PTX there and stop")
    parser.add_argument("--ms", default="1,4,16")
    parser.add_argument("--decode-wide", action="append", default=[],
                        help="int4 knobs tried first for the decode step's wide products, "
                             "e.g. tiles=2,warps=8,loads=2,stream=1,min_blocks=4")
    args = parser.parse_args()
    if args.dry:
        dry()
        return
    if args.ptx_out:
        args.ptx_out.mkdir(parents=True, exist_ok=True)
        shapes = [(m, 8192, 8192) for m in (1, 4, 16)]
        shapes += [(1, 4096, 4096), (1, 4096, 11008), (1, 11008, 4096)]
        for m, k, n in shapes:
            for kernel in sweep_kernels(m, k, n):
                (args.ptx_out / f"{kernel.name}.ptx").write_text(kernel.ptx)
        return
    args.ms = (1, 16) if args.quick else tuple(int(v) for v in args.ms.split(","))
    args.decode_wide = [{k: int(v) for k, v in (kv.split("=") for kv in spec.split(","))}
                        for spec in args.decode_wide]
    args.formats = ("int4",) if args.quick else tuple(args.formats.split(","))
    args.decode = (4096, 32, 11008, 512)
    log: list[dict] = []
    formats = args.formats
    try:
        args.formats = formats[:1]   # the first format, the decode step, then the others
        bench_products(args, log)
        if args.shapes:
            sweep_shapes(args, log)
        if not args.no_decode:
            bench_decode(args, log)
        args.formats = formats[1:]
        bench_products(args, log)
    finally:
        if args.json:
            args.json.write_text(json.dumps(log, indent=1))


if __name__ == "__main__":
    main()
