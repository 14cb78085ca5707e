"""Training graphs run natively: no kernel of a compiled training graph falls back to the host
NumPy references. The cases that once did: a leading-axis sum (a Linear's bias gradient on a
3-D input) and GPT-2's tied embedding gradient, whose one-hot product adds a transposed weight
gradient in its epilogue (the transpose moves the lane axis: it is now a kernel of its own
rather than a leaf the epilogue reads through)."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from torch import nn

import tilefuse
import tilefuse.torch as tt

rng = np.random.default_rng(7)


def _host_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
            and ("host fallback" in r.getMessage() or "runs on the host" in r.getMessage())]


def test_epilogue_adding_a_lane_moving_transpose_is_native() -> None:
    def f(hot, rows, other):
        return hot @ rows + other.T

    args = [rng.normal(size=(257, 67)).astype(np.float32),
            rng.normal(size=(67, 48)).astype(np.float32),
            rng.normal(size=(48, 257)).astype(np.float32)]
    jitted = tilefuse.jit(f)
    got = jitted(*args)
    np.testing.assert_allclose(got, f(*args), rtol=1e-4, atol=1e-4)
    executable = jitted.lower(*args).executable
    assert executable is not None and not executable.fallbacks, executable.fallbacks


def test_linear_bias_gradient_on_3d_input_is_native(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(24, 40), nn.GELU(), nn.LayerNorm(40), nn.Linear(40, 5))
    twin = copy.deepcopy(model)
    caplog.set_level(logging.DEBUG, logger="tilefuse.fallback")
    fn = torch.compile(twin, backend=tt.backend, dynamic=False)
    x = torch.randn(3, 17, 24)
    model(x).square().mean().backward()
    fn(x).square().mean().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
    assert not _host_warnings(caplog), _host_warnings(caplog)


def test_tied_embedding_gradient_is_native(caplog: pytest.LogCaptureFixture) -> None:
    transformers = pytest.importorskip("transformers")
    # the shape that once fell back: tokens (512) < vocabulary, the product's epilogue adding
    # the LM head's transposed gradient
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=1031,
                                     n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    torch.manual_seed(9)
    model = transformers.GPT2LMHeadModel(config)
    twin = copy.deepcopy(model)
    caplog.set_level(logging.DEBUG, logger="tilefuse.fallback")
    fn = torch.compile(twin, backend=tt.backend, dynamic=False)
    ids = torch.randint(0, config.vocab_size, (8, 64))
    model(ids, labels=ids).loss.backward()
    fn(ids, labels=ids).loss.backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert not _host_warnings(caplog), _host_warnings(caplog)
