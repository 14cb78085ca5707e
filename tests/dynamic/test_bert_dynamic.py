"""The BERT-base layer with symbolic batch and sequence dims: one compile serves every size,
each size checked against torch eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tilefuse import zoo  # noqa: E402
from tilefuse.frontend import jit  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402

DYNAMIC = {"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 3: "seq"}}


def test_one_compile_serves_several_batch_and_sequence_sizes():
    module = zoo.bert_layer()
    layer = jit(zoo.bert_layer_numpy(module), dynamic=DYNAMIC)
    sizes = [(1, 1), (2, 7), (3, 33)]
    for seed, (batch, seq) in enumerate(sizes):
        x, mask = zoo.bert_inputs(batch, seq, seed=seed)
        with torch.no_grad():
            expected = module(torch.from_numpy(x), torch.from_numpy(mask)).numpy()
        assert_close(layer(x, mask), expected, reduction=True)
    info = layer.cache_info()
    # one symbolic native build: no per-size pipeline re-run or native build
    assert (info.compiles, info.entries, info.specializations) == (1, 1, 0)
    optimized = str(layer.lower(*zoo.bert_inputs(1, 5)).optimized)
    assert "f32[batch,seq,768]" in optimized and "attention(" in optimized
