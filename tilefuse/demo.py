"""The main job: compile the seed example ``gelu(x @ w + b)`` and show what happened at each stage.

Run with ``python -m tilefuse.demo [--dump DIR]`` (``bash scripts/demo.sh`` sets up first).
"""

from __future__ import annotations

import argparse
import inspect
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.special

import tilefuse
from tilefuse.testing import assert_close


def ffn(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The seed example: a linear layer followed by the exact (erf) GELU."""
    y = x @ w + b
    return 0.5 * y * (1.0 + scipy.special.erf(y / math.sqrt(2.0)))


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 72 - len(title)))


def _cache_hit_overhead_us(calls: int = 2000) -> float:
    """Median cost of a cache hit (key, guards, dispatch, output packing) on a tiny function,
    measured as the jitted call's time minus the executable's own time."""
    jitted = tilefuse.jit(lambda a: a + 1.0, target="reference")
    a = np.ones(4, np.float32)
    jitted(a)
    executable = jitted.lower(a).executable
    assert executable is not None
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter_ns()
        jitted(a)
        t1 = time.perf_counter_ns()
        executable(a)
        t2 = time.perf_counter_ns()
        samples.append((t1 - t0) - (t2 - t1))
    return float(np.median(samples)) / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dump", type=Path, default=None,
                        help="directory for the stage dumps (default: a temporary directory)")
    args = parser.parse_args(argv)
    if args.dump is not None:
        return _run(args.dump)
    with tempfile.TemporaryDirectory(prefix="tilefuse-demo-") as folder:  # removed afterwards
        return _run(Path(folder))


def _run(dump_dir: Path) -> int:
    """The demo, dumping into ``dump_dir``."""

    _section("1. the NumPy function")
    print(inspect.getsource(ffn))

    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 768), dtype=np.float32)
    w = rng.standard_normal((768, 3072), dtype=np.float32) / np.float32(np.sqrt(768))
    b = rng.standard_normal(3072, dtype=np.float32)
    jitted = tilefuse.jit(ffn, dump=dump_dir)

    t0 = time.perf_counter()
    out = jitted(x, w, b)
    first_call = time.perf_counter() - t0
    lowered = jitted.lower(x, w, b)

    _section("2. captured graph (tracer)")
    print(lowered.captured)
    _section("3. graph passes (name, changed, nodes before -> after, time)")
    print(lowered.report)
    _section("4. optimised graph")
    print(lowered.optimized)
    _section(f"5. dump files in {dump_dir}")
    for path in sorted(dump_dir.rglob("*")):
        if path.is_file():
            print(f"  {path.relative_to(dump_dir)}  ({path.stat().st_size} bytes)")

    plan = dump_dir / "kernels.plan"
    if plan.exists():
        _section("6. fused kernels (kernels.plan)")
        print(plan.read_text())
        loop = dump_dir / "kernels" / "k0.loop"
        asm = dump_dir / "kernels" / "k0.s"
        if loop.exists():
            _section("7. loop IR of k0 (first 24 lines of kernels/k0.loop)")
            print("\n".join(loop.read_text().splitlines()[:24]))
        if asm.exists():
            text = asm.read_text()
            _section("8. machine code of k0 (kernels/k0.s)")
            print(f"{text.count('vfmadd')} FMA instructions, "
                  f"{'zmm (AVX-512)' if 'zmm' in text else 'no zmm'} registers, "
                  f"{len(text.splitlines())} lines of assembly")

    _section("9. result against NumPy")
    expected = ffn(x, w, b)
    assert_close(out, expected, reduction=True, msg="gelu(x @ w + b)")
    err = float(np.max(np.abs(out.astype(np.float64) - expected)))
    print(f"output {out.dtype}{list(out.shape)}, max abs difference {err:.3g}: equal within the "
          "f32 contraction tolerance")

    _section("10. calls")
    t0 = time.perf_counter()
    jitted(x, w, b)
    second_call = time.perf_counter() - t0
    print(f"first call (trace + passes + build + run): {first_call * 1e3:.1f} ms")
    print(f"second call (cache hit + run):             {second_call * 1e3:.1f} ms")
    print(f"cache: {jitted.cache_info()}")
    print(f"cache-hit overhead (guards + dispatch), median: {_cache_hit_overhead_us():.2f} us")
    print(f"tilefuse {tilefuse.__version__}, target 'cpu': native x86-64 code through LLVM")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
