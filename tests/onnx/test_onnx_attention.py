"""ONNX Attention (opset 23/24) against onnx's reference implementation (the spec) on fresh
random inputs at odd sizes: 3-D and 4-D inputs, grouped-query heads, past/present caches, bool
and float masks shorter than the keys, causal with and without a cache, softcap, every
qk_matmul_output mode, nonpad_kv_seqlen and fully masked rows; and that the core becomes the
fused attention op."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from onnxcheck import arr

import tilefuse.onnx
from tilefuse.onnx.tensors import OnnxError
from tilefuse.testing import assert_close

F32, BOOL, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
_TYPES = {np.dtype(np.float32): F32, np.dtype(bool): BOOL, np.dtype(np.int64): I64}
_SLOTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")


def _model(feeds: dict[str, np.ndarray], n_out: int, opset: int, **attrs: Any) -> Any:
    names = [n if n in feeds else "" for n in _SLOTS]
    while names and not names[-1]:
        names.pop()
    outs = ["Y", "present_key", "present_value", "qk"][:n_out]
    node = helper.make_node("Attention", names, outs, **attrs)
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info(n, _TYPES[a.dtype], a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, F32, None) for n in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def check(feeds: dict[str, np.ndarray], n_out: int = 1, opset: int = 23, **attrs: Any):
    model = _model(feeds, n_out, opset, **attrs)
    expected = ReferenceEvaluator(model).run(None, feeds)
    compiled = tilefuse.onnx.load(model)
    got = compiled.run(None, feeds)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_close(g, e.astype(g.dtype), reduction=True, msg=f"output {i}")
    return compiled, feeds


def _qkv(b: int, hq: int, hk: int, sq: int, sk: int, d: int, dv: int | None = None) -> dict:
    return {"Q": arr([b, hq, sq, d]), "K": arr([b, hk, sk, d]), "V": arr([b, hk, sk, dv or d])}


@pytest.mark.parametrize(("sq", "sk"), [(1, 1), (7, 7), (5, 13)])
def test_4d_plain_and_causal_is_fused(sq: int, sk: int) -> None:
    compiled, feeds = check(_qkv(2, 3, 3, sq, sk, 8))
    assert "attention(" in str(compiled.lower(*feeds.values()).optimized)
    check(_qkv(1, 2, 2, sq, sk, 4), is_causal=1)


def test_3d_gqa_with_past_and_present_and_scale() -> None:
    feeds = {"Q": arr([2, 5, 4 * 6]), "K": arr([2, 5, 2 * 6]), "V": arr([2, 5, 2 * 3]),
             "past_key": arr([2, 2, 3, 6]), "past_value": arr([2, 2, 3, 3])}
    check(feeds, n_out=3, q_num_heads=4, kv_num_heads=2, scale=0.3)
    check(feeds, n_out=3, q_num_heads=4, kv_num_heads=2, is_causal=1)


@pytest.mark.parametrize("mask", [
    np.random.default_rng(1).random((7, 9)) < 0.7,          # bool, every key
    np.random.default_rng(2).random((1, 3, 7, 6)) < 0.7,    # bool, shorter: padded as masked
    np.random.default_rng(3).uniform(-2, 0, (2, 1, 7, 9)).astype(np.float32)])
def test_masks(mask: np.ndarray) -> None:
    check({**_qkv(2, 3, 3, 7, 9, 4), "attn_mask": mask})
    check({**_qkv(2, 3, 3, 7, 9, 4), "attn_mask": mask}, is_causal=1)


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_softcap_and_qk_output_modes(mode: int) -> None:
    feeds = {**_qkv(1, 2, 2, 5, 6, 4), "attn_mask": arr([5, 6], low=-1, high=1)}
    check(feeds, n_out=4, softcap=1.5, qk_matmul_output_mode=mode)


def test_mode_0_is_the_raw_product_even_with_softcap() -> None:
    """The spec's mode 0 is the raw q·kᵀ·scale (onnx's reference returns the softcapped value
    there, which its own attribute documentation contradicts; tilefuse follows the spec)."""
    feeds = _qkv(1, 2, 2, 5, 6, 4)
    check(feeds, n_out=4, qk_matmul_output_mode=0)
    compiled = tilefuse.onnx.load(_model(feeds, 4, 23, softcap=1.5))
    qk = compiled.run(None, feeds)[3]
    raw = feeds["Q"] @ np.swapaxes(feeds["K"], -1, -2) / np.float32(2.0)
    assert_close(qk, raw, reduction=True)


def test_fully_masked_rows_give_zeros() -> None:
    mask = np.random.default_rng(4).random((1, 1, 6, 8)) < 0.6
    mask[0, 0, 2] = False
    compiled, feeds = check({**_qkv(1, 2, 2, 6, 8, 4), "attn_mask": mask}, n_out=4,
                            qk_matmul_output_mode=3)
    y, *_ = compiled.run(None, feeds)
    assert not np.isnan(y).any() and not y[:, :, 2].any()


def test_nonpad_kv_seqlen_causal_external_cache() -> None:
    feeds = {**_qkv(3, 2, 1, 2, 9, 4), "nonpad_kv_seqlen": np.array([9, 4, 1], np.int64)}
    check(feeds, opset=24, is_causal=1)
    check(feeds, opset=24)


def test_mismatched_heads_are_an_error() -> None:
    feeds = _qkv(1, 3, 2, 4, 4, 4)
    with pytest.raises(OnnxError, match="3 query heads cannot attend 2 key"):
        tilefuse.onnx.load(_model(feeds, 1, 23)).run(None, feeds)
