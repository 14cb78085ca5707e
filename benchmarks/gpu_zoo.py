"""The model zoo on the GPU through the user's own call: ``torch.compile(m, backend="tilefuse")``
on CUDA tensors (the target follows the data) against eager torch and Inductor's default mode.

    python benchmarks/gpu_zoo.py [--models gpt2,bert,llama,vit] [--json out.json] [--budget S]

Models are Hugging Face configs with random weights (no downloads): GPT-2 (12 layers, b4 s512
fp16), BERT-base (b8 s128 fp16), a Llama-style decoder (hidden 2048, 16 heads, 4 KV heads,
4 layers, b1 s2048 bf16), ViT-base (b32 fp16), torchvision's ResNet-50 (b32 fp16,
channels-last weights and input; ``resnet50``) and a Llama-style decoding step (``llama_decode``:
the same shapes, one new token against a KV cache of 2048 passed as inputs, bf16; Inductor
runs it with ``mode="reduce-overhead"``, its CUDA graphs). After the timings each model is
called once more on fresh inputs (``replay_max_abs_diff_rel``: the replayed CUDA graph).
Per model: the first call's wall time (the compile) for tilefuse and Inductor, the output
against eager (max abs difference, relative to
eager's max abs), the tilefuse WARNINGs (host steps and torch fallbacks), then each system's
time per call: CUDA events around ``repeats`` back-to-back calls after a warm-up, the median of
``rounds`` samples, systems interleaved, inputs already on the device for all three. Models
are skipped once ``--budget`` seconds have passed (so one device call ends in time).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        self.choices: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            self.messages.append(message)
        elif "chosen" in message and "kernel" in message:   # the executable's measured picks
            self.choices.append(message)


def _models(names: list[str]) -> dict[str, Callable[[], tuple[Any, tuple[Any, ...]]]]:
    import torch
    import transformers as T

    dev = "cuda"

    def gpt2() -> tuple[Any, tuple[Any, ...]]:
        m = T.GPT2Model(T.GPT2Config(n_layer=12)).eval().half().to(dev)
        return _Hidden(m), (torch.randint(0, 50257, (4, 512), device=dev),)

    def bert() -> tuple[Any, tuple[Any, ...]]:
        m = T.BertModel(T.BertConfig()).eval().half().to(dev)
        return _Hidden(m), (torch.randint(0, 30522, (8, 128), device=dev),)

    def llama() -> tuple[Any, tuple[Any, ...]]:
        config = T.LlamaConfig(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4,
                               intermediate_size=5632, num_hidden_layers=4, vocab_size=32000)
        m = T.LlamaModel(config).eval().to(torch.bfloat16).to(dev)
        return _Hidden(m), (torch.randint(0, 32000, (1, 2048), device=dev),)

    def vit() -> tuple[Any, tuple[Any, ...]]:
        m = T.ViTModel(T.ViTConfig()).eval().half().to(dev)
        return _Hidden(m, "pixel_values"), (torch.randn(32, 3, 224, 224, device=dev).half(),)

    def resnet50() -> tuple[Any, tuple[Any, ...]]:
        try:  # torchvision's own, where installed; else the same structure from tilefuse.zoo
            import torchvision

            m = torchvision.models.resnet50(weights=None)
        except ImportError:
            from tilefuse.zoo import resnet50 as build

            m = build()
        m = m.eval().half().to(dev).to(memory_format=torch.channels_last)
        x = torch.randn(32, 3, 224, 224, device=dev).half().to(memory_format=torch.channels_last)
        return _Plain(m), (x,)

    def llama_decode() -> tuple[Any, tuple[Any, ...]]:
        m = _decode_llama().eval().to(torch.bfloat16).to(dev)
        caches = [torch.randn(1, 4, 2048, 128, device=dev, dtype=torch.bfloat16)
                  for _ in range(2 * 4)]
        return _Plain(m), (torch.randint(0, 32000, (1, 1), device=dev), *caches)

    table = {"gpt2": gpt2, "bert": bert, "llama": llama, "vit": vit,
             "llama_decode": llama_decode, "resnet50": resnet50}
    return {n: table[n] for n in names}


class _Plain:
    def __init__(self, module: Any):
        self.module = module


def _decode_module() -> Any:
    import torch

    class DecodeLlama(torch.nn.Module):
        """One decoding step of a Llama-style decoder (hidden 2048, 16 heads, 4 KV heads of
        128, SwiGLU 5632, RMSNorm, RoPE, 4 layers, vocab 32000): one new token at position
        2048 against a KV cache of 2048 per layer passed as inputs; returns the final
        hidden state (the updated caches stay internal)."""

        def __init__(self, layers: int = 4, hidden: int = 2048, heads: int = 16, kv: int = 4,
                     inter: int = 5632):
            super().__init__()
            lin = torch.nn.Linear
            self.heads, self.kv, self.dim = heads, kv, hidden // heads
            self.embed = torch.nn.Embedding(32000, hidden)
            self.layers = torch.nn.ModuleList(torch.nn.ModuleDict({
                "q": lin(hidden, hidden, bias=False), "k": lin(hidden, kv * self.dim, bias=False),
                "v": lin(hidden, kv * self.dim, bias=False), "o": lin(hidden, hidden, bias=False),
                "gate": lin(hidden, inter, bias=False), "up": lin(hidden, inter, bias=False),
                "down": lin(inter, hidden, bias=False)}) for _ in range(layers))
            self.norms = torch.nn.Parameter(torch.ones(2 * layers + 1, hidden))
            inv = 1.0 / (10000 ** (torch.arange(0, self.dim, 2).float() / self.dim))
            angles = torch.cat([2048 * inv, 2048 * inv])
            self.register_buffer("cos", angles.cos()[None, None, None, :])
            self.register_buffer("sin", angles.sin()[None, None, None, :])

        def _rms(self, x: Any, i: int) -> Any:
            x32 = x.float()
            x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.norms[i] * x32.to(x.dtype)

        def _rope(self, t: Any) -> Any:
            half = t.shape[-1] // 2
            rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
            return t * self.cos.to(t.dtype) + rotated * self.sin.to(t.dtype)

        def forward(self, ids: Any, *caches: Any) -> Any:
            x = self.embed(ids)
            d, h, kv = self.dim, self.heads, self.kv
            for i, layer in enumerate(self.layers):
                y = self._rms(x, 2 * i)
                q = self._rope(layer["q"](y).view(1, 1, h, d).transpose(1, 2))
                k = self._rope(layer["k"](y).view(1, 1, kv, d).transpose(1, 2))
                v = layer["v"](y).view(1, 1, kv, d).transpose(1, 2)
                keys = torch.cat([caches[2 * i], k], dim=2)
                values = torch.cat([caches[2 * i + 1], v], dim=2)
                n = keys.shape[2]
                keys = keys[:, :, None].expand(1, kv, h // kv, n, d).reshape(1, h, n, d)
                values = values[:, :, None].expand(1, kv, h // kv, n, d).reshape(1, h, n, d)
                scores = (q @ keys.transpose(-1, -2)) * (d ** -0.5)
                p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
                o = (p @ values).transpose(1, 2).reshape(1, 1, h * d)
                x = x + layer["o"](o)
                y = self._rms(x, 2 * i + 1)
                x = x + layer["down"](torch.nn.functional.silu(layer["gate"](y)) * layer["up"](y))
            return self._rms(x, 2 * len(self.layers))

    return DecodeLlama


def _decode_llama() -> Any:
    return _decode_module()()


class _Hidden:
    """A Hugging Face model called with one tensor, returning its last hidden state."""

    def __init__(self, model: Any, key: str = "input_ids"):
        import torch

        class Wrap(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.model = model

            def forward(self, x: Any) -> Any:
                return self.model(**{key: x}).last_hidden_state

        self.module = Wrap().eval()


def _time(fn: Callable[[], Any], repeats: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def run_model(name: str, make: Callable[[], tuple[Any, tuple[Any, ...]]], rounds: int,
              repeats: int) -> dict[str, Any]:
    import torch

    import tilefuse.torch

    torch.manual_seed(0)
    wrapped, inputs = make()
    module = wrapped.module
    row: dict[str, Any] = {"model": name}
    count = _Count()
    logger = logging.getLogger("tilefuse")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(count)
    with torch.no_grad():
        want = module(*inputs)
        torch._dynamo.reset()
        tf = torch.compile(module, backend=tilefuse.torch.backend)
        t0 = time.perf_counter()
        got = tf(*inputs)
        torch.cuda.synchronize()
        row["tilefuse_first_s"] = round(time.perf_counter() - t0, 2)
        logger.removeHandler(count)
        logger.setLevel(level)
        row["warnings"] = count.messages[:20]
        # attention picks only (the product picks are many and alike)
        row["attention_choices"] = [m for m in count.choices if "attention" in m][:4]
        row["n_warnings"] = len(count.messages)
        scale = float(want.float().abs().max())
        row["max_abs_diff_rel"] = float((got.float() - want.float()).abs().max()) / scale
        # a decoding step is launch-bound: Inductor gets its CUDA graphs (reduce-overhead)
        mode = "reduce-overhead" if name == "llama_decode" else "default"
        row["inductor_mode"] = mode
        ind = torch.compile(module, mode=mode)
        t0 = time.perf_counter()
        ind(*inputs)
        torch.cuda.synchronize()
        row["inductor_first_s"] = round(time.perf_counter() - t0, 2)
        systems = {"eager": lambda: module(*inputs), "tilefuse": lambda: tf(*inputs),
                   "inductor": lambda: ind(*inputs)}
        for fn in systems.values():
            for _ in range(3):   # reduce-overhead records its graph on a later call
                fn()
        samples: dict[str, list[float]] = {k: [] for k in systems}
        for _ in range(rounds):
            for key, fn in systems.items():
                samples[key].append(_time(fn, repeats))
        for key, values in samples.items():
            row[f"{key}_ms"] = round(statistics.median(values), 4)
        row["ratio_vs_inductor"] = round(row["tilefuse_ms"] / row["inductor_ms"], 3)
        # the replayed CUDA graph on fresh inputs (the first call ran step by step)
        fresh = [torch.randint_like(t, 0, 1000) if not t.is_floating_point()
                 else torch.randn_like(t) for t in inputs]
        want = module(*fresh)
        got = tf(*fresh)
        row["replay_max_abs_diff_rel"] = float((got.float() - want.float()).abs().max()) / \
            float(want.float().abs().max())
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,llama,vit,llama_decode,resnet50")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--budget", type=float, default=420.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    rows = []
    for name, make in _models(args.models.split(",")).items():
        if time.perf_counter() - start > args.budget:
            print(f"{name}: skipped (budget of {args.budget:.0f} s spent)", flush=True)
            rows.append({"model": name, "skipped": "budget"})
            continue
        try:
            row = run_model(name, make, args.rounds, args.repeats)
        except Exception as err:  # report and go on: one model's failure is a finding
            row = {"model": name, "error": f"{type(err).__name__}: {str(err)[:600]}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
