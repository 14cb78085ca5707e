"""torch.compile(model, backend=tilefuse.torch.backend) against torch eager on small models.

Each model is compiled once per module (torch.compile is slow to start) and called on fresh
random inputs. ``dynamic=False`` keeps Dynamo from turning a recompiled frame dynamic (the
models share ``Sequential.forward``); the backend also handles dynamic graphs (test below).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tilefuse.torch as tt  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402

nn = torch.nn


def compiled(model: nn.Module, **options: object) -> Callable[..., torch.Tensor]:
    return torch.compile(model.eval(), backend=tt.backend, dynamic=False,
                         options=dict(options) or None)


def check(model: nn.Module, fn: Callable[..., torch.Tensor], *inputs: torch.Tensor,
          reduction: bool = True) -> None:
    with torch.no_grad():
        expected = model(*inputs)
        actual = fn(*inputs)
    assert isinstance(actual, torch.Tensor)
    assert_close(actual.numpy(), expected.numpy(), reduction=reduction)


class Attention(nn.Module):
    """Pre-norm self-attention written by hand: layer norm, q/k/v projections, softmax."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in (q, k, v))
        scores = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        y = (scores @ v).transpose(1, 2).reshape(b, s, d)
        return x + self.out(y)


class MHABlock(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mha = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.mha(h, h, h, need_weights=False)[0]


class WithCummax(nn.Module):
    """tilefuse has no cummax: it runs in torch between two compiled regions."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(9, 9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))
        return torch.exp(torch.cummax(h, dim=1).values) * 0.5 - h


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 5 * 5, 7))


@pytest.fixture(scope="module")
def mlp() -> tuple[nn.Module, Callable[..., torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(33, 513), nn.ReLU(), nn.Linear(513, 7)).eval()
    return model, compiled(model)


def test_mlp(mlp: tuple[nn.Module, Callable[..., torch.Tensor]]) -> None:
    model, fn = mlp
    for _ in range(2):  # fresh inputs; the second call reuses the compiled code
        check(model, fn, torch.randn(7, 33))


def test_non_contiguous_input(mlp: tuple[nn.Module, Callable[..., torch.Tensor]]) -> None:
    model, fn = mlp
    x = torch.randn(33, 7).t()
    assert not x.is_contiguous()
    check(model, fn, x)


def test_linear_gelu_both_approximations() -> None:
    torch.manual_seed(1)
    for approximate in ("none", "tanh"):
        model = nn.Sequential(nn.Linear(64, 513), nn.GELU(approximate=approximate))
        check(model, compiled(model), torch.randn(7, 64))


def test_attention_by_hand() -> None:
    torch.manual_seed(2)
    model = Attention()
    check(model, compiled(model), torch.randn(2, 7, 32))


def test_multihead_attention() -> None:
    torch.manual_seed(3)
    model = MHABlock()
    check(model, compiled(model), torch.randn(3, 5, 16))


def test_cnn_with_batchnorm() -> None:
    torch.manual_seed(4)
    model = cnn().eval()
    with torch.no_grad():  # non-trivial running statistics
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    check(model, compiled(model), torch.randn(2, 3, 11, 11))


def test_embedding_lookup() -> None:
    torch.manual_seed(5)
    model = nn.Embedding(513, 7)
    ids = torch.randint(0, 513, (3, 5))
    with torch.no_grad():
        expected = model(ids)
        actual = compiled(model)(ids)
    assert_close(actual.numpy(), expected.numpy())


def test_unsupported_op_falls_back_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(6)
    model = WithCummax()
    caplog.set_level(logging.DEBUG, logger="tilefuse.fallback")
    check(model, compiled(model), torch.randn(4, 9))
    messages = [r.getMessage() for r in caplog.records if r.name == "tilefuse.fallback"]
    assert any("torch fallback" in m and "aten.cummax" in m for m in messages), messages


def test_dump_directory(tmp_path: Path) -> None:
    torch.manual_seed(7)
    model = nn.Sequential(nn.Linear(5, 7), nn.Sigmoid())
    check(model, compiled(model, dump=str(tmp_path)), torch.randn(3, 5))
    names = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert {"partitions.txt", "00-captured.graph", "kernels.plan"} <= names, names


def test_grad_required_compiles_for_training(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(5, 3), nn.Tanh())
    caplog.set_level(logging.WARNING, logger="tilefuse.fallback")
    fn = torch.compile(model, backend=tt.backend, dynamic=False)
    x = torch.randn(4, 5)
    fn(x).sum().backward()
    want = torch.autograd.grad(model(x).sum(), model[0].weight)[0]
    torch.testing.assert_close(model[0].weight.grad, want)
    assert not [r for r in caplog.records if "torch fallback" in r.getMessage()]


def test_dynamic_graph_matches_eager() -> None:
    torch.manual_seed(9)
    model = nn.Sequential(nn.Linear(6, 4), nn.SiLU()).eval()
    fn = torch.compile(model, backend=tt.backend, dynamic=True)
    for rows in (3, 5):
        check(model, fn, torch.randn(rows, 6))


def test_compile_exported_mlp(mlp: tuple[nn.Module, Callable[..., torch.Tensor]]) -> None:
    model, _ = mlp
    x = torch.randn(7, 33)
    fn = tt.compile_exported(torch.export.export(model, (x,)))
    check(model, fn, x)
    check(model, fn, torch.randn(7, 33))


def test_unknown_option_is_a_tilefuse_error() -> None:
    from tilefuse.errors import TilefuseError
    from tilefuse.frontend.torch.backend import Options
    with pytest.raises(TilefuseError, match="unknown tilefuse option"):
        Options.parse({"dumpdir": "x"})


def test_import_tilefuse_does_not_import_torch() -> None:
    import subprocess
    import sys
    code = ("import sys, tilefuse, tilefuse.torch; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)



