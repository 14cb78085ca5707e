"""Cold start: a fresh process that loads an artifact and calls it imports the runtime only
(no tracer, graph pass, kernel lowering, code generator, LLVM binding, ONNX, torch, egglog or
SciPy), and maps the file rather than copying it."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import tilefuse
from tilefuse.artifact import format as container
from tilefuse.artifact.targets import runs_here_by_cpuinfo
from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.testing import random_array

FORBIDDEN = ("tilefuse.frontend", "tilefuse.kernel", "tilefuse.passes", "tilefuse.ops",
             "tilefuse.backend", "tilefuse.driver", "tilefuse.onnx", "tilefuse.tune",
             "tilefuse.codegen.jit", "tilefuse.codegen.llvm_cpu", "tilefuse.codegen.launcher",
             "tilefuse.loop.interp", "tilefuse.graph.builder", "tilefuse.runtime.kernel_cache",
             "scipy", "egglog", "onnx", "torch", "onnxruntime")

CHILD = r"""
import json, sys
import numpy as np
import tilefuse

model = tilefuse.load(sys.argv[1])
np.save(sys.argv[3], model(np.load(sys.argv[2])))
print(json.dumps(sorted(sys.modules)))
"""


def _forbidden(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]


def test_the_check_sees_a_compiler_module() -> None:
    assert _forbidden(["tilefuse.kernel.fusion", "tilefuse.runtime.native", "torch"]) == [
        "tilefuse.kernel.fusion", "torch"]


def test_loading_imports_only_the_runtime(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    w = random_array(rng, (300, 200), DType.f32)
    f = tilefuse.jit(lambda x: np.tanh(x @ w) * 2 + np.exp(x[:, :200]))  # parallel kernels too
    x = random_array(rng, (96, 300), DType.f32)
    want = f(x)
    path = tilefuse.save(f, tmp_path / "m.tilefuse")
    np.save(tmp_path / "x.npy", x)
    env = dict(os.environ, PYTHONPATH=str(Path(tilefuse.__file__).parents[1]))
    child = subprocess.run([sys.executable, "-c", CHILD, str(path), str(tmp_path / "x.npy"),
                            str(tmp_path / "y.npy")], capture_output=True, text=True, env=env,
                           timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    modules = json.loads(child.stdout.strip().splitlines()[-1])
    assert "tilefuse.runtime.native" in modules
    assert not _forbidden(modules), _forbidden(modules)
    if runs_here_by_cpuinfo(host_target()):  # then the host check needs no LLVM either
        assert "llvmlite.binding" not in modules
    assert np.array_equal(np.load(tmp_path / "y.npy"), want)


def test_sections_are_views_of_the_mapped_file(tmp_path: Path) -> None:
    """Weights are used in place: a section is a read-only view of the file's mapping."""
    path = tmp_path / "a.tilefuse"
    container.write(path, {"manifest": b"{}", "w": np.arange(1000, dtype=np.float32).tobytes()})
    read = container.read(path)
    weights = read.array("w", np.dtype(np.float32), (1000,))
    assert not weights.flags.writeable and weights.ctypes.data % 64 == 0
    assert np.array_equal(weights, np.arange(1000, dtype=np.float32))
    assert isinstance(read.sections["w"].obj, mmap.mmap)  # not a copy in memory
    os.replace(tmp_path / "a.tilefuse", tmp_path / "b.tilefuse")  # the mapping keeps its bytes
    assert np.array_equal(weights, np.arange(1000, dtype=np.float32))
