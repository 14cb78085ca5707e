"""``tilefuse run`` and the errors every subcommand shares (MODEL and --input)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers_cli import K, M, N, reference

from tilefuse.cli import main
from tilefuse.testing import assert_close


def test_run_onnx_matches_numpy(small_onnx, x_file, weights, tmp_path, capsys):
    path, x = x_file
    out_dir = tmp_path / "outs"
    assert main(["run", str(small_onnx), "--input", f"x={path}", "-o", str(out_dir)]) == 0
    stdout = capsys.readouterr().out
    assert f"out: float32[{M}, {N}]" in stdout
    assert_close(np.load(out_dir / "out.npy"), reference(x, *weights), reduction=True)


def test_run_numpy_function(numpy_module, tmp_path, capsys):
    rng = np.random.default_rng(11)
    arrays = {"x": rng.standard_normal((1, K)), "w": rng.standard_normal((K, 513)),
              "b": rng.standard_normal(513)}   # f64, a row of 1, a wide 513 (odd sizes)
    args = ["run", numpy_module, "-o", str(tmp_path / "o")]
    for name, a in arrays.items():
        np.save(tmp_path / f"{name}.npy", a)
        args += ["--input", f"{name}={tmp_path / name}.npy"]
    assert main(args) == 0
    expected = np.tanh(arrays["x"] @ arrays["w"] + arrays["b"])
    assert_close(np.load(tmp_path / "o" / "output0.npy"), expected, reduction=True)


def test_run_random_inputs_for_fixed_onnx_shapes(small_onnx, capsys):
    assert main(["run", str(small_onnx)]) == 0
    assert f"float32[{M}, {N}]" in capsys.readouterr().out


@pytest.mark.parametrize(("extra", "message"), [
    (["--input", "y=3x4"], "'y', which is not an input"),
    (["--input", f"x={M + 1}x{K}"], "has shape"),
    (["--input", "x=missing.npy"], "no such input file"),
    (["--input", "x"], "NAME=FILE.npy"),
    (["--input", f"x={M}x{K}:f64"], "must be f32"),
    (["--input", f"x={M}x{K}:q7"], "unknown dtype"),
])
def test_bad_input_is_a_clear_error(small_onnx, extra, message, capsys):
    assert main(["run", str(small_onnx), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilefuse: error: ") and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("model", "message"), [
    ("absent.onnx", "no such ONNX file"),
    ("no_such_module_xyz:fn", "cannot import"),
    ("os:no_such_attr", "has no attribute"),
    ("justaword", "module:function"),
])
def test_bad_model_is_a_clear_error(model, message, capsys):
    assert main(["run", model]) == 2
    assert message in capsys.readouterr().err


def test_numpy_function_needs_every_input(numpy_module, capsys):
    assert main(["run", numpy_module, "--input", "x=2x3"]) == 2
    assert "input 'w'" in capsys.readouterr().err


def test_compile_error_is_one_line_and_debug_raises(tmp_path, monkeypatch, capsys):
    from tilefuse.errors import TraceError

    (tmp_path / "cli_branchy.py").write_text(   # out= is not supported: a TraceError
        "import numpy as np\n\ndef f(x):\n    return np.add(x, 1.0, out=np.empty_like(x))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["run", "cli_branchy:f", "--input", "x=3x4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tilefuse: error: ") and "Traceback" not in err
    with pytest.raises(TraceError):
        main(["--debug", "run", "cli_branchy:f", "--input", "x=3x4"])
    with pytest.raises(TraceError):
        main(["run", "cli_branchy:f", "--input", "x=3x4", "--debug"])


@pytest.mark.parametrize("command", ["run", "bench", "tune", "dump", "explain", "cache"])
def test_every_subcommand_has_help_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "example:" in out and f"tilefuse {command}" in out


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("tilefuse")
    assert script.is_file(), "run: .venv/bin/pip install --no-deps -e ."
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                          env={**os.environ}, timeout=120)
    assert done.returncode == 0
    for command in ("run", "bench", "tune", "dump", "explain", "cache"):
        assert command in done.stdout
