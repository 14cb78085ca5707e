"""ATen converters: small functions through torch.compile, each compared with torch eager, and
each required to compile without any torch fallback (so every op in it has a converter)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

import tilefuse.torch as tt  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402

F = torch.nn.functional


def elementwise(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = torch.where(x > 0, torch.sqrt(x.abs() + 1) * torch.rsqrt(y * y + 1), -x / (y.abs() + 2))
    b = torch.maximum(torch.sigmoid(a), torch.minimum(torch.erf(y), torch.exp(-x.abs())))
    c = torch.clamp(torch.log(b + 1) ** 2, min=0.01, max=0.9) - torch.pow(2.0, -y.abs())
    return F.silu(c) + torch.tanh(a) * 3 - 1.5 + F.gelu(b, approximate="tanh")


def reductions(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    s = x.sum(dim=1, keepdim=True) + x.mean(dim=(0, 1)) + x.amax(dim=-1, keepdim=True)
    v = torch.var(x, dim=1, keepdim=True) + torch.var(y, dim=1, unbiased=False, keepdim=True)
    return F.log_softmax(x * s, dim=-1) + v - x.amin(dim=0) + F.softmax(y, dim=0)


def movement(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a, b = torch.split(x, [3, 6], dim=1)
    c = torch.cat([b, a, y[:, 2:5]], dim=1)             # [7, 12]
    d = c.t().unsqueeze(0).expand(2, 12, 7).permute(0, 2, 1)
    e = d.transpose(0, 1)[:, 1] + d[0, :, 2:3]          # select + slice
    idx = torch.tensor([4, 0, 2])
    f = torch.index_select(e, 0, idx).squeeze(0)
    return f.reshape(-1, 4)[::2] * 2


def sources_and_casts(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    r = torch.arange(9, dtype=torch.float32) * 0.5 + torch.full((7, 9), 2.0)
    n = (x * 10).to(torch.int64)
    q = n // 3 + (n % 4)
    return r * x + q.to(torch.float32) / 7 + (y > 0.5).float() + torch.zeros_like(x)


def integer_division(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = torch.arange(1, 64, 1).reshape(7, 9)
    return (a * 3 + 1) / (a % 5 + 1) + x


def pooling_and_conv1d(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    img = x.reshape(1, 1, 7, 9)
    p = F.avg_pool2d(img, 3, stride=2, padding=1) + F.max_pool2d(img, 2, stride=1)[..., :4, :5]
    w = torch.linspace(-1, 1, 12).reshape(4, 1, 3)
    c = F.conv1d(y.reshape(1, 1, 63), w, padding=1)      # [1, 4, 63]
    return p.sum() + c[0, :, :7]


def layer_norm_statistics(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """native_layer_norm with its mean and rstd results read too."""
    out, mean, rstd = torch.ops.aten.native_layer_norm(y, [9], x[0], x[1], 1e-5)
    return out + mean * rstd


def group_norm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """GroupNorm in a small conv block, with and without its affine parameters."""
    img = torch.cat([x, y, x * y], dim=0).reshape(1, 3, 7, 9)
    w = torch.linspace(-1, 1, 6 * 3 * 9).reshape(6, 3, 3, 3)
    c = F.conv2d(img, w, padding=1)                      # [1, 6, 7, 9]
    scale, shift = torch.linspace(0.5, 2, 6), torch.linspace(-1, 1, 6)
    return F.group_norm(c, 3, scale, shift, eps=1e-4) + F.group_norm(c * c, 2)


CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    f.__name__: f for f in (elementwise, reductions, movement, sources_and_casts,
                            integer_division, pooling_and_conv1d, layer_norm_statistics,
                            group_norm)
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_converter_against_eager(name: str, caplog: pytest.LogCaptureFixture) -> None:
    fn = CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    x, y = torch.rand(7, 9, generator=gen), torch.randn(7, 9, generator=gen)
    caplog.set_level(logging.DEBUG, logger="tilefuse.fallback")
    actual = torch.compile(fn, backend=tt.backend, dynamic=False)(x, y)
    expected = fn(x, y)
    assert_close(actual.numpy(), expected.numpy(), reduction=True)
    fallbacks = [r.getMessage() for r in caplog.records if "torch fallback" in r.getMessage()]
    assert not fallbacks, fallbacks


def test_fallback_region_is_cut_in_two() -> None:
    """exp before and after a sort: two tilefuse graphs, the sort in torch between them."""
    from tilefuse.frontend.torch.backend import SpecializedGraph, tilefuse_backend

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.exp(torch.sort(torch.exp(x) * 2, dim=1).values) + 1

    graphs: list[SpecializedGraph] = []

    def spy(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], **kw: object) -> object:
        compiled = tilefuse_backend(gm, inputs, **kw)
        graphs.append(compiled)
        return compiled

    x = torch.randn(4, 6)
    actual = torch.compile(fn, backend=spy, dynamic=False)(x)
    assert_close(actual.numpy(), fn(x).numpy())
    (report,) = graphs[0].reports
    assert len(report.graphs) == 2
    assert [op for op, _ in report.fallbacks] == ["aten.sort.default"]
    assert graphs[0].direct() == [False]   # the FX module runs the sort between the regions


def test_a_wholly_compiled_graph_is_called_directly() -> None:
    """One region fed by the placeholders and returned as it is: no FX module around it, and
    the same results, call after call."""
    from tilefuse.frontend.torch.backend import SpecializedGraph, tilefuse_backend

    graphs: list[SpecializedGraph] = []

    def spy(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], **kw: object) -> object:
        compiled = tilefuse_backend(gm, inputs, **kw)
        graphs.append(compiled)
        return compiled

    fn = CASES["reductions"]
    compiled = torch.compile(fn, backend=spy, dynamic=False)
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        x, y = torch.rand(7, 9, generator=gen), torch.randn(7, 9, generator=gen)
        assert_close(compiled(x, y).numpy(), fn(x, y).numpy(), reduction=True)
    assert graphs[0].direct() == [True]


def test_parameters_are_frozen_into_the_compiled_graph() -> None:
    """Weights and biases reach the tilefuse graph as constants (so B is packed once at build
    time), not as runtime inputs: only the activation is a graph input."""
    from tilefuse.frontend.torch.backend import SpecializedGraph, tilefuse_backend

    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(),
                                torch.nn.Linear(24, 7)).eval()
    graphs: list[SpecializedGraph] = []

    def spy(gm: torch.fx.GraphModule, inputs: list[torch.Tensor], **kw: object) -> object:
        compiled = tilefuse_backend(gm, inputs, **kw)
        graphs.append(compiled)
        return compiled

    x = torch.randn(5, 16)
    with torch.no_grad():
        actual = torch.compile(model, backend=spy, dynamic=False)(x)
        expected = model(x)
    assert_close(actual.numpy(), expected.numpy(), reduction=True)
    (report,) = graphs[0].reports
    (graph,) = report.graphs.values()
    assert [tuple(v.shape) for v in graph.inputs] == [(5, 16)]
    assert sum(n.op.name == "constant" for n in graph.nodes) == 4
