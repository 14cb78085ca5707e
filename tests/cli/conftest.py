"""Fixtures of the command-line tests: a private cache directory and small models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers_cli import K, M, N


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(cache))
    monkeypatch.delenv("TILEFUSE_TUNE_DB", raising=False)
    monkeypatch.delenv("TILEFUSE_DUMP", raising=False)
    return cache


@pytest.fixture(autouse=True)
def _small_default_peak_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """``tilefuse tune`` in this process probes the machine's peaks with a small
    ``PeakProbe`` (one 96x80x64 matmul, a 1 MiB copy, small cache levels), as the tuning tests
    do (tests/tune/conftest.py): the real probe, measured around each confirmation pass, took
    most of a tuning command's CPU time, for bounds these tests do not check."""
    from tilefuse.tune.roofline import PeakProbe

    monkeypatch.setattr(PeakProbe.__init__, "__defaults__", (
        ((96, 80, 64),), 1 << 20, {"L1": 32 << 10, "L2": 1 << 20, "L3": 4 << 20}))


@pytest.fixture
def weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return (rng.standard_normal((K, N)).astype(np.float32),
            rng.standard_normal(N).astype(np.float32))


@pytest.fixture
def small_onnx(tmp_path: Path, weights: tuple[np.ndarray, np.ndarray]) -> Path:
    """relu(x @ w + b), x f32[7,13], w and b initializers."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w, b = weights
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["out"])]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [M, N])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    path = tmp_path / "small.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture
def x_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(3).standard_normal((M, K)).astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, x)
    return path, x


@pytest.fixture
def numpy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``cli_small_fn`` with ``ffn(x, w, b) = tanh(x @ w + b)``."""
    (tmp_path / "cli_small_fn.py").write_text(
        "import numpy as np\n\n\ndef ffn(x, w, b):\n    return np.tanh(x @ w + b)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "cli_small_fn:ffn"
