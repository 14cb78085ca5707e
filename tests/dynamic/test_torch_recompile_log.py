"""The torch backend specialises per input shape; each new shape is logged on ``recompiles``."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from tilefuse.testing import assert_close  # noqa: E402


def test_each_new_torch_input_shape_is_a_logged_recompile(caplog):
    caplog.set_level(logging.DEBUG, logger="tilefuse.recompiles")
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 4).eval()
    compiled = torch.compile(model, backend="tilefuse", dynamic=True)
    with torch.no_grad():
        for n in (2, 3):
            x = torch.randn(n, 8, generator=torch.Generator().manual_seed(n))
            assert_close(compiled(x).numpy(), model(x).numpy(), reduction=True)
    logged = [r.getMessage() for r in caplog.records if r.name == "tilefuse.recompiles"]
    assert any("new input signature 2" in m and "float32[3, 8]" in m for m in logged), logged
