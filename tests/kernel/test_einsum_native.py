"""einsum runs natively as the contractions it is: its decomposition (ops/contraction.py) gives
matmul kernels (batched, several operands, ellipses, broadcast size-1 dims), transposes, sums
(a label no one needs), outer products and diagonals (a repeated label), in f32, f64, f16, i32
and i64, against NumPy on fresh random inputs; no host step, and a matmul for a contraction."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.dtypes import from_numpy
from tilefuse.graph.builder import GraphBuilder
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close

CASES = [("ij,jk->ik", [(5, 7), (7, 3)]), ("bij,bjk->bik", [(2, 5, 7), (2, 7, 3)]),
         ("ij->ji", [(4, 5)]), ("ii->i", [(5, 5)]), ("ii", [(5, 5)]), ("ij,ij->", [(4, 5), (4, 5)]),
         ("i,j->ij", [(4,), (5,)]), ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 6, 8)]),
         ("...ij,...jk", [(3, 4, 5), (5, 2)]), ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 6)]),
         ("ijk->", [(3, 4, 5)]), ("i,i->", [(7,), (7,)]), ("ij,j->i", [(6, 9), (9,)]),
         ("iij->ij", [(3, 3, 4)]), ("ab,cb->ca", [(1, 5), (3, 5)]),
         ("bij,jk->bk", [(2, 3, 4), (4, 5)])]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64])
@pytest.mark.parametrize("equation,shapes", CASES)
def test_einsum_runs_natively(equation, shapes, dtype):
    rng = np.random.default_rng()
    b = GraphBuilder("einsum")
    ins = [b.input((s, from_numpy(np.dtype(dtype))), f"a{i}") for i, s in enumerate(shapes)]
    graph = b.build([b.add1("einsum", ins, {"equation": equation})])
    exe = NativeExecutable(graph)
    assert exe.fallbacks == []
    arrays = [rng.integers(-3, 4, s).astype(dtype) if np.dtype(dtype).kind == "i"
              else rng.uniform(-1, 1, s).astype(dtype) for s in shapes]
    wide = [a.astype(np.float32) if dtype == np.float16 else a for a in arrays]
    assert_close(exe(*arrays)[0], np.asarray(np.einsum(equation, *wide)).astype(dtype),
                 reduction=True)


def test_a_contraction_becomes_a_matmul_kernel():
    import tilefuse

    def attention_scores(q, k):
        return np.einsum("bhqd,bhkd->bhqk", q, k)

    rng = np.random.default_rng()
    q, k = (rng.standard_normal((2, 3, 17, 8)).astype(np.float32) for _ in range(2))
    f = tilefuse.jit(attention_scores)
    assert_close(f(q, k), attention_scores(q, k), reduction=True)
    lowered = f.lower(q, k)
    ops = {n.op.name for n in lowered.optimized.nodes}
    assert "matmul" in ops and "einsum" not in ops
    assert lowered.executable is not None and lowered.executable.fallbacks == []
