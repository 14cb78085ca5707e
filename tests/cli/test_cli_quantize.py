"""``--quantize`` on the model commands: the build quantizes, explain reports it, a bad mode is
a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tilefuse.cli import main
from tilefuse.codegen.target import host_target

MODULE = """import numpy as np

_rng = np.random.default_rng(3)
W = (_rng.standard_normal((128, 200)) * 0.1).astype(np.float32)


def ffn(x):
    return np.maximum(x @ W, 0)
"""


@pytest.fixture
def quant_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "cli_quant_fn.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "cli_quant_fn:ffn"


@pytest.mark.skipif(not host_target().has("avx512vnni"), reason="needs AVX-512 VNNI")
def test_run_and_explain_quantized(quant_module, tmp_path, capsys) -> None:
    x = np.random.default_rng(4).standard_normal((9, 128)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "o"
    assert main(["run", quant_module, "--input", f"x={tmp_path / 'x.npy'}", "-o", str(out),
                 "--quantize", "int8"]) == 0
    import cli_quant_fn

    expected = cli_quant_fn.ffn(x)
    got = np.load(out / "output0.npy")
    cos = float((got * expected).sum() / np.linalg.norm(got) / np.linalg.norm(expected))
    assert cos > 0.999 and not np.array_equal(got, expected)   # quantized, and close
    capsys.readouterr()
    assert main(["explain", quant_module, "--input", "x=9x128", "--quantize", "int4",
                 "--peak-gflops", "100", "--peak-gbps", "10", "--rounds", "1"]) == 0
    text = capsys.readouterr().out
    assert "matmul_w4" in text and "quantization: 1 quantized products" in text


def test_bad_mode_is_an_error(quant_module, capsys) -> None:
    assert main(["run", quant_module, "--input", "x=2x128", "--quantize", "int3"]) != 0
    assert "quantize must be one of" in capsys.readouterr().err
