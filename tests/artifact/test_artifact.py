"""Compiled artifacts (tilefuse.save / tilefuse.load, ``tilefuse compile``): a loaded artifact
computes bit for bit what the in-process build computes, on fresh random inputs; loading runs
no compiler; an x86-64-v3 artifact built on an AVX-512 host runs here and holds no zmm code."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import numpy as np
import pytest

import tilefuse
from tilefuse.artifact import ArtifactError
from tilefuse.artifact import format as container
from tilefuse.artifact.targets import cpu_target
from tilefuse.codegen.target import host_target
from tilefuse.dtypes import DType
from tilefuse.errors import GuardError
from tilefuse.graph.builder import GraphBuilder
from tilefuse.graph.interpreter import interpret
from tilefuse.graph.ir import Literal
from tilefuse.runtime.native import NativeExecutable
from tilefuse.testing import assert_close, random_array


def _same(got: Any, want: Any) -> None:
    """Equal structure, dtypes, shapes and bits."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True), np.abs(got - want).max()


def mlp(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> Any:
    h = np.maximum(x @ w + b, 0)
    e = np.exp(h - h.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True), [h.sum(0), h * 0.5]


@pytest.mark.parametrize("dtype", [DType.f32, DType.f64])
def test_jit_round_trip_is_bit_identical(tmp_path: Path, dtype: DType) -> None:
    rng = np.random.default_rng(7)
    shapes = [(13, 37), (37, 29), (29,)]
    f = tilefuse.jit(mlp)
    f(*[random_array(rng, s, dtype) for s in shapes])
    path = tilefuse.save(f, tmp_path / "mlp.tilefuse")
    loaded = tilefuse.load(path)
    assert loaded.kind == "jit"
    for _ in range(3):  # fresh inputs, after the compile
        args = [random_array(rng, s, dtype) for s in shapes]
        _same(loaded(*args), f(*args))
    assert "launch sequence" in loaded.plans[0] and "memory plan" in loaded.plans[0]
    in_process = f.lower(*args).executable
    assert loaded.executables[0].single_entry == in_process.single_entry


def _reductions_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes the reduction lowering fail, so that plain reductions are host steps (every kind
    lowers natively now; the host path is what these tests are about)."""
    import tilefuse.backend.cpu as cpu_backend
    from tilefuse.errors import CompileError

    def failing(*args: Any, **kwargs: Any) -> None:
        raise CompileError("made to fail by the test")

    monkeypatch.setattr(cpu_backend, "lower_reduce", failing)


def test_host_steps_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups with no native lowering (a plain reduction, made to fail) are saved as graph text
    and run on the host after loading, between native kernels."""
    rng = np.random.default_rng(1)
    f = tilefuse.jit(lambda x: (x.max(0) + 1, np.argmax(x * 2, -1)))
    x = random_array(rng, (9, 11), DType.f32)
    with monkeypatch.context() as m:
        _reductions_on_the_host(m)
        f(x)
    assert f.lower(x).executable.fallbacks  # the case is what it claims
    loaded = tilefuse.load(tilefuse.save(f, tmp_path / "host.tilefuse"))
    x = random_array(rng, (9, 11), DType.f32)
    _same(loaded(x), f(x))
    assert loaded.executables[0].fallbacks


def _onnx_model(path: Path, rng: np.random.Generator) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = rng.standard_normal((24, 10)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Softmax", ["r"], ["y"], axis=-1),
         helper.make_node("ReduceMax", ["a"], ["z"], keepdims=0, axes=[1])],
        "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 10]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return path


def test_onnx_round_trip(tmp_path: Path) -> None:
    import tilefuse.onnx

    rng = np.random.default_rng(3)
    model = tilefuse.onnx.load(str(_onnx_model(tmp_path / "small.onnx", rng)))
    x = random_array(rng, (3, 24), DType.f32)
    model(x)
    loaded = tilefuse.load(tilefuse.save(model, tmp_path / "small.tilefuse"))
    assert loaded.input_names == ["x"] and loaded.output_names == ["y", "z"]
    x = random_array(rng, (3, 24), DType.f32)
    _same(loaded(x), model(x))
    _same(loaded.run(["z"], {"x": x}), model.run(["z"], {"x": x}))
    with pytest.raises(GuardError):
        loaded(random_array(rng, (4, 24), DType.f32))


def _boom(what: str) -> Any:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"loading an artifact ran {what}")
    return fail


