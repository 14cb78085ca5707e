"""torch.compile(dynamic=True) and mark_dynamic: Dynamo's SymInt sizes become tilefuse symbols,
so one tilefuse build serves every size (the builds are counted), checked against eager on
fresh random inputs of odd sizes. Dynamo itself specialises a size of 1 (its 0/1 rule), which
is one more graph and so one more build."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

import tilefuse.frontend.torch.backend  # noqa: E402, F401 (the "tilefuse" backend)
from tilefuse import driver  # noqa: E402
from tilefuse.graph.types import Sym  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402

nn = torch.nn


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Every tilefuse build the torch backend starts (its regions' graphs), seen where every
    build goes: the compile driver's back-end stages."""
    seen: list[object] = []
    original = driver.build

    def counting(graph, target, options=None):
        seen.append(graph)
        return original(graph, target, options)
    monkeypatch.setattr(driver, "build", counting)
    yield seen


def mlp() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(24, 40), nn.ReLU(inplace=True), nn.Linear(40, 12),
                         nn.GELU()).eval()


def check(model: nn.Module, fn, x: torch.Tensor) -> None:
    with torch.no_grad():
        assert_close(fn(x).numpy(), model(x).numpy(), reduction=True, msg=str(tuple(x.shape)))


def test_dynamic_true_builds_once_for_every_batch_and_sequence(builds, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="tilefuse")
    model = mlp()
    fn = torch.compile(model, backend="tilefuse", dynamic=True)
    for shape in ((2, 7), (3, 5), (7, 13), (2, 513), (5, 2)):
        check(model, fn, torch.randn(*shape, 24))
    assert len(builds) == 1, [str(g) for g in builds]
    (graph,) = builds
    batch, seq, width = graph.inputs[0].shape
    assert isinstance(batch, Sym) and isinstance(seq, Sym) and batch != seq and width == 24
    messages = [r.getMessage() for r in caplog.records]
    assert any("one build serves every size" in m for m in messages), messages
    assert not [m for m in messages if "torch fallback" in m], messages  # linear stays matmul
    assert not [m for m in messages if "new input signature" in m], messages


def test_size_one_is_one_more_dynamo_graph_and_build(builds) -> None:
    model = mlp()
    fn = torch.compile(model, backend="tilefuse", dynamic=True)
    for shape in ((3, 7), (1, 7), (1, 1), (6, 1), (9, 11), (1, 513)):
        check(model, fn, torch.randn(*shape, 24))
    # (s0, s1) once; Dynamo specialises each size 1: (1, s1), (1, 1) and (s0, 1)
    assert len(builds) <= 4, [str(g.inputs[0].type) for g in builds]
    assert len(builds) == len({str(g.inputs[0].type) for g in builds})


def test_mark_dynamic_batch_is_one_build(builds) -> None:
    model = mlp()
    fn = torch.compile(model, backend="tilefuse")
    for rows in (3, 7, 513, 2):
        x = torch.randn(rows, 24)
        torch._dynamo.mark_dynamic(x, 0)
        check(model, fn, x)
    assert len(builds) == 1
    assert not isinstance(builds[0].inputs[0].shape[0], int)
    assert builds[0].inputs[0].shape[1] == 24


def test_automatic_dynamic_after_a_second_size_builds_twice(builds) -> None:
    model = mlp()
    fn = torch.compile(model, backend="tilefuse")   # dynamic=None: Dynamo's automatic dynamic
    for rows in (4, 5, 7, 513, 2, 31):
        check(model, fn, torch.randn(rows, 24))
    assert len(builds) == 2, [str(g.inputs[0].type) for g in builds]
    assert isinstance(builds[0].inputs[0].shape[0], int)
    assert not isinstance(builds[1].inputs[0].shape[0], int)


class SizeArithmetic(nn.Module):
    """A flatten whose result size is s0*s1 (no graph-IR form) between compiled regions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x) * 2.0
        flat = y.reshape(-1)
        return torch.sigmoid(flat).cumsum(0)


def test_compound_size_runs_in_torch_and_the_rest_is_one_build(builds, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="tilefuse.fallback")
    model = SizeArithmetic()
    fn = torch.compile(model, backend="tilefuse", dynamic=True)
    for shape in ((2, 3), (5, 7), (4, 9)):
        check(model, fn, torch.randn(*shape))
    assert len(builds) == 1
    assert any("expression of symbols" in r.getMessage() for r in caplog.records)
