"""On a GPU: every kernel kind of tests/cross/test_gpu_coverage.py run by CudaExecutable against
the reference, and the cross-compilation zoo (tests/cross/zoo_models.py) through
``torch.compile(backend="tilefuse")`` on CUDA tensors (the target follows the data) against
eager, with no host step and no torch fallback. Skips where there is no GPU (CI)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tilefuse.runtime.cuda_driver import cuda_available  # noqa: E402
from tilefuse.testing import assert_close  # noqa: E402

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_available()),
                                reason="no CUDA device here")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cross"))
import test_gpu_coverage as coverage  # noqa: E402
import zoo_models  # noqa: E402


@pytest.mark.parametrize("name", coverage.GRAPHS)
def test_kind_on_the_device(name: str) -> None:
    from tilefuse.graph.interpreter import interpret
    from tilefuse.runtime.gpu import build_cuda

    graph = coverage.GRAPHS[name]()
    executable = build_cuda(graph)
    arrays = coverage._inputs(graph, 0)
    for got, want in zip(executable(*arrays), interpret(graph, *arrays), strict=True):
        assert_close(np.asarray(got), np.asarray(want), reduction=True, msg=name)


MODELS = {**zoo_models.HAND_WRITTEN, **zoo_models.TRANSFORMERS}


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_on_cuda_tensors(name: str, caplog) -> None:
    import tilefuse.torch
    from tilefuse.frontend.torch.convert import tensor_to_numpy

    module, inputs = MODELS[name]()
    module = module.cuda()
    args = [torch.from_numpy(a).cuda() for a in inputs]
    torch._dynamo.reset()
    compiled = torch.compile(module, backend=tilefuse.torch.backend)
    with torch.no_grad(), caplog.at_level(logging.DEBUG, logger="tilefuse.fallback"):
        got = compiled(*args)
        want = module(*args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    problems = [r.getMessage() for r in caplog.records
                if "runs on the host" in r.getMessage() or "torch fallback" in r.getMessage()]
    assert not problems, problems
    for g, w in zip(got, want, strict=True):
        assert g.device.type == "cuda"
        if w.dtype == torch.int64:
            continue
        assert_close(tensor_to_numpy(g.cpu()), tensor_to_numpy(w.cpu()), reduction=True,
                     msg=name)