def test_loading_runs_no_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    f = tilefuse.jit(mlp)
    shapes = [(6, 20), (20, 12), (12,)]
    f(*[random_array(rng, s, DType.f32) for s in shapes])
    f2 = tilefuse.jit(lambda x: (x.max(0) + 1,))
    with monkeypatch.context() as m:  # a host step in b
        _reductions_on_the_host(m)
        f2(random_array(rng, (5, 4), DType.f32))
    f3 = tilefuse.jit(lambda x, w: np.tanh(x @ w))
    f3(*[random_array(rng, s, DType.f32) for s in shapes[:2]])
    paths = [tilefuse.save(f, tmp_path / "a.tilefuse"), tilefuse.save(f2, tmp_path / "b.tilefuse"),
             tilefuse.save(f3, tmp_path / "c.tilefuse")]
    import tilefuse.artifact.launcher as artifact_launcher
    import tilefuse.backend.cpu as cpu_backend
    import tilefuse.codegen.jit as codegen_jit
    import tilefuse.codegen.launcher as launcher
    import tilefuse.codegen.llvm_cpu as llvm_cpu
    import tilefuse.driver as driver
    import tilefuse.frontend.capture as capture
    import tilefuse.kernel.fusion as fusion
    import tilefuse.passes.decompose as decompose
    import tilefuse.passes.manager as manager

    for module, name in [(codegen_jit, "compile_kernel"), (codegen_jit, "optimise"),
                         (codegen_jit, "llvm_ir_text"), (llvm_cpu, "lower_to_llvm"),
                         (launcher, "_launcher_ir"), (capture, "capture"),
                         (fusion, "form_kernels"), (driver, "plan_kernels"),
                         (decompose, "decompose_composites"), (driver, "prepare"),
                         (manager, "run_pipeline"), (cpu_backend.CpuBuild, "__init__"),
                         (artifact_launcher, "_ir"), (artifact_launcher, "launcher_object")]:
        monkeypatch.setattr(module, name, _boom(f"{getattr(module, '__name__', module)}.{name}"))
    # LLVM itself: no optimisation pipeline, no code emission, no IR but the empty module
    monkeypatch.setattr(llvm, "create_pass_builder", _boom("LLVM's optimiser"))
    monkeypatch.setattr(llvm.TargetMachine, "emit_object", _boom("LLVM's code generator"))
    monkeypatch.setattr(llvm.TargetMachine, "emit_assembly", _boom("LLVM's code generator"))
    parse = llvm.parse_assembly

    def parse_empty(text: str, *args: Any) -> Any:
        assert not text.strip(), "loading an artifact parsed LLVM IR"
        return parse(text, *args)

    monkeypatch.setattr(llvm, "parse_assembly", parse_empty)
    a, b, c = (tilefuse.load(p) for p in paths)
    assert c.executables[0].single_entry and b.executables[0].fallbacks
    args = [random_array(rng, s, DType.f32) for s in shapes]
    expected = mlp(*args)
    assert_close(a(*args)[0], expected[0])
    x = random_array(rng, (5, 4), DType.f32)
    assert_close(b(x)[0], x.max(0) + 1)
    assert_close(c(*args[:2]), np.tanh(args[0] @ args[1]))


def _matmul_gelu_graph() -> Any:
    b = GraphBuilder("mlp_v3")
    x = b.input(((67, 129), DType.f32), "x")
    w = b.add1("constant", [], {"value": Literal(
        np.random.default_rng(5).standard_normal((129, 80)).astype(np.float32))})
    y = b.add1("gelu", [b.add1("matmul", [x, w])])
    return b.build([b.add1("exp", [b.add1("neg", [y])])])


