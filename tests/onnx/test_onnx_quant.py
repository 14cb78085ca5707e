"""Linear quantization ops against onnxruntime on fresh random inputs: per-tensor, per-axis
and blocked scales, u8/i8 (and i16) types, rounding half to even and saturation; the dynamic
quantizer; the integer and QLinear products at odd sizes."""

from __future__ import annotations

import numpy as np
import pytest
from onnxcheck import arr, single

rng = np.random.default_rng(13)

EXACT = "spec"
"""The integer products are checked against the ONNX spec's reference evaluator: onnxruntime's
u8 kernels on AVX2 hosts without VNNI (AMD EPYC znver3 here) are not exact (MatMulInteger of a
1x7 u8 row and a 7x1 s8 column: -9976 where the exact sum, NumPy's and the spec's, is -17600;
likely its pairwise 16-bit multiply-adds saturating)."""


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_quantize_dequantize_per_tensor(dtype) -> None:
    x = arr([7, 5], low=-300, high=300)
    x[0, :3] = [0.5, 1.5, -2.5]  # halves: to even
    zero = np.array(3 if dtype is not np.uint8 else 128, dtype)
    single("QuantizeLinear", {"x": x}, consts={"s": np.array(0.7, np.float32), "z": zero},
           opset=21)
    q = rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, size=(7, 5)).astype(dtype)
    single("DequantizeLinear", {"q": q}, consts={"s": np.array(0.03, np.float32), "z": zero},
           opset=21)


def test_per_axis_and_blocked() -> None:
    x = arr([4, 6, 3], low=-10, high=10)
    scale = arr([6], low=0.05, high=0.2)
    zero = rng.integers(-5, 5, size=6).astype(np.int8)
    single("QuantizeLinear", {"x": x}, consts={"s": scale, "z": zero}, opset=21, axis=1)
    q = rng.integers(-128, 127, size=(4, 6, 3)).astype(np.int8)
    single("DequantizeLinear", {"q": q}, consts={"s": scale, "z": zero}, opset=21, axis=1)
    blocked = arr([4, 2, 3], low=0.05, high=0.2)  # blocks of 4 along axis 1 (6 -> 2 blocks)
    single("DequantizeLinear", {"q": q}, consts={"s": blocked}, opset=21, axis=1, block_size=4)
    single("QuantizeLinear", {"x": x}, consts={"s": blocked,
                                               "z": np.zeros((4, 2, 3), np.uint8) + 7},
           opset=21, axis=1, block_size=4)


@pytest.mark.parametrize("shape", [(1,), (7, 3), (2, 513)])
def test_dynamic_quantize_linear(shape: tuple[int, ...]) -> None:
    single("DynamicQuantizeLinear", {"x": arr(list(shape), low=-3, high=5)}, 3, opset=11)


@pytest.mark.parametrize(("m", "k", "n"), [(1, 7, 1), (5, 33, 3), (2, 9, 17)])
def test_integer_products(m: int, k: int, n: int) -> None:
    a = rng.integers(0, 255, size=(m, k)).astype(np.uint8)
    b = rng.integers(-128, 127, size=(k, n)).astype(np.int8)
    single("MatMulInteger", {"a": a, "b": b}, oracle=EXACT,
           consts={"az": np.array(11, np.uint8), "bz": np.array(-3, np.int8)}, opset=10)
    single("QLinearMatMul", {"a": a}, opset=10, oracle=EXACT, consts={
        "as": np.array(0.02, np.float32), "az": np.array(128, np.uint8),
        "b": rng.integers(0, 255, size=(k, n)).astype(np.uint8),
        "bs": np.array(0.01, np.float32), "bz": np.array(120, np.uint8),
        "ys": np.array(0.05, np.float32), "yz": np.array(100, np.uint8)})


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 2, 1, 0]])
def test_integer_convolutions(pads: list[int]) -> None:
    x = rng.integers(0, 255, size=(1, 3, 7, 6)).astype(np.uint8)
    w = rng.integers(0, 255, size=(4, 3, 3, 2)).astype(np.uint8)
    single("ConvInteger", {"x": x}, oracle=EXACT, consts={"w": w, "xz": np.array(100, np.uint8),
                                            "wz": np.array(110, np.uint8)}, opset=10,
           pads=pads, strides=[1, 2])
    single("QLinearConv", {"x": x}, opset=10, pads=pads, oracle=EXACT, consts={
        "xs": np.array(0.02, np.float32), "xz": np.array(100, np.uint8),
        "w": rng.integers(-128, 127, size=(4, 3, 3, 2)).astype(np.int8),
        "ws": arr([4], low=0.005, high=0.02), "wz": np.zeros(4, np.int8),
        "ys": np.array(0.1, np.float32), "yz": np.array(90, np.uint8),
        "b": rng.integers(-500, 500, size=4).astype(np.int32)})
