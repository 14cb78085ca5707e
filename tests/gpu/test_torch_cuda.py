"""torch.compile(backend=tilefuse) with CUDA tensors on the cuda target: inputs read in place by
device pointer, outputs allocated by torch on the same device, results against eager. Runs only
where torch sees a GPU and cuda-python a driver; skips cleanly elsewhere (CI has no GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tilefuse.runtime.cuda_driver import cuda_available  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_available()),
                                reason="no CUDA device here")


def _compiled(model):  # type: ignore[no-untyped-def]
    import tilefuse.torch

    torch._dynamo.reset()
    return torch.compile(model, backend=tilefuse.torch.backend, options={"target": "cuda"})


@pytest.mark.parametrize("rows", [1, 7, 513])
def test_mlp_block_on_cuda_tensors(rows: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(),
                                torch.nn.LayerNorm(96)).cuda().eval()
    x = torch.randn(rows, 64, device="cuda")
    with torch.no_grad():
        got = _compiled(model)(x)
        want = model(x)
    assert got.device.type == "cuda" and got.shape == want.shape
    assert_close(got.cpu().numpy(), want.cpu().numpy(), reduction=True)


def test_softmax_of_a_scaled_sum_stays_on_the_device() -> None:
    def f(x, y):  # type: ignore[no-untyped-def]
        return torch.softmax(x * 0.5 + y, dim=-1)

    x = torch.randn(9, 256, device="cuda")
    y = torch.randn(256, device="cuda")
    got = _compiled(f)(x, y)
    assert_close(got.cpu().numpy(), f(x, y).cpu().numpy(), reduction=True)
