"""Sharded builds that run: native segments in one process (the simulation), and real ranks in
separate processes joined by torch.distributed's gloo backend, through the compile driver,
``torch.compile(..., options={"devices": N})`` and ``tilefuse run --devices N``. Each is
compared with the single-device build or torch eager on fresh random weights."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import tilefuse  # noqa: E402
from tilefuse.distributed.build import simulate  # noqa: E402
from tilefuse.distributed.launch import run_ranks  # noqa: E402
from tilefuse.driver import compile  # noqa: E402

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((24, 64)).astype(np.float32) * 0.3
W2 = RNG.standard_normal((64, 24)).astype(np.float32) * 0.3
B1 = RNG.standard_normal(64).astype(np.float32)


def mlp(x):
    return np.tanh(x @ W1 + B1) @ W2 + x


def _mlp_graph(x):
    return tilefuse.jit(mlp).lower(x).captured


def test_native_segments_match_the_single_device_build():
    x = RNG.standard_normal((9, 24)).astype(np.float32)
    graph = _mlp_graph(x)
    want = compile(graph, "cpu")(x)[0]
    cluster = simulate(graph, 2, "cpu")
    assert len(cluster.programs[0].segments) == 2
    for outs in cluster(x):
        np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-5)


class Block(nn.Module):
    """A pre-norm transformer block: fused QKV, heads, causal attention, GELU MLP."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))


def _block_and_input() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    block = Block().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return block, torch.randn(2, 6, 32)


def _torch_rank(rank: int, world: int) -> tuple[np.ndarray, np.ndarray, str]:
    import tilefuse.torch

    block, x = _block_and_input()
    compiled = torch.compile(block, backend=tilefuse.torch.backend,
                             options={"devices": world})
    with torch.no_grad():
        got, want = compiled(x), block(x)
    return got.numpy(), want.numpy(), str(rank)


def test_torch_compile_devices_two_gloo_ranks_match_eager():
    results = run_ranks(_torch_rank, 2)
    for got, want, _ in results:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_block_is_split_by_heads_with_two_all_reduces():
    from tilefuse.distributed.shard import shard_graph
    from tilefuse.driver import optimize
    from tilefuse.zoo import torch_graph

    block, x = _block_and_input()
    graph = optimize(torch_graph(block, [x.numpy()]))[0]
    plan = shard_graph(graph, 2, 0)[1]
    text = plan.text()
    assert "column-parallel (3 parts)" in text and text.count("row-parallel") == 2
    assert [c.op for c in plan.collectives] == ["all_reduce", "all_reduce"]


def test_devices_without_a_process_group_names_torchrun():
    import tilefuse.torch

    block, x = _block_and_input()
    compiled = torch.compile(block, backend=tilefuse.torch.backend, options={"devices": 2})
    with pytest.raises(Exception, match="torchrun --nproc-per-node 2"), torch.no_grad():
        compiled(x)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_bad_devices_option_is_a_tilefuse_error(bad):
    from tilefuse.frontend.torch.backend import Options

    with pytest.raises(tilefuse.TilefuseError, match="devices must be a positive number"):
        Options.parse({"devices": bad})


def _onnx_mlp(path) -> None:
    import onnx
    from onnx import helper, numpy_helper

    w1, w2 = (numpy_helper.from_array(a, n) for a, n in ((W1, "w1"), (W2, "w2")))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 24])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 24])], [w1, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize(("devices", "simulate_flag"), [(2, True), (4, False)])
def test_cli_run_devices_prints_the_plan_then_the_outputs(tmp_path, capsys, devices,
                                                          simulate_flag):
    """--simulate runs the ranks in this process; without it, four gloo processes."""
    pytest.importorskip("onnx")
    from tilefuse.cli import main

    path = tmp_path / "mlp.onnx"
    _onnx_mlp(path)
    x = RNG.standard_normal((4, 24)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    argv = ["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--devices", str(devices),
            "-o", str(tmp_path / "out")] + (["--simulate"] if simulate_flag else [])
    assert main(argv) == 0
    printed = capsys.readouterr().out
    plan_at = printed.index(f"shard plan of @mlp over {devices} ranks")
    assert plan_at < printed.index("y: float32[4, 24]")
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"),
                               np.maximum(x @ W1, 0) @ W2, rtol=1e-4, atol=1e-4)


def test_rank_programs_cross_compile_for_cuda_with_no_host_step(tmp_path):
    """Each rank's segments of the transformer block build for cuda:sm_90 without a GPU, run no
    step on the host, and (simulated on the host) compute the block's output."""
    from tilefuse.distributed.executable import SimulatedCluster
    from tilefuse.distributed.program import compile_program, cut
    from tilefuse.distributed.shard import shard_graph
    from tilefuse.driver import optimize
    from tilefuse.runtime.gpu_cross import assemble, cross_compile
    from tilefuse.runtime.gpu_simulate import simulate as run_on_host
    from tilefuse.zoo import torch_graph

    block, x = _block_and_input()
    graph = optimize(torch_graph(block, [x.numpy()]))[0]
    built = []

    def build(g, index):
        cross = cross_compile(g, optimize=False)
        built.append(cross)
        return lambda *arrays: run_on_host(cross.program, arrays)

    programs, plan = [], None
    for rank in range(2):
        rank_graph, plan = shard_graph(graph, 2, rank)
        programs.append(compile_program(cut(rank_graph), build))
    assert all(not c.host_steps for c in built)
    if shutil.which("ptxas"):
        for ptx in built[0].ptx().values():
            assemble(ptx)
    with torch.no_grad():
        want = block(x).numpy()
    for outs in SimulatedCluster(graph, programs, plan)(x.numpy()):
        np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-4)