def _zmm_count(obj: bytes, tmp: Path) -> int:
    file = tmp / "k.o"
    file.write_bytes(obj)
    out = subprocess.run(["llvm-objdump", "-d", "--no-show-raw-insn", str(file)],
                         capture_output=True, text=True, check=True).stdout
    assert "ret" in out  # it did disassemble something
    return out.count("zmm")


def _kernel_objects(path: Path) -> list[bytes]:
    c = container.read(path)
    manifest = json.loads(bytes(c.section("manifest")))
    return [bytes(c.section(k["section"])) for k in manifest["kernels"]]


@pytest.mark.skipif(not host_target().has("avx512f"), reason="needs an AVX-512 host")
def test_x86_64_v3_artifact_on_an_avx512_host(tmp_path: Path) -> None:
    graph = _matmul_gelu_graph()
    v3 = NativeExecutable(graph, target=cpu_target("x86-64-v3"))
    host = NativeExecutable(graph)
    loaded = tilefuse.load(tilefuse.save(v3, tmp_path / "v3.tilefuse"))
    tilefuse.save(host, tmp_path / "host.tilefuse")
    assert loaded.target.cpu == "x86-64-v3" and not loaded.target.has("avx512f")
    x = random_array(np.random.default_rng(6), (67, 129), DType.f32)
    _same(loaded(x), v3(x))
    assert_close(loaded(x)[0], interpret(graph, x)[0])
    if shutil.which("llvm-objdump") is None:
        pytest.skip("llvm-objdump not installed: the zmm scan needs it")
    assert sum(_zmm_count(o, tmp_path) for o in _kernel_objects(tmp_path / "v3.tilefuse")) == 0
    # the same scan finds zmm in the host's (AVX-512) build: the check can fail
    assert sum(_zmm_count(o, tmp_path) for o in _kernel_objects(tmp_path / "host.tilefuse")) > 0


def test_cli_compile_then_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tilefuse.cli import main

    rng = np.random.default_rng(8)
    onnx_path = _onnx_model(tmp_path / "small.onnx", rng)
    out = tmp_path / "small.tilefuse"
    assert main(["compile", str(onnx_path), "-o", str(out), "--target", "x86-64-v3",
                 "--input", "x=3x24:f32"]) == 0
    assert "x86-64-v3" in capsys.readouterr().out
    x = random_array(rng, (3, 24), DType.f32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "-o",
                 str(tmp_path / "outs")]) == 0
    import tilefuse.onnx

    y, z = tilefuse.onnx.load(str(onnx_path))(x)
    assert_close(np.load(tmp_path / "outs" / "output0.npy"), y)
    assert_close(np.load(tmp_path / "outs" / "output1.npy"), z, reduction=True)
    with pytest.raises(SystemExit):  # argparse rejects an unknown target
        main(["compile", str(onnx_path), "-o", str(out), "--target", "sparc"])


def test_save_refuses_what_it_cannot_save(tmp_path: Path) -> None:
    f = tilefuse.jit(lambda x: x + 1)
    with pytest.raises(ArtifactError, match="not been compiled"):
        tilefuse.save(f, tmp_path / "f.tilefuse")
    g = tilefuse.jit(lambda x: x + 1, target="reference")
    g(np.ones(3, np.float32))
    with pytest.raises(ArtifactError, match="not a native CPU build"):
        tilefuse.save(g, tmp_path / "g.tilefuse")
    with pytest.raises(ArtifactError, match="cannot save a"):
        tilefuse.save(object(), tmp_path / "h.tilefuse")
    assert not list(tmp_path.iterdir())


