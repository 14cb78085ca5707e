"""Training step time and loss agreement: eager vs tilefuse vs Inductor (torch.compile).

    python benchmarks/training.py [--steps 50] [--models cnn,gpt2,gpt2-small,adamw-step,numpy-mlp]
                                  [--no-inductor] [--no-eager] [--device cuda] [--autocast bf16]

Each model (the small CNN of tests/torch/test_torch_training.py at batch 32, and
``GPT2Config(n_layer=2, n_embd=256, n_head=4)`` with its full 50257-token vocabulary at batch 4,
sequence 128) is trained three times from the same weights with AdamW on the same batches. The
variants run interleaved, one step each in turn, so a busy machine disturbs them alike. Reported:
the largest relative difference of each compiled variant's losses from eager's over all steps
(the issue's target: 1e-4 in f32), and the median step time (forward, backward, optimiser) after
the compiling first steps, with its ratio to eager and to Inductor. ``adamw-step`` times a
Dynamo-compiled ``AdamW.step`` alone (fixed gradients) against the eager step.
``numpy-mlp`` times ``tilefuse.value_and_grad`` of a NumPy MLP with softmax cross-entropy (f32,
several sizes) against ``jax.jit(jax.value_and_grad)`` of the same function, interleaved, with
the largest gradient difference (the issue's target: <= 1.0x jax on the CPU).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tilefuse.torch as tt

WARMUP = 3


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.head = nn.Linear(32 * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.c2(x)), 2)
        return self.head(x.flatten(1))


DEVICE = "cpu"
"""Where the models, batches and compiled code live (``--device``)."""


def cnn() -> tuple[nn.Module, Callable[[nn.Module, int], torch.Tensor]]:
    def step(fn: nn.Module, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, 3, 32, 32, generator=g).to(DEVICE)
        y = torch.randint(0, 10, (32,), generator=g).to(DEVICE)
        return nn.functional.cross_entropy(fn(x), y)
    return SmallCNN(), step


def _gpt2(n_layer: int, n_embd: int, n_head: int, batch: int, seq: int
          ) -> tuple[nn.Module, Callable[[nn.Module, int], torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)

    def step(fn: nn.Module, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g).to(DEVICE)
        return fn(ids, labels=ids).loss
    return GPT2LMHeadModel(config), step


def gpt2() -> tuple[nn.Module, Callable[[nn.Module, int], torch.Tensor]]:
    """The issue's 2-layer GPT-2, full vocabulary, batch 4, sequence 128."""
    return _gpt2(2, 256, 4, 4, 128)


def gpt2_small() -> tuple[nn.Module, Callable[[nn.Module, int], torch.Tensor]]:
    """GPT-2 small (12 layers, 768 wide), batch 8, sequence 512 (the H200 target)."""
    return _gpt2(12, 768, 12, 8, 512)


MODELS = {"cnn": cnn, "gpt2": gpt2, "gpt2-small": gpt2_small}


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _cpu_memory_exact() -> None:
    """glibc: every block of 64 KiB or more its own mapping, unmapped when freed (no dynamic
    threshold), so resident memory follows what is live and the high-water mark below sees a
    step's peak."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 65536)   # M_MMAP_THRESHOLD
        libc.mallopt(-1, 65536)   # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _rss(reset: bool = False) -> int:
    """This process's resident bytes now; ``reset`` also resets its high-water mark (Linux
    clear_refs 5). Read after a step, ``_hwm()`` is the step's peak."""
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    return _status("VmRSS")


def _hwm() -> int:
    return _status("VmHWM")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


