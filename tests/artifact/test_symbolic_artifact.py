"""Symbolic artifacts: a tilefuse.jit function with symbolic dims saved once, with its shape
formulas, loaded and run at sizes it was never called with, bit for bit as the in-process
build; and the formulas a hostile file can hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tilefuse
from tilefuse.artifact import ArtifactError
from tilefuse.artifact import format as container
from tilefuse.artifact.symbolic import SymbolicProgram, evaluate
from tilefuse.dtypes import DType
from tilefuse.errors import GuardError
from tilefuse.testing import random_array


def _rows(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True) * 2


def test_one_program_serves_every_size(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    w = random_array(rng, (16, 8), DType.f32)
    f = tilefuse.jit(lambda x: np.tanh(x @ w).sum(-1), dynamic={"x": {0: "batch"}})
    f(random_array(rng, (3, 16), DType.f32))  # one size compiled
    loaded = tilefuse.load(tilefuse.save(f, tmp_path / "dyn.tilefuse"))
    (program,) = loaded.executables
    assert isinstance(program, SymbolicProgram) and str(program.graph.inputs[0].type) == \
        "f32[batch,16]"
    for batch in (1, 4, 3, 257, 4):
        x = random_array(rng, (batch, 16), DType.f32)
        assert np.array_equal(loaded(x), f(x))
    with pytest.raises(GuardError, match="f32\\[batch,16\\]"):
        loaded(random_array(rng, (4, 15), DType.f32))


def test_a_product_with_a_runtime_b(tmp_path: Path) -> None:
    """A matmul of two inputs: its packed-B scratch is sized by a formula."""
    f = tilefuse.jit(lambda x, y: np.tanh(x @ y), dynamic={"x": {0: "m"}})
    rng = np.random.default_rng(4)
    f(random_array(rng, (5, 40), DType.f32), random_array(rng, (40, 33), DType.f32))
    path = tilefuse.save(f, tmp_path / "mm.tilefuse")
    manifest = json.loads(bytes(container.read(path).section("manifest")))
    (entry,) = manifest["entries"]
    assert entry["program"]["symbolic"] == ["m"]
    loaded = tilefuse.load(path)
    for m in (1, 7, 130):
        x, y = random_array(rng, (m, 40), DType.f32), random_array(rng, (40, 33), DType.f32)
        assert np.array_equal(loaded(x, y), f(x, y))


def test_two_symbols_bound_consistently(tmp_path: Path) -> None:
    """Elementwise over two symbolic dims (row reductions over a symbolic row length are built
    per size, for now); a symbol that meets two sizes is a GuardError."""
    f = tilefuse.jit(lambda x, z: np.tanh(x) * z + 1, dynamic={"x": {0: "b", 1: "n"},
                                                               "z": {0: "b", 1: "n"}})
    rng = np.random.default_rng(7)
    f(random_array(rng, (2, 5), DType.f32), random_array(rng, (2, 5), DType.f32))
    loaded = tilefuse.load(tilefuse.save(f, tmp_path / "rows.tilefuse"))
    (program,) = loaded.executables
    assert program.symbols == ("b", "n")
    for b, n in [(1, 1), (3, 7), (2, 513)]:
        x, z = random_array(rng, (b, n), DType.f32), random_array(rng, (b, n), DType.f32)
        assert np.array_equal(loaded(x, z), f(x, z))
    with pytest.raises(GuardError, match="symbol n"):
        loaded(random_array(rng, (3, 4), DType.f32), random_array(rng, (3, 5), DType.f32))


def test_a_build_with_per_size_kernels_saves_its_sizes(tmp_path: Path) -> None:
    """A symbolic build that compiles some kernels per size cannot run at a new size without
    compiling: it is saved as the sizes it has built (a GuardError names them)."""
    import tilefuse.artifact.symbolic as symbolic

    rng = np.random.default_rng(5)
    f = tilefuse.jit(lambda x: np.tanh(x) * 3, dynamic={"x": {0: "n"}})
    for n in (3, 6):
        f(random_array(rng, (n, 4), DType.f32))
    real = symbolic.savable
    try:
        symbolic.savable = lambda exe: "forced by the test"  # type: ignore[assignment]
        loaded = tilefuse.load(tilefuse.save(f, tmp_path / "sizes.tilefuse"))
    finally:
        symbolic.savable = real  # type: ignore[assignment]
    assert len(loaded.executables) == 2
    x = random_array(rng, (6, 4), DType.f32)
    assert np.array_equal(loaded(x), f(x))
    with pytest.raises(GuardError, match="no saved specialisation"):
        loaded(random_array(rng, (4, 4), DType.f32))


def test_formulas() -> None:
    def fail(what: str) -> Exception:
        return ArtifactError(what)

    sizes = {"dim_n": 7, "dim_k": 3}
    assert evaluate(["mul", 4, ["add", "dim_n", ["floordiv", "dim_k", 2]]], sizes, fail) == 32
    assert evaluate(["mod", "dim_n", 0], sizes, fail) == 0  # as a build's extent_value
    for bad, match in [("dim_q", "unknown symbol"), (["pow", 2, 3], "malformed"),
                       ([["add"]], "malformed"), (True, "malformed"), (1.5, "malformed"),
                       (["mul", 1 << 40, 1 << 40], "gives")]:
        with pytest.raises(ArtifactError, match=match):
            evaluate(bad, sizes, fail)
    deep: Any = 1
    for _ in range(100):
        deep = ["add", deep, 1]
    with pytest.raises(ArtifactError, match="too deep"):
        evaluate(deep, sizes, fail)


def _rewrite(path: Path, change: Any) -> Path:
    """A copy of the artifact at ``path`` with its manifest changed by ``change`` (sections and
    checksums rewritten: the file is well-formed, its program hostile)."""
    read = container.read(path)
    manifest = json.loads(bytes(read.section("manifest")))
    change(manifest["entries"][0]["program"])
    sections = {name: bytes(data) for name, data in read.sections.items()}
    sections["manifest"] = json.dumps(manifest).encode("ascii")
    out = path.with_name("hostile.tilefuse")
    container.write(out, sections)
    return out


def _set(key: str, value: Any) -> Any:
    def change(program: dict[str, Any]) -> None:
        target = program
        *parts, last = key.split(".")
        for part in parts:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return change


@pytest.mark.parametrize(("change", "match"), [
    (_set("symbolic", []), "bad symbols"),
    (_set("symbolic", ["a b"]), "bad symbols"),
    (_set("buffers.0.nbytes", ["mul", 1 << 30, 1 << 30]), "gives|bytes"),
    (_set("buffers.0.nbytes", ["sub", 0, "dim_batch"]), "gives"),
    (_set("buffers.0.nbytes", "dim_nope"), "unknown symbol"),
    (_set("buffers.0.shape", [3]), "bytes for a"),
    (_set("buffers.0.last", 1 << 40), "not an index"),
    (_set("steps.0.launches.0.args.0", ["buf", 99]), "not an index"),
    (_set("steps.0.launches.0.scalars", ["dim_nope"]), "do not match"),
    (_set("inputs.0.2", ["nope", 16]), "not an index"),
])
def test_hostile_symbolic_programs(tmp_path: Path, change: Any, match: str) -> None:
    rng = np.random.default_rng(6)
    w = random_array(rng, (16, 8), DType.f32)
    f = tilefuse.jit(lambda x: np.tanh(x @ w).sum(-1), dynamic={"x": {0: "batch"}})
    f(random_array(rng, (3, 16), DType.f32))
    path = _rewrite(tilefuse.save(f, tmp_path / "dyn.tilefuse"), change)
    with pytest.raises(ArtifactError, match=match):
        tilefuse.load(path)
