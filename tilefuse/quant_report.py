"""How far a quantized model is from its f32 self: :func:`quantization_error`.

Quantization trades accuracy for speed and memory, so a quantized build should come with a
figure: this compares the outputs of the f32 and the quantized build on given (or seeded random)
inputs and reports the max and mean relative error (relative to the largest |f32| value of each
output, so near-zero elements do not blow it up) and the cosine similarity.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilefuse.errors import TilefuseError


@dataclass(frozen=True)
class QuantError:
    """Error of one output: ``max_rel`` and ``mean_rel`` are |q - f| / max|f|; ``cosine`` is
    the cosine similarity of the flattened outputs (1.0 for identical ones)."""

    max_rel: float
    mean_rel: float
    cosine: float

    def __str__(self) -> str:
        return (f"max rel err {self.max_rel:.3g}, mean rel err {self.mean_rel:.3g}, "
                f"cosine {self.cosine:.6f}")


def compare_outputs(reference: Any, quantized: Any) -> QuantError:
    """The error of ``quantized`` against ``reference`` (arrays of one shape)."""
    f = np.asarray(reference, np.float64).ravel()
    q = np.asarray(quantized, np.float64).ravel()
    if f.shape != q.shape:
        raise TilefuseError(f"outputs differ in size: {f.size} vs {q.size} elements")
    scale = float(np.max(np.abs(f))) if f.size else 0.0
    diff = np.abs(q - f) / (scale if scale > 0 else 1.0)
    norm = float(np.linalg.norm(f) * np.linalg.norm(q))
    cosine = float(np.dot(f, q) / norm) if norm > 0 else float(np.array_equal(f, q))
    return QuantError(float(diff.max(initial=0.0)), float(diff.mean()) if diff.size else 0.0,
                      cosine)


def quantization_error(fn: Callable[..., Any], *args: Any, quantize: str = "int8",
                       inputs: Sequence[Sequence[np.ndarray]] | None = None, samples: int = 3,
                       seed: int = 0) -> list[QuantError]:
    """Compiles ``fn`` (a NumPy function for :func:`tilefuse.jit`) in f32 and with ``quantize``
    and compares their outputs: on ``inputs`` (a list of argument tuples) when given, else on
    ``samples`` random draws shaped like ``args`` (standard normal floats; integer arguments
    are passed as given). Returns one :class:`QuantError` per output, over all samples."""
    import tilefuse

    f32, quant = tilefuse.jit(fn), tilefuse.jit(fn, quantize=quantize)
    if inputs is None:
        rng = np.random.default_rng(seed)
        inputs = [tuple(rng.standard_normal(a.shape).astype(a.dtype)
                        if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
                        for a in args) for _ in range(samples)]
    refs: list[list[np.ndarray]] = []
    outs: list[list[np.ndarray]] = []
    for call in inputs:
        r, q = f32(*call), quant(*call)
        refs.append(list(r) if isinstance(r, (tuple, list)) else [r])
        outs.append(list(q) if isinstance(q, (tuple, list)) else [q])
    return [compare_outputs(np.concatenate([np.ravel(r[i]) for r in refs]),
                            np.concatenate([np.ravel(o[i]) for o in outs]))
            for i in range(len(refs[0]))]


__all__ = ["QuantError", "compare_outputs", "quantization_error"]
