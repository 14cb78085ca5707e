"""Tensor parallelism (``devices=N``) on what this machine has.

    python benchmarks/tensor_parallel.py check [--target cuda]
    python benchmarks/tensor_parallel.py estimate [--layers 2] [--world 2] [--link-gbps 370]

``check``: two processes joined by torch.distributed's gloo backend run a transformer block
through ``torch.compile(..., options={"devices": 2})`` (on one GPU with ``--target cuda``: gloo
takes CUDA tensors, so the GPU segments and the collectives' stream order are exercised without
a second GPU) and compare with eager torch.

``estimate``: the Llama-style decoder of issue 32 (hidden 4096, 32 heads, 8 KV heads, SwiGLU
14336, b1 s2048 bf16; ``--layers`` of them) built for one GPU, and rank 0 of its ``--world``-way
split built for the same GPU with a loopback communicator (a collective returns at once): the
per-rank compute time. The collectives' time is *estimated* from the plan's bytes and an
assumed NVLink all-reduce bandwidth (``--link-gbps``) plus a fixed latency per collective; the
estimated speedup is one-GPU time / (rank time + collective time). Not a measurement of N GPUs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _block(dim: int = 64, heads: int = 4) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
            q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
                       for t in (q, k, v))
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
            return x + self.down(nn.functional.gelu(self.up(self.norm2(x))))

    torch.manual_seed(0)
    block = Block().eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    return block


def _check_rank(rank: int, world: int, target: str) -> float:
    import torch

    import tilefuse.torch

    block = _block().to(target)
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(1)).to(target)
    compiled = torch.compile(block, backend=tilefuse.torch.backend, options={"devices": world})
    with torch.no_grad():
        got, want = compiled(x), block(x)
        got = compiled(x)                      # a second call: the compiled path again
    return float((got - want).abs().max() / want.abs().max())


def check(target: str, world: int) -> None:
    from tilefuse.distributed.launch import run_ranks

    errors = run_ranks(_check_rank, world, (target,))
    print(f"check: {world} gloo ranks on {target}: max |tilefuse - eager| / max |eager| "
          f"per rank = {[f'{e:.2e}' for e in errors]}")
    assert max(errors) < 1e-4, errors


class Loopback:
    """A communicator for timing one rank alone: collectives return at once (the sum and the
    gather are not the real ones)."""

    def __init__(self, world: int):
        self.world, self.rank = world, 0

    def all_reduce(self, x: Any) -> Any:
        return _Done(x)

    def all_gather(self, x: Any, axis: int) -> Any:
        import torch

        return _Done(torch.cat([x] * self.world, dim=axis))


class _Done:
    def __init__(self, value: Any):
        self.value = value

    def wait(self) -> Any:
        return self.value


def _llama(layers: int) -> tuple[Any, np.ndarray]:
    import torch
    import transformers as T

    config = T.LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                           intermediate_size=14336, num_hidden_layers=layers, vocab_size=32000)
    torch.manual_seed(0)
    model = T.LlamaModel(config).eval().to(torch.bfloat16)

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.m(input_ids=ids).last_hidden_state

    ids = np.random.default_rng(0).integers(0, 32000, (1, 2048)).astype(np.int64)
    return Hidden(), ids


def _time(fn: Any, rounds: int = 10) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def estimate(layers: int, world: int, link_gbps: float, latency_us: float) -> None:
    import torch

    from tilefuse.distributed.build import Devices
    from tilefuse.driver import CompileOptions, compile
    from tilefuse.zoo import torch_graph

    module, ids = _llama(layers)
    t = time.perf_counter()
    graph = torch_graph(module, [ids], "llama")
    print(f"traced in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    one = compile(graph, "cuda")
    print(f"one-GPU build {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    part = compile(graph, "cuda", CompileOptions(devices=Devices(world, Loopback(world))))
    print(f"rank build {time.perf_counter() - t:.1f} s")
    print(part.plan.text())
    x = torch.from_numpy(ids).cuda()
    out = torch.empty(1, 2048, 4096, dtype=torch.bfloat16, device="cuda")

    def run_one() -> None:
        one.run_device([x.data_ptr()], [out.data_ptr()],
                       torch.cuda.current_stream().cuda_stream)

    t_one = _time(run_one)
    t_rank = _time(lambda: part.run_torch([x]))
    comm_ms = sum(c.moved for c in part.plan.collectives) / (link_gbps * 1e9) * 1e3 \
        + len(part.plan.collectives) * latency_us / 1e3
    est = t_one / (t_rank + comm_ms)
    print(f"llama-style {layers} layers b1 s2048 bf16: one GPU {t_one:.3f} ms; rank 0 of "
          f"{world} (compute only) {t_rank:.3f} ms; collectives estimated {comm_ms:.3f} ms "
          f"({len(part.plan.collectives)} at {link_gbps:.0f} GB/s + {latency_us:.0f} us); "
          f"estimated speedup {est:.2f}x (not measured on {world} GPUs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("check", "estimate"))
    parser.add_argument("--target", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--link-gbps", type=float, default=370.0)
    parser.add_argument("--latency-us", type=float, default=15.0)
    args = parser.parse_args()
    if args.mode == "check":
        check(args.target, args.world)
    else:
        estimate(args.layers, args.world, args.link_gbps, args.latency_us)


if __name__ == "__main__":
    main()
