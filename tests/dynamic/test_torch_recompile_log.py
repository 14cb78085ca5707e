"""The torch backend with Dynamo's dynamic sizes: one symbolic build, no per-shape recompile;
a graph that cannot take symbolic sizes is specialised per shape, each new shape logged."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

import tilefuse.frontend.torch.backend as backend  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402


def test_dynamic_torch_graph_is_one_build_not_one_per_shape(caplog):
    caplog.set_level(logging.DEBUG, logger="tilefuse.recompiles")
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 4).eval()
    compiled = torch.compile(model, backend="tilefuse", dynamic=True)
    with torch.no_grad():
        for n in (2, 3, 7):
            x = torch.randn(n, 8, generator=torch.Generator().manual_seed(n))
            assert_close(compiled(x).numpy(), model(x).numpy(), reduction=True)
    logged = [r.getMessage() for r in caplog.records if r.name == "tilefuse.recompiles"]
    assert not any("new input signature" in m for m in logged), logged
    assert any("one build serves every size" in m for m in logged), logged


def test_graph_that_cannot_trace_symbolically_is_specialised_with_a_reason(caplog,
                                                                          monkeypatch):
    def refuse(gm):
        raise RuntimeError("planted: no symbolic trace")
    monkeypatch.setattr(backend, "trace_symbolic", refuse)
    caplog.set_level(logging.DEBUG, logger="tilefuse.recompiles")
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 4).eval()
    compiled = torch.compile(model, backend="tilefuse", dynamic=True)
    with torch.no_grad():
        for n in (2, 3):
            x = torch.randn(n, 8, generator=torch.Generator().manual_seed(n))
            assert_close(compiled(x).numpy(), model(x).numpy(), reduction=True)
    logged = [r.getMessage() for r in caplog.records if r.name == "tilefuse.recompiles"]
    assert any("planted: no symbolic trace" in m and "per input shape" in m
               for m in logged), logged
    assert any("new input signature 2" in m and "float32[3, 8]" in m for m in logged), logged
