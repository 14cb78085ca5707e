"""The model zoo on the GPU through the user's own call: ``torch.compile(m, backend="tilefuse")``
on CUDA tensors (the target follows the data) against eager torch and Inductor's default mode.

    python benchmarks/gpu_zoo.py [--models gpt2,bert,llama,vit] [--json out.json] [--budget S]

Models are Hugging Face configs with random weights (no downloads): GPT-2 (12 layers, b4 s512
fp16), BERT-base (b8 s128 fp16), a Llama-style decoder (hidden 2048, 16 heads, 4 KV heads,
4 layers, b1 s2048 bf16) and ViT-base (b32 fp16). Per model: the first call's wall time (the
compile) for tilefuse and Inductor, the output against eager (max abs difference, relative to
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
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


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

    table = {"gpt2": gpt2, "bert": bert, "llama": llama, "vit": vit}
    return {n: table[n] for n in names}


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
    logging.getLogger("tilefuse").addHandler(count)
    with torch.no_grad():
        want = module(*inputs)
        torch._dynamo.reset()
        tf = torch.compile(module, backend=tilefuse.torch.backend)
        t0 = time.perf_counter()
        got = tf(*inputs)
        torch.cuda.synchronize()
        row["tilefuse_first_s"] = round(time.perf_counter() - t0, 2)
        logging.getLogger("tilefuse").removeHandler(count)
        row["warnings"] = count.messages[:20]
        row["n_warnings"] = len(count.messages)
        scale = float(want.float().abs().max())
        row["max_abs_diff_rel"] = float((got.float() - want.float()).abs().max()) / scale
        ind = torch.compile(module)
        t0 = time.perf_counter()
        ind(*inputs)
        torch.cuda.synchronize()
        row["inductor_first_s"] = round(time.perf_counter() - t0, 2)
        systems = {"eager": lambda: module(*inputs), "tilefuse": lambda: tf(*inputs),
                   "inductor": lambda: ind(*inputs)}
        for fn in systems.values():
            fn()
        samples: dict[str, list[float]] = {k: [] for k in systems}
        for _ in range(rounds):
            for key, fn in systems.items():
                samples[key].append(_time(fn, repeats))
        for key, values in samples.items():
            row[f"{key}_ms"] = round(statistics.median(values), 4)
        row["ratio_vs_inductor"] = round(row["tilefuse_ms"] / row["inductor_ms"], 3)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,llama,vit")
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
