"""The scatter ATen converters (frontend/torch/aten_scatter.py): ``scatter``, ``scatter_add``,
``scatter_reduce`` and ``index_put`` convert whole, the graph's reference matches eager torch,
and the graph cross-compiles for cuda with no host step and the same result (simulated)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilefuse.frontend.torch.convert import Unsupported  # noqa: E402
from tilefuse.graph.interpreter import interpret  # noqa: E402
from tilefuse.runtime.gpu_cross import cross_compile  # noqa: E402
from tilefuse.runtime.gpu_simulate import simulate  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402
from tilefuse.zoo import torch_graph  # noqa: E402


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


rng = np.random.default_rng(26)
X = rng.standard_normal((4, 6, 5)).astype(np.float32)
SRC = rng.standard_normal((4, 7, 5)).astype(np.float32)
IDX = rng.integers(0, 6, (3, 7, 4)).astype(np.int64)      # repeats along dim 1
ROWS = rng.integers(-4, 4, (9,)).astype(np.int64)           # repeats, negatives
COLS = rng.integers(0, 6, (9,)).astype(np.int64)
CACHE = rng.standard_normal((2, 3, 10, 4)).astype(np.float32)
NEW = rng.standard_normal((2, 3, 2, 4)).astype(np.float32)
POS = np.array([7, 3], np.int64)


def _unique_rows(n: int) -> np.ndarray:
    return rng.permutation(4)[:n].astype(np.int64)


def _cache_update(cache, positions, new):
    """A KV-cache write at the sequence positions (``cache[:, :, pos] = new``)."""
    cache = cache.clone()
    cache[:, :, positions] = new
    return cache


CASES = {
    "scatter_src": (lambda x, i, s: torch.scatter(x, 1, i, s), [X, IDX[..., :4], SRC], False),
    "scatter_add": (lambda x, i, s: torch.scatter_add(x, 1, i, s), [X, IDX, SRC], True),
    "scatter_reduce_amax": (lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "amax"),
                            [X, IDX, SRC], True),
    "scatter_reduce_prod": (lambda x, i, s: torch.scatter_reduce(x, 2, i.clamp(0, 4), s,
                                                                 "prod"),
                            [X, IDX[:, :6], SRC], True),
    "scatter_reduce_mean": (lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "mean"),
                            [X, IDX, SRC], True),
    "scatter_reduce_amin_without_self": (
        lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "amin", include_self=False),
        [X, IDX, SRC], True),
    "scatter_reduce_mean_without_self": (
        lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "mean", include_self=False),
        [X, IDX, SRC], True),
    "scatter_value": (lambda x, i: x.scatter(0, i.clamp(0, 3), 2.5), [X, IDX[:2, :6]], False),
    "index_put_rows_accumulate": (
        lambda x, r, v: torch.index_put(x, (r,), v, accumulate=True),
        [X, ROWS, rng.standard_normal((9, 6, 5)).astype(np.float32)], True),
    "index_put_broadcast_value": (lambda x, r: torch.index_put(x, (r,), torch.tensor(1.5)),
                                  [X, _unique_rows(3)], False),
    "index_put_two_axes": (
        lambda x, r, c, v: torch.index_put(x, (r, c), v, accumulate=True),
        [X, ROWS, COLS, rng.standard_normal((9, 5)).astype(np.float32)], True),
    "index_put_kv_cache": (_cache_update, [CACHE, POS, NEW], False),
}


@pytest.mark.parametrize("name", CASES)
def test_scatter_converter_matches_eager_and_runs_on_the_device(name: str) -> None:
    fn, inputs, accumulates = CASES[name]
    graph = torch_graph(Fn(fn), inputs, name)
    assert any(n.op.name.startswith("scatter") for n in graph.nodes), name
    with torch.no_grad():
        want = fn(*(torch.from_numpy(a) for a in inputs)).numpy()
    (got,) = interpret(graph, *inputs)
    assert_close(np.asarray(got), want, reduction=accumulates, msg=name)
    built = cross_compile(graph)
    assert not built.host_steps, [s.reason for s in built.host_steps]
    (device,) = simulate(built.program, inputs)
    np.testing.assert_array_equal(np.asarray(device), np.asarray(got))


def test_integer_scatter_reduce_mean_runs_in_torch() -> None:
    ints = rng.integers(-9, 9, SRC.shape).astype(np.int64)
    with pytest.raises(Unsupported, match="mean"):
        torch_graph(Fn(lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "mean")),
                    [ints[:, :6], IDX, ints], "mean")