class _Recording:
    """A backend that keeps what ``tt.backend`` returned (to read the compiled graphs)."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        self.made.append(tt.backend(gm, example_inputs, **kwargs))
        return self.made[-1]


def _held(made: list[Any], show: bool = False) -> int:
    """Bytes the compiled training graphs hold between steps, resident before a step starts
    and so missing from its resident growth: their arenas (the one all training graphs share,
    once, and any of their own). Their outputs (saved activations, gradients) are not kept
    between steps: they are allocated in the step, and its resident growth shows them."""
    from tilefuse.frontend.torch.training import step_memory
    shared = own = 0
    for graph in made:
        memory = step_memory(graph)
        if memory is not None:
            shared = max(shared, memory.shared)
            own += memory.forward_arena + memory.backward_arena
            if show:
                print(f"  tilefuse graph {getattr(graph, 'name', '?')}: {memory}", flush=True)
    return shared + own


def run(name: str, steps: int, inductor: bool, autocast: str | None = None,
        eager: bool = True, tilefuse: bool = True) -> None:
    """Trains ``name`` with each variant from the same weights, interleaved. Also the peak
    memory a step adds to what was allocated before it: activations, saved tensors, gradients
    and workspaces; the weights and optimizer state, alike in every variant, are left out.
    On CUDA ``max_memory_allocated``; on the CPU the resident high-water mark over the
    resident size before the step (glibc set to map and unmap every large block), plus, for
    tilefuse, the arenas its executables hold between steps (resident before the step)."""
    from tilefuse.frontend.torch import training
    from tilefuse.frontend.torch.training import device_bytes
    from tilefuse.runtime.arena_space import ArenaSpace
    # each model's graphs their own shared arena (one process trains several models here)
    training.TRAINING_ARENA = ArenaSpace(name)
    torch.manual_seed(0)
    model, step = MODELS[name]()
    model = model.to(DEVICE)
    variants: dict[str, tuple[nn.Module, Any]] = {}
    if eager:
        variants["eager"] = (model, None)
    if tilefuse:
        variants["tilefuse"] = (copy.deepcopy(model), "tilefuse")
    if inductor:
        variants["inductor"] = (copy.deepcopy(model), "inductor")
    runners = {}
    backend_of = {label: backend for label, (_, backend) in variants.items()}
    recording = _Recording()
    for label, (m, backend) in variants.items():
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        fn = m if backend is None else torch.compile(
            m, backend=recording if backend == "tilefuse" else backend, dynamic=False)
        runners[label] = (fn, opt)
    if DEVICE == "cpu":
        _cpu_memory_exact()
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}.get(autocast or "")
    losses: dict[str, list[float]] = {k: [] for k in runners}
    times: dict[str, list[float]] = {k: [] for k in runners}
    peaks: dict[str, int] = {k: 0 for k in runners}
    for i in range(steps):
        for label, (fn, opt) in runners.items():
            _sync()
            if DEVICE == "cuda":
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
            else:
                before = _rss(reset=True) - (_held(recording.made) if backend_of[label]
                                             == "tilefuse" else 0)
            t0 = time.perf_counter()
            with torch.autocast(DEVICE, dtype=dtype, enabled=dtype is not None):
                loss = step(fn, i)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            _sync()
            times[label].append(time.perf_counter() - t0)
            losses[label].append(loss.item())
            if i == 0:
                print(f"  ({name} {label}: first step {times[label][0]:.1f} s, loss "
                      f"{losses[label][0]:.4f})", flush=True)
            if DEVICE == "cuda":
                outside = sum(device_bytes(g) for g in recording.made) \
                    if backend_of[label] == "tilefuse" else 0
                peaks[label] = max(peaks[label],
                                   torch.cuda.max_memory_allocated() - before + outside)
            elif i >= WARMUP:   # past the compiling steps
                peaks[label] = max(peaks[label], _hwm() - before)
    held = _held(recording.made, show=True) if tilefuse and DEVICE == "cpu" else 0
    warm = min(WARMUP, steps - 1)
    med = {k: statistics.median(v[warm:]) for k, v in times.items()}
    print(f"{name}: {steps} AdamW steps, {autocast or 'f32'}, {DEVICE} "
          f"({torch.get_num_threads()} threads)", flush=True)
    base = losses.get("eager")
    for label in runners:
        err = "" if base is None else "  max rel loss diff vs eager " + \
            f"{max(abs(a - b) / abs(b) for a, b in zip(losses[label], base)):.2e}"
        ratio = f"{med[label] / med['eager']:.2f}x eager" if "eager" in med else ""
        if "inductor" in med:
            ratio += f", {med[label] / med['inductor']:.2f}x inductor"
        memory = f"  step peak +{peaks[label] / 2**20:.0f} MiB"
        if label == "tilefuse" and DEVICE == "cuda":
            outside = sum(device_bytes(g) for g in recording.made)
            memory += f" (of which {outside / 2**20:.0f} MiB tilefuse's own device buffers: " \
                "arenas, input buffers, constants)"
        if label == "tilefuse" and held:
            memory += f" (of which {held / 2**20:.0f} MiB the arena tilefuse holds between steps)"
        print(f"  {label:9s} step {med[label] * 1e3:8.1f} ms  ({ratio.strip(', ')})  first step "
              f"{times[label][0]:6.1f} s{memory}{err}  last loss {losses[label][-1]:.4f}",
              flush=True)


def run_optimizer_step(steps: int, inductor: bool) -> None:
    """A Dynamo-compiled ``AdamW.step`` over the parameters of the 2-layer GPT-2 (2048-token
    vocabulary), with fixed gradients, against the eager step."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=2048))
    backends = {"eager": None, "tilefuse": tt.backend, **({"inductor": "inductor"}
                                                         if inductor else {})}
    runners = {}
    for label, backend in backends.items():
        model = copy.deepcopy(base)
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g) * 1e-2
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        runners[label] = (model, opt.step if backend is None else
                          torch.compile(opt.step, backend=backend))
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(steps):
        for label, (_, step) in runners.items():
            t0 = time.perf_counter()
            step()
            times[label].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[WARMUP:]) for k, v in times.items()}
    eager = list(runners["eager"][0].parameters())
    print(f"AdamW.step over the 2-layer GPT-2's parameters, {steps} steps, CPU")
    for label, (model, _) in runners.items():
        err = max((a - b).abs().max().item() for a, b in zip(model.parameters(), eager))
        ratio = f"{med[label] / med['eager']:.2f}x eager"
        if "inductor" in med:
            ratio += f", {med[label] / med['inductor']:.2f}x inductor"
        print(f"  {label:9s} step {med[label] * 1e3:8.1f} ms  ({ratio})  first step "
              f"{times[label][0]:6.1f} s  max |param - eager| {err:.1e}")


