"""torch.compile(model, backend="tilefuse") finds the backend through the installed entry point."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.testing import assert_close

torch = pytest.importorskip("torch")


def test_backend_by_name_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 513), torch.nn.GELU(), torch.nn.Linear(513, 5))
    compiled = torch.compile(model, backend="tilefuse", dynamic=False)
    x = torch.randn(3, 7)
    with torch.no_grad():
        got, want = compiled(x), model(x)
    assert_close(got.numpy(), want.numpy().astype(np.float32), reduction=True)
