"""A new user's first hour: every Python block of README.md runs, its counts are the registry's,
the ONNX model answers onnxruntime's questions, ``module:function`` is found in the current
directory, ``tilefuse --version`` and the LICENSE exist, ``--help`` is plain text, and the demo
leaves no temporary folder behind."""

from __future__ import annotations

import io
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import tilefuse
from tilefuse.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PY_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def _readme_onnx_model(folder: Path) -> None:
    """The model.onnx the README's ONNX example loads: gelu(x @ w + b), input "input"."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((768, 64)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["input", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["output"])]
    graph = helper.make_graph(
        nodes, "readme", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 768])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [2, 64])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, folder / "model.onnx")


def test_readme_has_the_three_examples():
    assert len(PY_BLOCKS) == 3
    assert "tilefuse.jit" in PY_BLOCKS[0] and "torch.compile" in PY_BLOCKS[1]
    assert "tilefuse.onnx.load" in PY_BLOCKS[2]


@pytest.mark.parametrize("index", range(len(PY_BLOCKS)), ids=["numpy", "torch", "onnx"])
def test_readme_python_block_runs(index, tmp_path, monkeypatch, capsys):
    if "torch" in PY_BLOCKS[index]:
        pytest.importorskip("torch")
    if "onnx" in PY_BLOCKS[index]:
        pytest.importorskip("onnx")
        _readme_onnx_model(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"readme_block_{index}"}
    exec(compile(PY_BLOCKS[index], f"README.md block {index}", "exec"), namespace)
    printed = capsys.readouterr().out
    if index == 0:
        x, w, b = (namespace[k] for k in "xwb")
        y = x @ w + b
        import scipy.special
        want = 0.5 * y * (1.0 + scipy.special.erf(y / math.sqrt(2.0)))
        tilefuse.testing.assert_close(namespace["out"], want, reduction=True)
        assert "graph @ffn" in printed
    elif index == 2:
        assert "['input'] ['output']" in printed and "input [2, 768] tensor(float)" in printed
        x = namespace["x"]
        import onnxruntime
        session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
        want = session.run(None, {"input": x})[0]
        tilefuse.testing.assert_close(namespace["y"], want, reduction=True)


def test_readme_counts_are_the_registrys():
    from tilefuse.onnx import supported_ops
    from tilefuse.ops import OPS

    ops = re.search(r"(\d+) ops, each defined once.*?\(for (\d+) of them\)", README, re.S)
    assert ops, "README no longer states the op count"
    assert int(ops.group(1)) == len(OPS)
    assert int(ops.group(2)) == sum(1 for op in OPS.values() if op.vjp is not None)
    converters = re.search(r"converts (\d+) op types", README)
    assert converters and int(converters.group(1)) == len(supported_ops())


def test_readme_states_requirements():
    for needed in ("AVX2", "x86-64", "disk", "memory", "Python 3.11"):
        assert needed in README


def test_onnx_model_answers_like_onnxruntime(tmp_path):
    pytest.importorskip("onnx")
    import tilefuse.onnx

    _readme_onnx_model(tmp_path)
    model = tilefuse.onnx.load(tmp_path / "model.onnx")
    assert model.input_names == ["input"] and model.output_names == ["output"]
    (arg,) = model.get_inputs()
    assert (arg.name, arg.shape, arg.type) == ("input", [2, 768], "tensor(float)")
    (out,) = model.get_outputs()
    assert (out.name, out.shape, out.type) == ("output", [2, 64], "tensor(float)")


def test_module_function_resolves_from_the_current_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "mymod_newcomer.py").write_text(
        "import numpy as np\n\ndef fn(x):\n    return np.tanh(x) * 2.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    sys.modules.pop("mymod_newcomer", None)
    np.save(tmp_path / "x.npy", np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4))
    status = main(["run", "mymod_newcomer:fn", "--input", "x=x.npy", "-o", str(tmp_path / "o")])
    assert status == 0, capsys.readouterr().err
    outs = sorted((tmp_path / "o").glob("*.npy"))
    assert outs
    got = np.load(outs[0])
    tilefuse.testing.assert_close(got, np.tanh(np.load(tmp_path / "x.npy")) * 2.0)


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"tilefuse {tilefuse.__version__}"


def test_license_is_apache_2():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()


def _all_help() -> list[str]:
    parser = build_parser()
    texts = [parser.format_help()]
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            choices = getattr(action, "choices", None)
            for sub in (choices.values() if isinstance(choices, dict) else ()):
                if hasattr(sub, "format_help"):
                    texts.append(sub.format_help())
                    stack.append(sub)
    return texts


def test_cli_help_is_plain_text():
    texts = _all_help()
    assert len(texts) > 6
    for text in texts:
        assert "``" not in text, text
        assert not re.search(r":(func|class|mod|meth|attr):", text), text


def test_demo_leaves_no_temporary_folder(tmp_path):
    env_tmp = tmp_path / "tmp"
    env_tmp.mkdir()
    code = ("import tempfile, sys; tempfile.tempdir = sys.argv[1]; "
            "import tilefuse.demo as d; d._cache_hit_overhead_us = lambda calls=0: 0.0; "
            "raise SystemExit(d.main([]))")
    done = subprocess.run([sys.executable, "-c", code, str(env_tmp)], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "=== 9. result against NumPy" in done.stdout
    assert not list(env_tmp.iterdir()), list(env_tmp.iterdir())
    assert tempfile.gettempdir() != str(env_tmp)


class _Terminal:
    """A stderr that says it is a terminal and keeps what is written."""

    def __init__(self) -> None:
        self.text = ""

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass


def test_build_progress_shows_kernels_on_a_terminal_only_after_the_delay():
    from tilefuse.progress import BuildProgress

    quick, slow, logged = _Terminal(), _Terminal(), io.StringIO()
    with BuildProgress("m", 3, stream=quick) as progress:
        for _ in range(3):
            progress.step()
    assert quick.text == ""
    with BuildProgress("m", 3, delay=0.0, stream=slow) as progress:
        for _ in range(3):
            progress.step()
    assert "building m: 3/3 kernels" in slow.text and slow.text.endswith("\n")
    with BuildProgress("m", 3, delay=0.0, stream=logged) as progress:
        progress.step()
    assert logged.getvalue() == ""


def test_a_native_build_reports_its_kernels(monkeypatch):
    import tilefuse.progress

    terminal = _Terminal()
    monkeypatch.setattr(tilefuse.progress, "BUILD_DELAY", 0.0)
    monkeypatch.setattr(sys, "stderr", terminal)

    def two_kernels(x):
        return np.exp(x).sum(axis=1) * 2.0, np.tanh(x.T)

    tilefuse.jit(two_kernels)(np.ones((5, 6), np.float32))
    assert re.search(r"building two_kernels: (\d+)/\1 kernels", terminal.text), terminal.text