def _mlp_loss(np_: Any) -> Callable[..., Any]:
    """The MLP loss of tests/frontend/test_grad.py, written against ``np_`` (numpy or
    jax.numpy)."""
    def loss(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, labels: Any) -> Any:
        h = np_.tanh(x @ w1 + b1)
        logits = h @ w2 + b2
        z = logits - np_.max(logits, axis=1, keepdims=True)
        logp = z - np_.log(np_.sum(np_.exp(z), axis=1, keepdims=True))
        return -np_.mean(np_.take_along_axis(logp, labels[:, None], axis=1))
    return loss


MLP_SIZES = ((64, 64, 128, 10), (128, 256, 256, 100), (256, 784, 512, 10),
             (1024, 784, 1024, 10))
"""(batch, features, hidden, classes) of the ``numpy-mlp`` runs."""


def run_numpy_mlp(steps: int) -> None:
    """``tilefuse.value_and_grad`` vs ``jax.jit(jax.value_and_grad)`` of one NumPy MLP loss,
    f32 on the CPU. jax is given jax arrays already on its device (its best case); tilefuse
    NumPy arrays. Both return the loss and the four parameter gradients."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        print("numpy-mlp: jax is not installed, skipped")
        return
    import numpy as np

    import tilefuse
    ours = tilefuse.value_and_grad(_mlp_loss(np), argnums=(0, 1, 2, 3))
    theirs = jax.jit(jax.value_and_grad(_mlp_loss(jnp), argnums=(0, 1, 2, 3)))
    print(f"value_and_grad of a NumPy MLP (tanh, softmax cross-entropy), f32, CPU, "
          f"{steps} calls each, interleaved")
    for batch, features, hidden, classes in MLP_SIZES:
        rng = np.random.default_rng(0)
        args = [rng.normal(size=(features, hidden)).astype(np.float32) * 0.05,
                rng.normal(size=(hidden,)).astype(np.float32) * 0.1,
                rng.normal(size=(hidden, classes)).astype(np.float32) * 0.05,
                rng.normal(size=(classes,)).astype(np.float32) * 0.1,
                rng.normal(size=(batch, features)).astype(np.float32),
                rng.integers(0, classes, size=batch)]
        jargs = [jnp.asarray(a) for a in args]
        t0 = time.perf_counter()
        value, grads = ours(*args)
        first = time.perf_counter() - t0
        jvalue, jgrads = theirs(*jargs)
        err = max(float(np.abs(a - np.asarray(b)).max() / (np.abs(np.asarray(b)).max() + 1e-30))
                  for a, b in zip(grads, jgrads))
        times: dict[str, list[float]] = {"tilefuse": [], "jax": []}
        for _ in range(steps):
            t0 = time.perf_counter()
            ours(*args)
            times["tilefuse"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            jax.block_until_ready(theirs(*jargs))
            times["jax"].append(time.perf_counter() - t0)
        med = {k: statistics.median(v[WARMUP:]) for k, v in times.items()}
        print(f"  b{batch} f{features} h{hidden} c{classes}: tilefuse "
              f"{med['tilefuse'] * 1e3:8.3f} ms  jax.jit {med['jax'] * 1e3:8.3f} ms  "
              f"({med['tilefuse'] / med['jax']:.2f}x jax)  first call {first:5.1f} s  "
              f"loss diff {abs(float(value) - float(jvalue)):.1e}  max rel grad diff {err:.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--models", default="cnn,gpt2")
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--no-eager", action="store_true", help="(models) skip eager")
    parser.add_argument("--no-tilefuse", action="store_true", help="(models) skip tilefuse")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--autocast", default=None, choices=("bf16", "f16"),
                        help="(models) run the forward under torch.autocast in this dtype")
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    for name in args.models.split(","):
        if name == "adamw-step":
            run_optimizer_step(args.steps, not args.no_inductor)
        elif name == "numpy-mlp":
            run_numpy_mlp(args.steps)
        else:
            run(name, args.steps, not args.no_inductor, args.autocast, not args.no_eager,
                not args.no_tilefuse)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
