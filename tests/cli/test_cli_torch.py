"""MODEL as a torch module: ``run`` through torch.compile, ``dump`` through the torch frontend."""

from __future__ import annotations

import numpy as np
import pytest

from tilefuse.cli import main
from tilefuse.testing import assert_close

torch = pytest.importorskip("torch")

MODULE = '''import torch


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(13, 7)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x))


def make():
    return Small()
'''


@pytest.fixture
def torch_module(tmp_path, monkeypatch):
    (tmp_path / "cli_small_torch.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch._dynamo.reset()
    yield "cli_small_torch"
    torch._dynamo.reset()


def test_run_torch_module_matches_eager(torch_module, tmp_path):
    import importlib

    x = np.random.default_rng(4).standard_normal((5, 13)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    for spec in (f"{torch_module}:Small", f"{torch_module}:make()"):
        out = tmp_path / spec.replace(":", "_")
        assert main(["run", spec, "--input", f"x={tmp_path / 'x.npy'}", "-o", str(out)]) == 0
        module = importlib.import_module(torch_module).Small().eval()
        with torch.no_grad():
            expected = module(torch.from_numpy(x)).numpy()
        assert_close(np.load(out / "output0.npy"), expected, reduction=True)


def test_dump_torch_module(torch_module, tmp_path):
    out = tmp_path / "dump"
    assert main(["dump", f"{torch_module}:Small", "--input", "x=5x13", "-o", str(out)]) == 0
    assert (out / "kernels.plan").is_file() and list((out / "kernels").glob("*.s"))


def test_dump_torch_module_for_cuda_needs_no_gpu(torch_module, tmp_path, capsys):
    out = tmp_path / "dump-cuda"
    assert main(["dump", f"{torch_module}:Small", "--input", "x=5x13", "--target", "cuda",
                 "-o", str(out)]) == 0
    partition = (out / "partition.txt").read_text()
    assert "nvptx64-nvidia-cuda sm_90" in partition and ", 0 on the host" in partition
    assert "cublas " in partition
    assert list((out / "kernels").glob("*.ptx")) and (out / "00-captured.graph").is_file()
    assert "partition.txt" in capsys.readouterr().out
