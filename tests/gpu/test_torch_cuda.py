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


def _compiled(model, dump):  # type: ignore[no-untyped-def]
    import tilefuse.torch

    torch._dynamo.reset()
    return torch.compile(model, backend=tilefuse.torch.backend,
                         options={"target": "cuda", "dump": str(dump)})


def _all_in_tilefuse(dump) -> None:  # type: ignore[no-untyped-def]
    """The dump says tilefuse compiled every op (none fell back to torch)."""
    (partitions,) = dump.glob("*/s0/partitions.txt")
    text = partitions.read_text()
    assert "tilefuse_0" in text and text.endswith("# torch fallbacks\nnone\n"), text


@pytest.mark.parametrize("rows", [1, 7, 513])
def test_mlp_block_on_cuda_tensors(rows: int, tmp_path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(),
                                torch.nn.LayerNorm(96)).cuda().eval()
    x = torch.randn(rows, 64, device="cuda")
    with torch.no_grad():
        got = _compiled(model, tmp_path)(x)
        want = model(x)
    assert got.device.type == "cuda" and got.shape == want.shape
    _all_in_tilefuse(tmp_path)
    assert_close(got.cpu().numpy(), want.cpu().numpy(), reduction=True)


def test_softmax_of_a_scaled_sum_stays_on_the_device(tmp_path) -> None:
    def f(x, y):  # type: ignore[no-untyped-def]
        return torch.softmax(x * 0.5 + y, dim=-1)

    x = torch.randn(9, 256, device="cuda")
    y = torch.randn(256, device="cuda")
    got = _compiled(f, tmp_path)(x, y)
    _all_in_tilefuse(tmp_path)
    assert_close(got.cpu().numpy(), f(x, y).cpu().numpy(), reduction=True)
