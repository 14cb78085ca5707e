"""Sizes and the NumPy reference of the command-line tests' small model."""

from __future__ import annotations

import numpy as np

M, K, N = 7, 13, 5  # odd sizes


def reference(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the small ONNX model computes: relu(x @ w + b)."""
    return np.maximum(x @ w + b, 0.0)