def test_compile_exported_round_trip(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from tilefuse.torch import compile_exported

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(12, 8)

        def forward(self, x: Any, y: Any) -> Any:
            h = torch.relu(self.linear(x))
            return {"p": h.softmax(-1), "s": (h * y).sum(0)}

    torch.manual_seed(0)
    x, y = torch.randn(5, 12), torch.randn(5, 8)
    compiled = compile_exported(torch.export.export(Block().eval(), (x, y)))
    compiled(x, y)
    loaded = tilefuse.load(tilefuse.save(compiled, tmp_path / "block.tilefuse"))
    x, y = torch.randn(5, 12), torch.randn(5, 8)
    want, got = compiled(x, y), loaded(x, y)
    assert set(got) == {"p", "s"}
    for key in want:
        assert torch.equal(got[key], want[key])
    _same(loaded(x.numpy(), y.numpy()), [want["p"].numpy(), want["s"].numpy()])

    class Partly(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.cummax(torch.relu(x), 0).values * 2  # no converter: runs in torch

    partly = compile_exported(torch.export.export(Partly(), (x,)))
    partly(x)
    with pytest.raises(ArtifactError, match="partly in torch"):
        tilefuse.save(partly, tmp_path / "partly.tilefuse")


FRESH_CHILD = r"""
import sys
import llvmlite.binding as llvm
import numpy as np
import tilefuse
import tilefuse.codegen.pool as pool


def boom(what):
    def fail(*args, **kwargs):
        raise AssertionError(f"loading ran {what}")
    return fail


llvm.create_pass_builder = boom("LLVM's optimiser")
llvm.TargetMachine.emit_object = boom("LLVM's code generator")
llvm.TargetMachine.emit_assembly = boom("LLVM's code generator")
pool.pool_ir = boom("the thread pool's IR generation")
parse = llvm.parse_assembly


def parse_empty(text, *args):
    assert not text.strip(), "loading parsed LLVM IR"
    return parse(text, *args)


llvm.parse_assembly = parse_empty
model = tilefuse.load(sys.argv[1])
np.save(sys.argv[3], model(np.load(sys.argv[2])))
assert pool.thread_pool.cache_info().currsize == 1  # the pool runs, linked from the artifact
"""


def test_fresh_process_loads_and_runs_without_compiling(tmp_path: Path) -> None:
    """In a process that has compiled nothing (no thread pool yet either), loading and
    calling a model with parallel kernels runs no LLVM optimisation or code generation."""
    import os
    import sys

    rng = np.random.default_rng(9)
    w = random_array(rng, (300, 200), DType.f32)
    f = tilefuse.jit(lambda x: np.tanh(x @ w) * 2)
    x = random_array(rng, (96, 300), DType.f32)
    want = f(x)
    path = tilefuse.save(f, tmp_path / "par.tilefuse")
    assert "pool" in container.read(path).sections  # parallel kernels: the pool is saved too
    np.save(tmp_path / "x.npy", x)
    env = dict(os.environ, PYTHONPATH=str(Path(tilefuse.__file__).parents[1]))
    child = subprocess.run([sys.executable, "-c", FRESH_CHILD, str(path), str(tmp_path / "x.npy"),
                            str(tmp_path / "y.npy")], capture_output=True, text=True, env=env,
                           timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    _same(np.load(tmp_path / "y.npy"), want)


RELOAD_CHILD = r"""
import gc, sys
import numpy as np
import tilefuse

for shape in [(9, 11), (3, 11)] * 3:
    model = tilefuse.load(sys.argv[1])
    model(np.ones(shape, np.float32))
    del model
    gc.collect()  # frees the engines: each must own its own LLVM target machine
print("ok")
"""


def test_loaded_models_are_freed_cleanly(tmp_path: Path) -> None:
    """Two specialisations whose kernels share names are linked into two engines; loading,
    calling and freeing such a model again and again must not crash (a child process)."""
    import os
    import sys

    w = np.random.default_rng(10).standard_normal((11, 7)).astype(np.float32)
    f = tilefuse.jit(lambda x: np.tanh(x @ w))
    f(np.ones((9, 11), np.float32))
    f(np.ones((3, 11), np.float32))
    path = tilefuse.save(f, tmp_path / "two.tilefuse")
    env = dict(os.environ, PYTHONPATH=str(Path(tilefuse.__file__).parents[1]))
    child = subprocess.run([sys.executable, "-c", RELOAD_CHILD, str(path)], capture_output=True,
                           text=True, env=env, timeout=600)
    assert child.returncode == 0 and "ok" in child.stdout, child.stderr[-3000:]
