"""The indexing, bitwise, scan and repeat ATen converters (frontend/torch/aten_index.py): each
module converts whole (no torch fallback) and the tilefuse graph's reference matches eager
torch on fresh inputs; the ones it cannot express run in torch with a reason."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilefuse.frontend.torch.convert import Unsupported  # noqa: E402
from tilefuse.graph.interpreter import interpret  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402
from tilefuse.zoo import torch_graph  # noqa: E402


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


rng = np.random.default_rng(0)
X = rng.standard_normal((3, 5, 7)).astype(np.float32)
MASK = rng.integers(0, 2, (3, 7)).astype(np.int64)
IDX = rng.integers(-5, 5, (4,)).astype(np.int64)
CASES = {
    "bitwise_and": (lambda m: (m > 0) & (m[:, [6, 0, 1, 2, 3, 4, 5]] < 1), [MASK]),
    "bitwise_or_not": (lambda m: ~((m > 0) | (m < 0)), [MASK]),
    "index_one": (lambda x, i: x[:, i], [X, IDX]),
    "index_two_adjacent": (lambda x, i: x[i.clamp(0, 2), i.abs() % 5], [X, IDX]),
    "gather": (lambda x, m: torch.gather(x[:, 0], 1, m.clamp(0, 6)[:, :4]), [X, MASK]),
    "cumsum_int": (lambda m: torch.cumsum(m, dim=-1) * m - 1, [MASK]),
    "cumsum_float_axis0": (lambda x: torch.cumsum(x, dim=0), [X]),
    "cumsum_int32_dtype": (lambda m: torch.cumsum(m, dim=1, dtype=torch.int32), [MASK]),
    "cumsum_long_axis": (lambda x: torch.cumsum(x, dim=-1),
                         [rng.standard_normal((2, 9000)).astype(np.float32)]),
    "repeat": (lambda x: x[:, :2].repeat(2, 1, 1, 3), [X]),
    "topk": (lambda x: torch.topk(x, 3, dim=1), [X]),
}


def test_cumsum_is_the_scan_op() -> None:
    """One definition of cumsum: the converter emits the scan op (no quadratic masked sum)."""
    graph = torch_graph(Fn(lambda x: torch.cumsum(x, dim=1)), [X], "cumsum")
    assert [n.op.name for n in graph.nodes if n.op.name not in ("constant",)] == ["cumsum"]


@pytest.mark.parametrize("name", CASES)
def test_converter_matches_eager(name: str) -> None:
    fn, inputs = CASES[name]
    graph = torch_graph(Fn(fn), inputs, name)
    with torch.no_grad():
        want = fn(*(torch.from_numpy(a) for a in inputs))
    want = want if isinstance(want, tuple) else (want,)
    got = interpret(graph, *inputs)
    for g, w in zip(got, want, strict=True):
        assert_close(np.asarray(g), w.numpy(), reduction=True, msg=name)


def test_integer_bitwise_and_runs_in_torch() -> None:
    with pytest.raises(Unsupported, match="bitwise ops on i64"):
        torch_graph(Fn(lambda m: m & 3), [MASK], "int_and")
