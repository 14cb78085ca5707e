"""Each torch test starts from a clean Dynamo: the nn.Sequential models of different tests share
one forward code object, and Dynamo's recompile limit (8 per code object) would otherwise make a
late test run eagerly without ever calling the backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    try:
        import torch._dynamo
    except ImportError:
        yield
        return
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
