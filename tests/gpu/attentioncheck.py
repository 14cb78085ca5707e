"""What the fused GPU attention tests (mma.sync and wgmma kernels) share: ``ptxas`` on a
kernel's PTX, the attention graph, the named cases with their random inputs and graphs, and the
float64 NumPy reference."""

from __future__ import annotations

import math
import subprocess

import numpy as np

from tilefuse.dtypes import DType
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.ir import Graph

BF16, F16 = DType.bf16, DType.f16


def assemble(ptx: str, tmp_path, arch: str) -> str:  # type: ignore[no-untyped-def]
    """``ptxas -arch=<arch> -v`` on ``ptx`` (which must assemble); its report."""
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    done = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(path), "-o",
                           str(tmp_path / "k.cubin")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr


def attention_graph(batch: tuple[int, ...], sq: int, sk: int, d: int, dv: int, dtype: DType,
                    scale: float, mask: tuple[int, ...] | None = None) -> Graph:
    b = GraphBuilder("attention")
    q = b.input(((*batch, sq, d), dtype), "q")
    k = b.input(((*batch, sk, d), dtype), "k")
    v = b.input(((*batch, sk, dv), dtype), "v")
    operands = [q, k, v] + ([b.input((mask, dtype), "mask")] if mask is not None else [])
    return b.build([b.add1("attention", operands, {"scale": scale})])


def reference(q, k, v, mask, scale):  # type: ignore[no-untyped-def]
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        s = s + mask
    s = s - s.max(axis=-1, keepdims=True)
    e = np.exp(s)
    return np.matmul(e / e.sum(axis=-1, keepdims=True), v)


def case_reference(arrays: list[np.ndarray], scale: float) -> np.ndarray:
    """:func:`reference` in float64 of ``(q, k, v[, mask])``."""
    return reference(*[a.astype(np.float64) for a in arrays[:3]],
                     arrays[3].astype(np.float64) if len(arrays) > 3 else None, scale)


def random_input(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> np.ndarray:
    return rng.standard_normal(shape, np.float32).astype(dtype.np)


CASES = {
    "seq7": ((1, 1), 7, 7, 64, 64, BF16, None),
    "seq513": ((2, 3), 513, 513, 64, 64, BF16, None),
    "sq_ne_sk": ((2, 2), 200, 1000, 64, 64, BF16, None),
    "f16_dv48_negative_scale": ((2, 2), 100, 70, 32, 48, F16, None),
    "d128": ((1, 2), 130, 200, 128, 128, BF16, None),
    "mask_full": ((2, 2), 64, 96, 64, 64, BF16, (2, 1, 64, 96)),
    "mask_padding_odd_keys": ((2, 2), 70, 97, 64, 64, BF16, (2, 1, 1, 97)),
    "mask_causal": ((1, 2), 300, 300, 64, 64, BF16, "causal"),
    "mask_causal_whole_tiles": ((2, 3), 384, 384, 64, 64, BF16, "causal"),
    "mask_causal_d128": ((1, 4), 256, 256, 128, 128, BF16, "causal"),
}
"""name → (batch, Sq, Sk, D, Dv, dtype, mask: None, its shape or "causal")."""


def case_scale(name: str) -> float:
    """-0.3 for the negative-scale case, else 1/√D."""
    return -0.3 if "negative" in name else 1 / math.sqrt(CASES[name][3])


def case_graph(name: str, dtype: DType | None = None) -> Graph:
    """The attention graph of case ``name`` (in ``dtype`` instead of its own where given),
    scaled by :func:`case_scale`; a causal mask is an [Sq, Sk] input."""
    batch, sq, sk, d, dv, own, mask = CASES[name]
    shape = None if mask is None else ((sq, sk) if mask == "causal" else mask)
    return attention_graph(batch, sq, sk, d, dv, dtype or own, case_scale(name), shape)


def case_arrays(name: str, seed: int, dtype: DType | None = None) -> list[np.ndarray]:
    """Fresh random ``q, k, v[, mask]`` of case ``name`` (in ``dtype`` where given)."""
    batch, sq, sk, d, dv, own, mask = CASES[name]
    dtype = dtype or own
    rng = np.random.default_rng(seed)
    arrays = [random_input(rng, (*batch, sq, d), dtype), random_input(rng, (*batch, sk, d), dtype),
              random_input(rng, (*batch, sk, dv), dtype)]
    if mask == "causal":
        arrays.append(np.where(np.tril(np.ones((sq, sk), bool)), 0.0, -np.inf).astype(dtype.np))
    elif mask is not None:
        arrays.append((2 * rng.standard_normal(mask, np.float32)).astype(dtype.np))
    return arrays
