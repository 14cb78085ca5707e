"""GPU training without a GPU: a training step's forward and backward graphs (bf16 autocast,
AOTAutograd's partition) cross-compile for the cuda target with zero host steps and no op left
to torch, and ``ptxas`` accepts every kernel. Convolutions with trainable weights (the weight a
runtime input) and their backward (the gradients of the input and of the weight) are bf16
products on the device, not host steps."""

from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tilefuse.frontend.torch.training_cross import cross_compile_training  # noqa: E402
from tilefuse.runtime.gpu import GemmStep  # noqa: E402
from tilefuse.runtime.gpu_cross import assemble  # noqa: E402


class _ConvNet(nn.Module):
    """The benchmark's small CNN (two conv blocks, a linear head) on 16x16 images."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, padding=1, stride=1)
        self.head = nn.Linear(16 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.head(x.flatten(1))


def _cnn_step(fn: nn.Module) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 16, 16, generator=g)
    y = torch.randint(0, 5, (4,), generator=g)
    return nn.functional.cross_entropy(fn(x), y)


@pytest.fixture(scope="module")
def cnn_bf16():
    torch.manual_seed(0)
    return cross_compile_training(_ConvNet(), _cnn_step, torch.bfloat16)


def test_cnn_training_has_no_host_step(cnn_bf16) -> None:
    assert len(cnn_bf16.regions) == 1
    assert not cnn_bf16.torch_ops(), cnn_bf16.torch_ops()
    assert not cnn_bf16.host_steps(), cnn_bf16.host_steps()


def test_conv_backward_is_bf16_products(cnn_bf16) -> None:
    """The forward's convolutions and the backward's input and weight gradients are GEMMs in
    bf16 (tensor cores), with the weight a runtime input."""
    halves = cnn_bf16.regions[0]
    dtypes = {half: [s.shape.dtype.name for region in built for s in region.program.steps
                     if isinstance(s, GemmStep)] for half, built in halves.items()}
    # forward: 2 convolutions + the head; backward: each conv's weight gradient, the second
    # conv's input gradient, the head's two products
    assert len(dtypes["forward"]) >= 3 and len(dtypes["backward"]) >= 5, dtypes
    assert set(dtypes["forward"]) == set(dtypes["backward"]) == {"bf16"}, dtypes


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas is not installed")
def test_cnn_training_ptx_assembles(cnn_bf16) -> None:
    for kernel, ptx in cnn_bf16.ptx().items():
        assert ".visible .entry" in ptx, kernel
        assemble(ptx)
