"""The quantize pass and the ``quantize`` option of every entry point: which products become
quantized ops (bias and relu absorbed), the native build against the reference interpreter
(bit for bit for int8) and against f32 (cosine similarity), convolutions, symbolic batch
dims, torch.compile, tilefuse.onnx.load, the CLI, and the error report."""

from __future__ import annotations

import numpy as np
import pytest

import tilefuse
from tilefuse.codegen.target import host_target
from tilefuse.passes.quantize import (
    QuantizeError,
    QuantizeOptions,
    parse_quantize,
    quantization_summary,
    quantize_int4,
    quantize_int8,
)
from tilefuse.quant_report import compare_outputs, quantization_error

native = pytest.mark.skipif(not host_target().has("avx512vnni"),
                            reason="the quantized kernels need AVX-512 VNNI")
rng = np.random.default_rng(290)


def _ops(jitted: tilefuse.JitFunction, *args: np.ndarray) -> list[str]:
    return [n.op.name for n in jitted.lower(*args).optimized.nodes if n.op.name != "constant"]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return compare_outputs(a, b).cosine


def test_parse_quantize() -> None:
    assert parse_quantize(None) is None and parse_quantize("none") is None
    assert parse_quantize("int8") == QuantizeOptions("int8")
    assert parse_quantize("INT4:64+zp") == QuantizeOptions("int4", 64, True)
    assert str(parse_quantize("int4")) == "int4:128"
    for bad in ("int3", "int4:48", "int8:32", "int4:x", 8):
        with pytest.raises(QuantizeError):
            parse_quantize(bad)  # type: ignore[arg-type]


def test_weight_quantizers_round_trip() -> None:
    w = rng.standard_normal((256, 40)).astype(np.float32)
    q, s = quantize_int8(w)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert np.abs(q * s - w).max() <= s.max() / 2 + 1e-6
    for zp in (False, True):
        packed, scales, zeros = quantize_int4(w, 64, zp)
        from tilefuse.ops.quant import dequantize_w4
        err = np.abs(dequantize_w4(packed, scales, zeros, 64) - w)
        assert err.max() <= np.repeat(scales, 64, axis=0).max() * 0.5 + 1e-5
        assert packed.shape == (128, 40) and scales.shape == zeros.shape == (4, 40)


W = (rng.standard_normal((96, 130)) * 0.1).astype(np.float32)
B = rng.standard_normal(130).astype(np.float32)


def ffn(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W + B, 0)


@native
@pytest.mark.parametrize("mode", ["int8", "int4:32", "int4:32+zp"])
def test_jit_absorbs_bias_and_relu_and_runs_natively(mode: str) -> None:
    x = rng.standard_normal((7, 96)).astype(np.float32)
    q = tilefuse.jit(ffn, quantize=mode)
    op = "qmatmul_i8" if mode == "int8" else "matmul_w4"
    assert _ops(q, x) == [op]
    out = q(x)
    assert q.lower(x).executable.fallbacks == []
    ref = tilefuse.jit(ffn, quantize=mode, target="reference")(x)
    if mode == "int8":
        np.testing.assert_array_equal(out, ref)     # same integer arithmetic, same roundings
    else:
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    assert _cosine(ffn(x), out) > (0.999 if mode == "int8" else 0.99)
    assert (out >= 0).all()


def test_products_that_stay_f32() -> None:
    small = rng.standard_normal((8, 8)).astype(np.float32)
    x = rng.standard_normal((4, 96)).astype(np.float32)
    y = rng.standard_normal((96, 130)).astype(np.float32)
    fn = tilefuse.jit(lambda x, y: (x @ y) + (x[:, :8] @ small).sum(), quantize="int8")
    assert "qmatmul_i8" not in _ops(fn, x, y)           # a runtime weight, a tiny one
    odd = (rng.standard_normal((100, 64))).astype(np.float32)
    fn4 = tilefuse.jit(lambda x: x @ odd, quantize="int4")
    assert _ops(fn4, rng.standard_normal((2, 100)).astype(np.float32)) == ["matmul"]


@native
def test_bias_read_twice_is_not_absorbed() -> None:
    x = rng.standard_normal((5, 96)).astype(np.float32)

    def fn(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = x @ W
        return y + B, np.tanh(y)

    q = tilefuse.jit(fn, quantize="int8")
    assert _ops(q, x).count("qmatmul_i8") == 1 and "add" in _ops(q, x)
    a, b = q(x)
    ra, rb = tilefuse.jit(fn, quantize="int8", target="reference")(x)
    np.testing.assert_array_equal(a, ra)
    np.testing.assert_allclose(b, rb, rtol=1e-5, atol=1e-6)  # tanh: generated vs NumPy


@native
def test_convolution_is_quantized() -> None:
    import torch

    conv = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU()).eval()
    x = torch.randn(1, 16, 12, 12)
    compiled = torch.compile(conv, backend="tilefuse", options={"quantize": "int8"})
    with torch.no_grad():
        ref, out = conv(x), compiled(x)
    assert _cosine(ref.numpy(), out.numpy()) > 0.999


