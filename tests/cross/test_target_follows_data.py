"""torch.compile(m, backend="tilefuse") compiles for the device its inputs live on; an explicit
``options={"target": ...}`` overrides. CUDA tensors are fakes here (no GPU needed)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from tilefuse.frontend.torch.backend import tilefuse_backend  # noqa: E402
from tilefuse.frontend.torch.device import data_target  # noqa: E402


def _gm() -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(torch.nn.ReLU())


def test_data_target_reads_devices() -> None:
    assert data_target([torch.device("cpu")]) == "cpu"
    assert data_target([]) == "cpu"
    assert data_target([torch.device("cpu"), torch.device("cuda", 0)]) == "cuda"


def test_cuda_inputs_compile_for_cuda() -> None:
    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda")
    assert tilefuse_backend(_gm(), [x])._options.target == "cuda"


def test_cpu_inputs_compile_for_cpu() -> None:
    assert tilefuse_backend(_gm(), [torch.ones(4, 8)])._options.target == "cpu"


def test_an_explicit_target_overrides() -> None:
    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda")
    compiled = tilefuse_backend(_gm(), [x], options={"target": "reference"})
    assert compiled._options.target == "reference"
    compiled = tilefuse_backend(_gm(), [torch.ones(2)], options={"target": "cuda"})
    assert compiled._options.target == "cuda"


def test_mixed_devices_warn_of_the_split(caplog) -> None:
    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda")
    with caplog.at_level(logging.WARNING, logger="tilefuse.fallback"):
        compiled = tilefuse_backend(_gm(), [x, torch.ones(2)])
    assert compiled._options.target == "cuda"
    assert any("device boundary" in r.getMessage() for r in caplog.records)
