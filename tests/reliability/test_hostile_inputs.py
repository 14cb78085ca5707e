"""Hostile inputs: every malformed ONNX file of the corpus (hostile_corpus.py) and every bad
call is a clear TilefuseError: no crash, no hang, bounded memory (RLIMIT_AS in the child, peak
RSS checked). Also the regression tests of the bugs this sweep found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilefuse
from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.errors import GuardError, TilefuseError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.types import TensorType
from tilefuse.runtime.kernel_cache import KernelCache
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close, random_array

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import hostile_corpus  # noqa: E402

ADDRESS_LIMIT_MB = 4096
PEAK_RSS_LIMIT_MB = 1024
ACCEPTED = {"no_outputs", "deep_chain_3000"}   # valid models: they must load and run


def test_hostile_onnx_corpus_is_rejected_cleanly(tmp_path: Path) -> None:
    names = hostile_corpus.write_corpus(tmp_path / "corpus")
    env = {"TILEFUSE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    child = subprocess.run([sys.executable, str(HERE / "hostile_corpus.py"),
                            str(tmp_path / "corpus"), str(ADDRESS_LIMIT_MB)],
                           capture_output=True, text=True, timeout=600, env=env)
    assert child.returncode == 0, child.stderr[-3000:]   # a crash would be a signal
    lines = [json.loads(line) for line in child.stdout.splitlines()]
    results = {r["case"]: r for r in lines if "case" in r}
    assert set(results) == set(names)
    for name, result in results.items():
        expected = "accepted" if name in ACCEPTED else "rejected"
        assert result["outcome"] == expected, (name, result)
        if expected == "rejected":
            assert len(result["message"]) > 20, (name, result)
    peak_mb = lines[-1]["peak_rss_kb"] / 1024
    assert peak_mb < PEAK_RSS_LIMIT_MB, f"peak RSS {peak_mb:.0f} MB"


# ---- bad calls -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def executable() -> NativeExecutable:
    b = GraphBuilder("call")
    x = b.input(TensorType((7, 5), DType.f32), "x")
    w = b.input(TensorType((5,), DType.f32), "w")
    graph = b.build([b.add1("softmax", [b.add1("mul", [x, w])])])
    target = host_target()
    return NativeExecutable(graph, target=target, cache=KernelCache(None, target))


def _good(rng: np.random.Generator) -> list[np.ndarray]:
    return [random_array(rng, (7, 5), DType.f32), random_array(rng, (5,), DType.f32)]


@pytest.mark.parametrize("bad", [
    "too_few", "too_many", "wrong_shape", "wrong_rank", "wrong_dtype", "list", "scalar",
    "non_contiguous", "fortran", "none"])
def test_bad_calls_are_guard_errors(executable: NativeExecutable, bad: str) -> None:
    x, w = _good(np.random.default_rng(0))
    args = {"too_few": [x], "too_many": [x, w, w],
            "wrong_shape": [x[:6], w], "wrong_rank": [x[None], w],
            "wrong_dtype": [x.astype(np.float64), w], "list": [x.tolist(), w],
            "scalar": [1.0, w], "non_contiguous": [np.ascontiguousarray(
                np.tile(x, (1, 2)))[:, ::2], w],
            "fortran": [np.asfortranarray(x), w], "none": [None, w]}[bad]
    with pytest.raises(GuardError, match=r"input x|takes 2 inputs"):
        executable(*args)


def test_nan_and_inf_inputs_flow_through(executable: NativeExecutable) -> None:
    x, w = _good(np.random.default_rng(1))
    x[0, 1], x[2, :], x[3, 0], w[4] = np.nan, -np.inf, np.inf, np.inf
    with np.errstate(all="ignore"):
        expected = interpret(executable.graph, x, w)[0]
    assert_close(executable(x, w)[0], expected, reduction=True)


def test_jit_bad_calls() -> None:
    f = tilefuse.jit(lambda a, b: np.maximum(a, b) * 2.0)
    a = np.random.default_rng(2).uniform(-1, 1, (3, 513)).astype(np.float32)
    b = np.random.default_rng(3).uniform(-1, 1, (513,)).astype(np.float32)
    assert_close(f(a[:, ::-1], b), np.maximum(a[:, ::-1], b) * 2.0)   # copied, not refused
    with pytest.raises(TilefuseError):
        f(a.tolist(), b)
    with pytest.raises(TilefuseError):
        f(a, np.ones((4,), np.float32))   # shapes that do not broadcast


# ---- regressions of bugs found by this sweep -------------------------------------------------


def test_long_elementwise_chain_compiles() -> None:
    """Bug: ~1000 fused elementwise ops overflowed the Python stack in lowering."""
    b = GraphBuilder("chain")
    v = x = b.input(TensorType((3, 17), DType.f32), "x")
    for i in range(1100):
        v = b.add1("mul" if i % 2 else "add", [v, x])
    graph = b.build([v])
    target = host_target()
    ex = NativeExecutable(graph, target=target, cache=KernelCache(None, target))
    arg = random_array(np.random.default_rng(4), (3, 17), DType.f32)
    assert x is graph.inputs[0]
    assert_close(ex(arg)[0], interpret(graph, arg)[0])


@pytest.mark.parametrize("target_name", ["cpu", "reference"])
def test_terabyte_shapes_are_errors_not_memory_errors(target_name: str) -> None:
    """Bug: a 2^40-element full() escaped as a raw MemoryError."""
    from tilefuse.runtime.executable import build_executable
    b = GraphBuilder("bomb")
    x = b.input(TensorType((1, 1), DType.f32), "x")
    big = b.add1("full", [], {"shape": (1 << 20, 1 << 20), "value": 1.0, "dtype": DType.f32})
    graph = b.build([b.add1("add", [big, x])])
    with pytest.raises(TilefuseError, match="out of memory"):
        build_executable(graph, target_name)(np.ones((1, 1), np.float32))