@native
def test_symbolic_batch() -> None:
    q = tilefuse.jit(ffn, quantize="int8", dynamic={"x": {0: "batch"}})
    ref = tilefuse.jit(ffn, quantize="int8", target="reference")
    for m in (3, 17, 1):
        x = rng.standard_normal((m, 96)).astype(np.float32)
        np.testing.assert_array_equal(q(x), ref(x))


@native
def test_torch_compile_option() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64)).eval()
    x = torch.randn(9, 64)
    compiled = torch.compile(model, backend="tilefuse", options={"quantize": "int4:64"})
    with torch.no_grad():
        ref, out = model(x), compiled(x)
    assert _cosine(ref.numpy(), out.numpy()) > 0.99
    with pytest.raises(Exception, match="quantize"):
        bad = torch.compile(model, backend="tilefuse", options={"quantize": "int2"})
        with torch.no_grad():
            bad(x)


@native
def test_onnx_load_option(tmp_path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = (rng.standard_normal((64, 80)) * 0.2).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 80])],
        [numpy_helper.from_array(w, "w")])
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    from tilefuse import onnx as tf_onnx

    model = tf_onnx.load(str(path), quantize="int8")
    lowered = model.lower(x)
    assert quantization_summary(lowered.optimized).kernels == 1
    assert _cosine(x @ w, model(x)) > 0.999


def test_summary_and_error_report() -> None:
    x = rng.standard_normal((4, 96)).astype(np.float32)
    graph = tilefuse.jit(ffn, quantize="int4:32").lower(x).optimized
    summary = quantization_summary(graph)
    assert summary.kernels == 1 and summary.f32_bytes == W.nbytes
    assert summary.quantized_bytes == W.size // 2 + (96 // 32) * 130 * 5
    assert "saved" in str(summary)
    (err,) = quantization_error(ffn, x, quantize="int8", samples=2)
    assert err.cosine > 0.999 and 0 < err.mean_rel <= err.max_rel < 0.05
    same = compare_outputs(np.ones(3), np.ones(3))
    assert same.cosine == pytest.approx(1.0) and same.max_rel == 0.0


def gelu_ffn(x: np.ndarray) -> np.ndarray:
    import scipy.special

    h = x @ W + B
    return 0.5 * h * (1 + scipy.special.erf(h / np.sqrt(np.float32(2))))


@native
@pytest.mark.parametrize("mode", ["int8", "int4:32"])
def test_gelu_is_absorbed(mode: str) -> None:
    x = rng.standard_normal((11, 96)).astype(np.float32)
    q = tilefuse.jit(gelu_ffn, quantize=mode)
    low = q.lower(x)
    (node,) = [n for n in low.optimized.nodes if n.op.name != "constant"]
    assert node.attrs["act"] == "gelu"
    ref = tilefuse.jit(gelu_ffn, quantize=mode, target="reference")(x)
    np.testing.assert_allclose(q(x), ref, rtol=1e-5, atol=1e-5)
    assert _cosine(gelu_ffn(x), q(x)) > (0.999 if mode == "int8" else 0.99)


def test_gelu_read_elsewhere_is_not_absorbed() -> None:
    import scipy.special

    def fn(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = x @ W + B
        return 0.5 * h * (1 + scipy.special.erf(h / np.sqrt(np.float32(2)))), h

    x = rng.standard_normal((3, 96)).astype(np.float32)
    ops = _ops(tilefuse.jit(fn, quantize="int8"), x)
    assert "erf" in ops and "qmatmul_i8" in ops


@native
def test_quantized_kernels_go_through_the_disk_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEFUSE_CACHE", raising=False)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    stats = []
    for _ in range(2):
        fn = tilefuse.jit(ffn, quantize="int4:32")
        out = fn(x)
        stats.append(fn.lower(x).executable.cache_stats)
    assert (stats[0].misses, stats[0].stored) == (1, 1)
    assert (stats[1].hits, stats[1].misses) == (1, 0)
    np.testing.assert_allclose(out, tilefuse.jit(ffn, quantize="int4:32", target="reference")(x),
                               rtol=1e-4, atol=1e-4)


@native
def test_compile_exported_option() -> None:
    import torch

    from tilefuse.torch import compile_exported

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU()).eval()
    x = torch.randn(5, 64)
    compiled = compile_exported(torch.export.export(model, (x,)), quantize="int8")
    with torch.no_grad():
        ref = model(x)
    out = compiled(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert _cosine(ref.numpy(), out.numpy()) > 0.999
    assert not torch.equal(ref, out)   # quantized, not the f32 product


@native
def test_quantized_build_saves_and_loads(tmp_path) -> None:
    x = rng.standard_normal((6, 96)).astype(np.float32)
    fn = tilefuse.jit(gelu_ffn, quantize="int8")
    want = fn(x)
    tilefuse.save(fn, tmp_path / "q.tilefuse")
    got = tilefuse.load(tmp_path / "q.tilefuse")(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_array_equal(got, want)
